"""The GPU-hours estimate of ``python -m ablations.run --dry-run --gpu CLASS`` (ablations/pricing/gpu_hours.py).

Every test reads measurements from its own tmp results folder, never the real ``results/``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import assert_one_line_error, run_in_process

from ablations.config import RunConfig
from ablations.costs import measure
from ablations.pricing import gpu_hours
from ablations.run import main as run_main
from ablations.studies.spec import load_spec

#: A tiny trial: 100 synthetic 8x8 images (60 train / 20 val / 20 test at val and test fractions 0.2), 2 epochs;
#: every epoch trains on the train split and scores val and test (VAL: the images evaluated per epoch).
TINY = {"dataset": "synthetic", "dataset_options": {"num_samples": 100, "img_size": 8, "num_classes": 4},
        "embed_dim": 8, "num_heads": 2, "depth": 1, "mlp_ratio": 2.0, "patch_size": 4, "max_epochs": 2,
        "precision": "bf16-mixed"}
TRAIN, VAL = 60, 40


def tiny_flops(depth: int = 1) -> float:
    """Forward FLOPs of one image of the tiny trial (standard residual), counted by hand: 2 FLOPs per
    multiply-accumulate of the matrix products (what ablations.costs counts). An 8x8 image in 4x4 patches: 4 patch
    tokens + the CLS token = 5 tokens of width 8; 2 heads of width 4; MLP hidden width 16; 4 classes."""
    patch_embed = 4 * 8 * (3 * 4 * 4)  # a 4x4x3 -> 8 convolution at each of the 4 patches
    block = (5 * 8 * 24  # qkv projection, 8 -> 3 x 8
             + 2 * 5 * 5 * 4  # q k^T, per head
             + 2 * 5 * 5 * 4  # attention x v, per head
             + 5 * 8 * 8  # output projection
             + 5 * 8 * 16 + 5 * 16 * 8)  # MLP fc1, fc2
    head = 8 * 4  # the CLS token -> 4 logits
    return 2.0 * (patch_embed + depth * block + head)


@pytest.mark.parametrize("depth", [1, 3])
def test_the_hand_count_is_what_ablations_costs_measures(depth):
    assert tiny_flops(depth) == measure("standard", {}, embed_dim=8, depth=depth, num_heads=2, img_size=8,
                                        patch_size=4, num_classes=4, in_chans=3, mlp_ratio=2.0)["flops"]


def write_device_check(results: Path, *, gpu: str | None, images_per_s: float, config: RunConfig,
                       device: str = "cuda", status: str = "passed", folder: str | None = None) -> Path:
    """A device_check.json as scripts/device_check.py writes it (the fields gpu_hours reads)."""
    path = results / "device" / (folder or device) / "device_check.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    figures = {"train_images_per_s": images_per_s, "forward_flops_per_image": tiny_flops(config.depth),
               "config": json.loads(json.dumps(config.to_dict(), default=str))}
    path.write_text(json.dumps({"format": 1, "device": device, "short": False, "date": "2026-12-01T10:00:00+00:00",
                                "machine": {"gpu": gpu}, "stages": {"train": {"status": status, "figures": figures}}}))
    return path


def test_assumed_mfu_estimate_equals_a_hand_computation(tmp_path):
    config = RunConfig.from_dict(TINY)
    est = gpu_hours.estimate([config], trials=3, gpu="h100", results_dir=tmp_path)
    by_hand = tiny_flops() * 2 * (3 * TRAIN + 1 * VAL) / (989.4e12 * gpu_hours.ASSUMED_MFU)
    assert est.per_trial_s == pytest.approx(by_hand, rel=1e-9)
    assert est.gpu_hours == pytest.approx(3 * by_hand / 3600, rel=1e-9)
    (basis,) = est.bases.values()
    assert basis.measurement is None and "assumed" in basis.text


def test_fp32_trials_are_priced_at_the_fp32_peak(tmp_path):
    config = RunConfig.from_dict(TINY | {"precision": "32-true"})
    est = gpu_hours.estimate([config], trials=1, gpu="a100", results_dir=tmp_path)
    assert est.per_trial_s == pytest.approx(tiny_flops() * 2 * (3 * TRAIN + VAL) / (19.5e12 * gpu_hours.ASSUMED_MFU))


def test_precision_auto_is_priced_as_the_training_run_would_resolve_it_on_cuda(tmp_path):
    est = gpu_hours.estimate([RunConfig.from_dict(TINY | {"precision": "auto"})], trials=1, gpu="h100",
                             results_dir=tmp_path)  # no measured modes-cuda.json there: bf16 autocast on CUDA
    assert list(est.bases) == ["auto (bf16-mixed)"]
    assert est.per_trial_s == pytest.approx(tiny_flops() * 2 * (3 * TRAIN + VAL) / (989.4e12 * gpu_hours.ASSUMED_MFU))


def test_a_measured_images_per_s_of_the_same_class_is_the_basis_scaled_by_flops(tmp_path):
    measured = RunConfig.from_dict(TINY)
    source = write_device_check(tmp_path, gpu="NVIDIA H100 80GB HBM3", images_per_s=5000.0, config=measured)
    same = gpu_hours.estimate([measured], trials=1, gpu="h100", results_dir=tmp_path)
    # The measured config itself trains at the measured images/s (val images priced at a third of a train image).
    assert same.per_trial_s == pytest.approx(2 * (TRAIN + VAL / 3) / 5000.0, rel=1e-9)
    (basis,) = same.bases.values()
    assert basis.measurement is not None and basis.measurement.source == str(source)
    assert "measured on NVIDIA H100 80GB HBM3" in basis.text and "5,000 images/s" in basis.text
    assert basis.mfu == pytest.approx(3 * tiny_flops() * 5000.0 / 989.4e12)

    deeper = RunConfig.from_dict(TINY | {"depth": 3})  # more FLOPs per image: proportionally fewer images/s
    est = gpu_hours.estimate([deeper], trials=1, gpu="h100", results_dir=tmp_path)
    images_per_s = 5000.0 * tiny_flops(1) / tiny_flops(3)
    assert est.per_trial_s == pytest.approx(2 * (TRAIN + VAL / 3) / images_per_s, rel=1e-9)


def test_a_measurement_of_another_class_lends_its_mfu(tmp_path):
    config = RunConfig.from_dict(TINY)
    write_device_check(tmp_path, gpu="NVIDIA H200", images_per_s=5000.0, config=config)
    est = gpu_hours.estimate([config], trials=1, gpu="l4", results_dir=tmp_path)
    mfu = 3 * tiny_flops() * 5000.0 / 989.4e12  # measured on the H200 at its bf16 peak
    (basis,) = est.bases.values()
    assert basis.mfu == pytest.approx(mfu) and "applied to the l4 bf16 peak" in basis.text
    assert est.per_trial_s == pytest.approx(tiny_flops() * 2 * (3 * TRAIN + VAL) / (121e12 * mfu), rel=1e-9)


def test_a_bench_mfu_section_on_cuda_is_a_measurement(tmp_path):
    path = tmp_path / "device" / "cuda" / "bench" / "bench.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"meta": {"device": "cuda", "mode": "quick", "started": "2026-12-01 10:00:00",
                                         "settings": {}, "machine": {"cuda": "NVIDIA A100-SXM4-80GB"}},
                                "sections": {"mfu": {"error": None, "data": {"step_flops_per_s": 62.4e12}}}}))
    est = gpu_hours.estimate([RunConfig.from_dict(TINY)], trials=1, gpu="a100", results_dir=tmp_path)
    (basis,) = est.bases.values()
    assert basis.flops_per_s == pytest.approx(62.4e12) and basis.mfu == pytest.approx(0.2)
    assert "ablations.bench MFU section" in basis.text


def test_cpu_short_failed_and_unreadable_reports_are_not_measurements(tmp_path):
    config = RunConfig.from_dict(TINY)
    write_device_check(tmp_path, gpu=None, images_per_s=10.0, config=config, device="cpu")
    write_device_check(tmp_path, gpu="NVIDIA H100", images_per_s=10.0, config=config, folder="killed",
                       status="timeout")
    (tmp_path / "device" / "broken").mkdir()
    (tmp_path / "device" / "broken" / "device_check.json").write_text("{not json")
    assert gpu_hours.find_measurements(tmp_path) == []


@pytest.mark.parametrize(("name", "expected"), [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                                ("NVIDIA A100-SXM4-40GB", "a100"), ("NVIDIA L4", "l4"),
                                                ("NVIDIA L40S", None), ("NVIDIA GeForce RTX 4090", "rtx4090"),
                                                (None, None)])
def test_gpu_class_of_a_device_name(name, expected):
    assert gpu_hours.gpu_class_of(name) == expected


def test_recipe_line_names_the_pieces_the_recipe_switches_on():
    line = gpu_hours.recipe_line(RunConfig.from_dict(TINY | {"recipe": "paper"}))
    assert line.startswith("recipe: paper (crop padding reflect, RandAugment 9/5, ")
    assert "Mixup 0.8 / CutMix 1" in line and "adam lr 0.001 wd 0.0001 warm-up 10 ep" in line
    assert "Mixup" not in gpu_hours.recipe_line(RunConfig.from_dict(TINY))


@pytest.mark.parametrize("study, budget, gpu, trials", [("residual_variants", "smoke", "rtx4090", 20 + 10),
                                                        ("class_attention", "paper", "h100", 72 + 18)])
def test_dry_run_prints_gpu_hours_for_the_chosen_class(tmp_path, capsys, study, budget, gpu, trials):
    """smoke: 20 tuning trials then 10 reported ones; paper (CIFAR-10, the paper recipe, ViT-Tiny width at depth
    12): 6 rows x 4 learning rates x 3 tuning seeds (before any rate the grid adds), then 6 rows x 3 seeds."""
    code = run_main(["--study", study, "--budget", budget, "--dry-run", "--gpu", gpu, "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    (line,) = [ln for ln in out.splitlines() if ln.startswith(f"estimated GPU-hours on {gpu} ")]
    spec = load_spec(study, budget)  # the estimator's own value for the study's points
    assert spec.size + spec.tune_stage().size == trials
    est = gpu_hours.estimate([spec.run_config(p) for p in spec.grid()], trials, gpu, tmp_path)
    assert est.gpu_hours > 0
    assert f": {est.gpu_hours:.3g} GPU-hours for {trials} trials ({est.per_trial_s / 60:.3g} min per trial" in line, line
    assert "MFU 0.25 assumed" in out
    assert (budget == "paper") == ("recipe: paper (" in out)
    assert not (tmp_path / "device").exists()  # read only


def test_dry_run_unknown_gpu_class_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        run_main(["--study", "residual_variants", "--budget", "smoke", "--dry-run", "--gpu", "v100"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and "invalid choice: 'v100'" in err
    assert all(name in err for name in gpu_hours.GPU_CLASSES)


@pytest.mark.parametrize("argv, words", [
    (["--depth", "0"], ["depth must be a positive integer"]),
    (["--embed-dim", "10", "--num-heads", "3"], ["not divisible by num_heads=3", "valid num_heads"]),
    (["--patch-size", "5"], ["not divisible by patch_size=5"]),
    (["--depth", "x"], ["--depth", "invalid int value"]),
    (["--bench", "CORRUPT"], ["cannot read the benchmark report"]),
])
def test_costs_bad_input_exits_2_with_one_line(argv, words, tmp_path):
    from ablations.costs import main

    corrupt = tmp_path / "bench.json"
    corrupt.write_text("{not json")
    result = run_in_process(*[corrupt if a == "CORRUPT" else a for a in argv], cwd=tmp_path, main=main)
    assert_one_line_error(result, *words)


def test_the_step_floor_is_the_steps_at_the_assumed_step_time(tmp_path):
    """Beside the FLOP estimate the dry run prints the GPU-hours the steps alone take at ASSUMED_STEP_FLOOR_S each,
    and says which of the two is the better guide."""
    import dataclasses

    config = RunConfig.from_dict(TINY | {"batch_size": 16})
    est = gpu_hours.estimate([config], trials=3, gpu="h100", results_dir=tmp_path)
    steps = 2 * (4 + 3)  # 2 epochs x (ceil(60/16) training + ceil(40/16) evaluation batches)
    assert est.steps_per_trial == steps
    assert est.floor_gpu_hours == pytest.approx(3 * steps * gpu_hours.ASSUMED_STEP_FLOOR_S / 3600, rel=1e-12)
    line = gpu_hours.describe_estimate(est)[-1]
    ratio = est.floor_gpu_hours / est.gpu_hours  # a tiny model: launches, not FLOPs
    assert ratio > 100 and line == (f"  step floor: {steps} steps per trial (training and validation batches) at 5 ms "
                                    f"each (assumed: ASSUMED_STEP_FLOOR_S) = at least {est.floor_gpu_hours:.3g} "
                                    f"GPU-hours, {ratio:,.0f}x the FLOP estimate: at this model size the GPU waits on "
                                    "launches and Python, and this floor is the better guide")
    heavy = dataclasses.replace(est, per_trial_s=1e6)  # FLOPs far above the floor: the estimate stands
    assert gpu_hours.describe_estimate(heavy)[-1].endswith("below the FLOP estimate, which therefore stands")


def write_cuda_bench(results: Path, times: list[float], *, gpu: str = "NVIDIA H200", device: str = "cuda",
                     depth: int = 6, error: str | None = None, folder: str = "b") -> Path:
    """A bench.json with section 11 (overhead) as ``ablations.bench --device cuda`` writes it (the fields read)."""
    path = results / "device" / "cuda" / folder / "bench.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    section = {"error": error, "goals": [], "data": {"times_s": {"standard": times, "mhc": [1.0] * len(times)}}}
    path.write_text(json.dumps({"meta": {"device": device, "started": "2026-12-04 10:15:47",
                                         "settings": {"device": device, "overhead_depth": depth, "overhead_batch": 32},
                                         "machine": {"gpu": gpu}},
                                "sections": {"overhead": section}}))
    return path


def test_a_measured_step_sets_the_floor_scaled_by_depth_with_evaluation_at_a_third(tmp_path):
    """standard's step in a CUDA bench's section 11 (median 12 ms at depth 6) prices the tiny trial's steps: 2 ms a
    training step at depth 1, an evaluation batch a third of that; a CPU bench or a failed section is no
    measurement; a measurement on another class is applied to the asked one and says so."""
    write_cuda_bench(tmp_path, [0.010, 0.014, 0.012])
    write_cuda_bench(tmp_path, [0.5, 0.5, 0.5], device="cpu", folder="cpu")  # not a GPU step
    write_cuda_bench(tmp_path, [0.9, 0.9, 0.9], error="RuntimeError: boom", folder="failed")
    config = RunConfig.from_dict(TINY | {"batch_size": 16})
    est = gpu_hours.estimate([config], trials=3, gpu="h200", results_dir=tmp_path)
    floor = 0.012 / 6 * (2 * 4 + 2 * 3 / 3)  # 8 training batches, 6 evaluation batches at a third
    assert est.floor_s_per_trial == pytest.approx(floor, rel=1e-12)
    assert est.floor_gpu_hours == pytest.approx(3 * floor / 3600, rel=1e-12)
    line = gpu_hours.describe_estimate(est)[-1]
    assert "standard's train step measured on NVIDIA H200 (12 ms at depth 6, batch 32" in line
    assert "applied to" not in line and f"at least {est.floor_gpu_hours:.3g} GPU-hours" in line
    other = gpu_hours.describe_estimate(gpu_hours.estimate([config], trials=3, gpu="h100", results_dir=tmp_path))[-1]
    assert "applied to h100: none measured on it" in other
    deeper = gpu_hours.estimate([RunConfig.from_dict(TINY | {"batch_size": 16, "depth": 3})], trials=3, gpu="h200",
                                results_dir=tmp_path)
    assert deeper.floor_s_per_trial == pytest.approx(3 * floor, rel=1e-12)  # three blocks: three times the launches
