"""scripts/gpu_measure.py, every GPU measurement in one command, in its CPU dry form (``--device cpu --tiny``): its
three stages run (under their shares of a time budget) and it leaves its seven files."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # three stages of subprocesses: the CUDA tests' collection, a tiny study, two bench sections
def test_the_cpu_dry_form_runs_every_stage_and_packs_seven_files(tmp_path):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("gpu_measure", ROOT / "scripts" / "gpu_measure.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    out = tmp_path / "out"
    code = module.main(["--device", "cpu", "--tiny", "--time-budget", "25m", "--out", str(out),
                        "--work", str(tmp_path / "work")])
    report = json.loads((out / "gpu_measure.json").read_text())
    assert code == 0, report["stages"]
    assert list(report["stages"]) == ["cuda_tests", "study", "bench"]
    assert all(s["status"] == "passed" for s in report["stages"].values())
    files = sorted(p.name for p in out.iterdir())
    assert files == sorted(["gpu_measure.json", "gpu_measure.md", "gpu_study.json", "runs.csv", "study.tar.gz",
                            "bench.tar.gz", "logs.tar.gz"])
    goals = report["goals"]
    assert goals["study_trials_completed"] == {"measure_tiny": 4} and goals["aggregate_images_per_s"] > 0
    assert set(goals["design_ratios"]) == {"attn_res", "hyper_connections", "dca", "mhc", "denseformer"}
    with tarfile.open(out / "bench.tar.gz") as tar:
        assert {"bench/bench.json", "bench/bench.md"} <= set(tar.getnames())


def _module():
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("gpu_measure", ROOT / "scripts" / "gpu_measure.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_gpu_command_runs_the_headline_or_its_gpu_budget_on_local_data_continuing_a_runs_csv(tmp_path):
    """On the GPU the study stage is residual_variants, on its default budget (the CPU study's twin) or on its gpu
    budget, reading local Fashion-MNIST files (``--data-dir``, when the folder is there) and continuing an earlier
    run's ``runs.csv`` (``--import-runs``). Without ``--time-budget`` no stage has a limit; with one, the study gets
    what the CUDA tests' and the bench's shares leave."""
    module = _module()
    unlimited = module.stages(_parse(module, ["--out", str(tmp_path / "o")]), tmp_path)
    first = unlimited["study"][0]
    assert first[first.index("--budget") + 1] == "default" and "--import-runs" not in first
    assert "--time-budget" not in first and [s for _, s in unlimited.values()] == [None, None, None]
    budgeted = module.stages(_parse(module, ["--out", str(tmp_path / "o"), "--time-budget", "1h"]), tmp_path)
    assert [s for _, s in budgeted.values()] == [60, 3600 - 60 - 150 - 15, 150]
    assert budgeted["study"][0][budgeted["study"][0].index("--time-budget") + 1] == "3375"
    data = tmp_path / "fashion"
    data.mkdir()
    args = _parse(module, ["--out", str(tmp_path / "o"), "--budget", "gpu", "--data-dir", str(data),
                           "--import-runs", str(tmp_path / "runs.csv")])
    study = module.stages(args, tmp_path)["study"][0]
    assert study[study.index("--study") + 1] == "residual_variants" and study[study.index("--budget") + 1] == "gpu"
    assert study[study.index("--data-dir") + 1] == str(data.resolve())
    assert study[study.index("--import-runs") + 1] == str(tmp_path / "runs.csv")
    missing = _parse(module, ["--out", str(tmp_path / "o"), "--data-dir", str(tmp_path / "absent")])
    assert "--data-dir" not in module.stages(missing, tmp_path)["study"][0]  # the loader's own search then
    tiny = _parse(module, ["--out", str(tmp_path / "o"), "--tiny", "--device", "cpu", "--data-dir", str(data)])
    tiny_study = module.stages(tiny, tmp_path)["study"][0]
    assert tiny_study[tiny_study.index("--budget") + 1] == "default" and "--data-dir" not in tiny_study


def _parse(module, argv):
    return module.parser().parse_args(argv)
