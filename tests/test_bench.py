"""Tests for ``python -m ablations.bench``: it runs every section and writes the report files with the expected
structure. The numbers are not checked (they are timings); the hidden ``--tiny`` mode keeps the run to seconds."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from ablations.bench import child, cli, harness, loops, steps, tasks
from ablations.costs import all_configs, bench_step_times
from ablations.machine import allocator, modes, timing
from lit_modules import RESIDUALS

ROOT = Path(__file__).resolve().parents[1]
HEADERS = {"timm": "## 1. ", "variants": "## 2. ", "lightning": "## 3. ", "mfu": "## 4. ", "study": "## 5. ",
           "memory": "## 6. ", "data": "## 7. ", "modes": "## 8. ", "compile": "## 9. ", "auto": "## 10. ",
           "overhead": "## 11. ", "malloc": "## 12. ", "storage": "## 15. "}
DATA_KEYS = {
    "timm": {"times_s"},
    "variants": {"variants", "times_s"},
    "lightning": {"times_s", "per_step_s", "steps", "config", "processes"},
    "mfu": {"train_step_flops", "step_flops_per_s", "peak_flops_per_s", "mfu", "times_s"},
    "study": {"measured_trial_s", "trial_epochs", "grid_trials", "grid_estimate_s", "trials_per_hour"},
    "memory": {"method", "variants"},
    "data": {"recipes", "images_per_epoch", "images_per_s", "times_s"},
    "modes": {"device", "depth", "batch", "cells"},
    "compile": {"times_s", "first_compiled_step_s"},
    "auto": {"models"},
    "overhead": {"ratios", "times_s", "flops", "stream_kernels", "processes"},
    "malloc": {"ratios", "runs"},
    "storage": {"attributes", "times_s", "ratio"},
}


def run_bench(out: Path, *args: str, timeout: int = 900) -> tuple[str, dict]:
    """Run the CLI in a subprocess (it sets torch's thread count for its whole process); return (md, json)."""
    cmd = [sys.executable, "-m", "ablations.bench", "--out", str(out), *args]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return (out / "bench.md").read_text(), json.loads((out / "bench.json").read_text())


def check_report(md: str, report: dict, sections: list[str]) -> None:
    for header in ("# Benchmark", "## Machine", "## Goals"):
        assert header in md
    for name in sections:
        assert HEADERS[name] in md, name
    for name in set(HEADERS) - set(sections):
        assert HEADERS[name] not in md, name
    meta = report["meta"]
    assert {"mode", "device", "settings", "machine", "started", "wall_s", "sections"} <= set(meta)
    assert {"cpu", "threads", "torch", "timm", "lightning", "loadavg_start", "loadavg_end"} <= set(meta["machine"])
    assert meta["machine"]["cpu"] in md
    assert set(report["sections"]) == set(sections)
    for name, sec in report["sections"].items():
        assert sec["error"] is None, sec["error"]
        assert {"title", "setup", "passed", "goals", "wall_s", "data"} <= set(sec)
        assert DATA_KEYS[name] <= set(sec["data"]), name
        for goal in sec["goals"]:  # every goal is in the summary table with its mark
            assert {"what", "value", "limit", "goal", "result", "passed"} <= set(goal)
            assert goal["what"] in md


@pytest.mark.slow  # every section, then ablations.costs three times over every form (~55 s on 2 quiet cores)
def test_tiny_run_writes_every_section(tmp_path):
    md, report = run_bench(tmp_path, "--tiny", "--threads", "1")
    check_report(md, report, list(harness.DEFAULT_SECTIONS))
    assert report["meta"]["mode"] == "tiny" and report["meta"]["machine"]["threads"] == 1
    sections = report["sections"]
    labels = {label for label, *_ in all_configs()}  # registry defaults, extra forms and backbone forms
    assert set(sections["variants"]["data"]["variants"]) == labels and len(labels) > 30
    assert set(sections["memory"]["data"]["variants"]) == labels
    assert set(sections["timm"]["data"]["times_s"]) == {"timm", "ours standard", "timm init_values=1e-5",
                                                       "ours layerscale 1e-5"}
    goals = {g["what"] for s in sections.values() for g in s["goals"]}
    assert {"ours standard / timm", "MFU", "dca k=2 vs dca (default)", "data path recipe=basic / model step",
            "data path recipe=paper / model step"} <= goals
    assert "pass" in md or "**miss**" in md
    assert report["meta"]["device"] == "cpu" and "fp32, fused attention" in sections["timm"]["setup"]
    check_data_section(sections["data"])
    check_modes_table(tmp_path / "modes-cpu.json", sections["modes"])
    check_auto_section(sections["auto"])
    check_costs_read_the_step_times(tmp_path / "bench.json", report)


def check_auto_section(sec: dict) -> None:
    """Section 10: auto's mode at each size, timed beside both fixed precisions, with the goal auto / 32-true."""
    (model,) = sec["data"]["models"]
    assert set(model["times_s"]) == {"32-true", "bf16-mixed", "auto"}
    assert model["mode"] in modes.MODE_KEYS and model["source"]
    (goal,) = sec["goals"]
    assert goal["limit"] == 1.05 and goal["what"].startswith("auto / 32-true")


def check_data_section(sec: dict) -> None:
    """Both recipes' loaders ran whole epochs (the train split of the tiny synthetic pool), beside the model step."""
    data = sec["data"]
    assert set(data["recipes"]) == {"basic", "paper"}
    assert data["recipes"]["paper"]["mixup_alpha"] > 0 and data["recipes"]["basic"]["mixup_alpha"] == 0
    assert set(data["images_per_epoch"]) == {"basic", "paper"}
    assert all(harness.TINY.data_samples / 2 < n < harness.TINY.data_samples for n in data["images_per_epoch"].values())
    assert set(data["images_per_s"]) == {"basic", "paper", "model train step"}
    assert all(r > 0 for rates in data["images_per_s"].values() for r in rates)


def check_modes_table(path: Path, sec: dict) -> None:
    """Section 8 writes ``modes-<device>.json``: each cell's four modes, the fastest named as ablations.machine.modes reads
    it (tests/test_modes.py checks the choice end to end)."""
    table = json.loads(path.read_text())
    assert table["device"] == "cpu" and table["machine"]["cpu"]
    grid = [(w, (harness.TINY.img_size // p) ** 2 + 1) for w in harness.TINY.modes_widths for p in harness.TINY.modes_patches]
    assert [(c["embed_dim"], c["tokens"]) for c in table["cells"]] == grid
    for c in table["cells"]:
        assert set(c["times_s"]) == {"32-true/fused", "32-true/explicit", "bf16-mixed/fused", "bf16-mixed/explicit"}
        fp32 = min(("32-true/fused", "32-true/explicit"), key=c["times_s"].get)
        best = min(c["times_s"], key=c["times_s"].get)
        if best.startswith("bf16") and c["times_s"][best] > modes.BF16_MARGIN * c["times_s"][fp32]:
            best = fp32  # bf16 must win by the margin
        fused = best.replace("/explicit", "/fused")  # explicit attention only where clearly faster than fused
        if best.endswith("/explicit") and c["times_s"][best] > modes.KERNEL_MARGIN * c["times_s"][fused]:
            best = fused
        assert best == f"{c['best']['precision']}/{'fused' if c['best']['fused_attn'] else 'explicit'}"
    assert modes.table_signature(table) == modes.cpu_signature(1)  # measured with --threads 1
    assert len(sec["data"]["cells"]) == len(grid)


@pytest.mark.slow
def test_variants_restrict_sections_2_and_6(tmp_path):
    """``--variants`` times only the labels given (a label may hold a comma), plus standard, their reference."""
    chosen = ["dca k=2", "denseformer 2x2 (dilation 2, period 2)"]
    md, report = run_bench(tmp_path, "--tiny", "--threads", "1", "--sections", "variants,memory",
                           "--variants", ",".join(chosen))
    check_report(md, report, ["variants", "memory"])
    assert report["meta"]["settings"]["variants"] == ["standard", *chosen]
    for name in ("variants", "memory"):
        assert list(report["sections"][name]["data"]["variants"]) == ["standard", *chosen]
    assert not (tmp_path / "modes-cpu.json").exists()
    # ablations.costs reads these step times at the bench's size (the fast check; the slow tier runs its CLI)
    s = harness.TINY
    size = {"embed_dim": s.embed_dim, "depth": s.variant_depth, "num_heads": s.num_heads, "img_size": s.img_size,
            "patch_size": s.patch_size}
    step_times, note = bench_step_times(tmp_path / "bench.json", size)
    assert step_times == report["sections"]["variants"]["data"]["variants"] and "tiny mode" in note
    assert bench_step_times(tmp_path / "bench.json", size | {"depth": s.variant_depth + 1})[0] == {}  # another size


def test_parse_variants():
    labels = [label for label, *_ in all_configs()]
    assert harness.parse_variants("dca (default), dca k=2,", labels) == ("standard", "dca (default)", "dca k=2")
    assert harness.parse_variants("denseformer 2x2 (dilation 2, period 2),standard", labels) == (
        "standard", "denseformer 2x2 (dilation 2, period 2)")
    settings = replace(harness.QUICK, variants=harness.parse_variants("dca k=2", labels))  # beyond --quick's defaults
    assert [c[0] for c in harness.selected_configs(settings)] == ["standard", "dca k=2"]


def check_costs_read_the_step_times(bench_json: Path, report: dict) -> None:
    """``ablations.costs --bench`` puts each form's measured step-time ratio beside its FLOPs, at the bench's size;
    at another size it leaves the column empty and says why."""
    s = harness.TINY
    size = ["--embed-dim", str(s.embed_dim), "--depth", str(s.variant_depth), "--num-heads", str(s.num_heads),
            "--img-size", str(s.img_size), "--patch-size", str(s.patch_size)]
    out = subprocess.run([sys.executable, "-m", "ablations.costs", *size, "--bench", str(bench_json), "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    timed = report["sections"]["variants"]["data"]["variants"]
    rows = {r["variant"]: r for r in json.loads(out)}
    assert set(rows) == set(timed)
    for label, row in rows.items():
        assert row["step_time_ratio"] == pytest.approx(timed[label]["time_ratio"]), label
        assert row["params"] == timed[label]["params"] and row["flops"] == timed[label]["flops"], label
    md = subprocess.run([sys.executable, "-m", "ablations.costs", *size, "--bench", str(bench_json)], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, check=True).stdout
    assert "| step time vs standard |" in md and "tiny mode" in md
    assert "| value_residual=learned (ResFormer) |" in md
    other = subprocess.run([sys.executable, "-m", "ablations.costs", "--depth", "4", "--embed-dim", "16", "--patch-size", "8",
                            "--num-heads", "2", "--bench", str(bench_json)], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, check=True).stdout
    assert "timed another size" in other and "| standard | " in other and "—" in other


def test_quick_mode_times_the_registry_defaults_only_and_the_full_mode_every_form():
    """``--quick`` times the registry's variants at their defaults; the full bench every form (the tiny run above
    checks that each section runs; at the quick sizes the variants section alone takes a minute)."""
    quick = [(residual, options, backbone) for _, residual, options, backbone in harness.selected_configs(harness.QUICK)]
    assert quick == [(name, {}, {}) for name in RESIDUALS] and harness.QUICK.mode == "quick"
    assert [c[0] for c in harness.selected_configs(harness.FULL)] == [c[0] for c in all_configs()]


@pytest.mark.slow
def test_quick_run_at_its_own_sizes(tmp_path):
    """One section end to end at the quick mode's real sizes (the tiny run covers every section's structure)."""
    md, report = run_bench(tmp_path, "--quick", "--sections", "mfu", timeout=2400)  # a hang limit only
    check_report(md, report, ["mfu"])
    assert report["meta"]["mode"] == "quick"
    assert report["meta"]["settings"]["batch"] == harness.QUICK.batch
    assert 0 < report["sections"]["mfu"]["data"]["mfu"] < 1


@pytest.mark.slow  # a cold torch.compile costs ~85 s on 2 CPU cores
def test_overhead_section_has_one_goal_per_new_design(tmp_path, monkeypatch):
    """Section 11: the five depth-aggregation and multi-stream designs at their defaults, each against standard with its own goal; the
    multi-stream ones with the compiled kernels (what ``auto`` picks on a CPU with a compiler; the suite's
    environment says eager) and, beside them without a goal, with the eager ones."""
    from prerequisites import missing

    from lit_modules.residual.stream_kernels import compiler_works

    if not compiler_works():
        missing("torch.compile cannot build CPU kernels here", "a C++ compiler (g++) and the Python headers")
    monkeypatch.setenv("ABLATIONS_STREAM_KERNELS", "compiled")
    md, report = run_bench(tmp_path, "--tiny", "--threads", "1", "--sections", "overhead")
    check_report(md, report, ["overhead"])
    sec = report["sections"]["overhead"]
    eager = {"hyper_connections (eager kernels)", "mhc (eager kernels)"}
    assert set(sec["data"]["times_s"]) == {"standard", *steps.OVERHEAD_GOALS, *eager}
    assert sec["data"]["stream_kernels"] == "compiled" and "multi-stream kernels: compiled" in sec["setup"]
    assert all(f"| {label} |" in md for label in eager)
    assert {g["what"]: g["limit"] for g in sec["goals"]} == {f"{k} / standard": v for k, v in steps.OVERHEAD_GOALS.items()}
    assert steps.OVERHEAD_GOALS == {"attn_res": 1.3, "hyper_connections": 1.3, "dca": 1.3, "mhc": 1.5, "denseformer": 1.1}
    for goal in sec["goals"]:
        label = goal["what"].split(" / ")[0]
        assert goal["value"] == pytest.approx(timing.median(sec["data"]["ratios"][label]))
        assert goal["passed"] == (goal["value"] <= goal["limit"]) and len(goal["rounds"]) == 2
    assert sec["data"]["flops"]["mhc"] > sec["data"]["flops"]["standard"]
    assert "depth 2" in sec["setup"] and "batch 4" in sec["setup"]  # the tiny mode's overhead_depth, _batch


def stand_in(task: str, runs: list[dict]):
    """A ``runs_of`` that returns ``runs`` for ``task`` (and fails for any other)."""
    def runs_of(s, asked, measure):
        assert asked == task and measure.__name__ == {"overhead": "overhead_times", "lightning": "lightning_times"}[task]
        return runs

    return runs_of


def overhead_run(mhc: list[float]) -> dict:
    """A stand-in for one process's section-11 measurement: every design 1 s a step in every round, mHC ``mhc``."""
    times = {label: [1.0] * len(mhc) for label in ["standard", *steps.OVERHEAD_GOALS]}
    return {"times_s": times | {"mhc": mhc}, "flops": {label: 100.0 for label in times}, "stream_kernels": "eager"}


def test_overhead_over_processes_takes_the_median_of_each_process_median(monkeypatch):
    """``--processes K``: a ratio is the median over processes of each process's in-round median, its brackets and
    its mark count processes (mHC below: processes at 1.4x and 1.6x give 1.5x, a pass in 1 of 2 processes; pooling
    the six rounds would give 1.55x, a miss)."""
    runs = [overhead_run([1.2, 1.4, 1.6]), overhead_run([1.5, 1.7, 1.6])]
    monkeypatch.setattr(steps, "runs_of", stand_in("overhead", runs))
    sec = steps.bench_overhead(replace(harness.TINY, processes=2))
    goal = next(g for g in sec.goals if g["what"] == "mhc / standard")
    assert goal["value"] == pytest.approx(1.5) and goal["passed"] and goal["rounds"] == pytest.approx([1.4, 1.6])
    row = next(r for r in sec.rows if r[0] == "mhc")
    assert row[3:] == ["1.500x [1.40-1.60]", "≤ 1.50x", "pass (1/2 processes)"]
    assert "time vs standard [process min-max]" in sec.columns and "in each of 2 fresh processes" in sec.setup
    assert sec.data["processes"] == 2 and sec.data["process_times_s"] == [r["times_s"] for r in runs]
    assert sec.data["times_s"]["mhc"] == [1.2, 1.4, 1.6, 1.5, 1.7, 1.6]  # one process's shape, rounds pooled
    assert any("unpaired" in note for note in sec.notes)


def test_overhead_in_one_process_keeps_rounds(monkeypatch):
    """One process (the default): brackets and marks count rounds, the JSON keeps its one-process shape."""
    runs = [overhead_run([1.2, 1.4, 1.6])]
    monkeypatch.setattr(steps, "runs_of", stand_in("overhead", runs))
    sec = steps.bench_overhead(harness.TINY)
    row = next(r for r in sec.rows if r[0] == "mhc")
    assert row[3:] == ["1.400x [1.20-1.60]", "≤ 1.50x", "pass (2/3 rounds)"]
    assert "time vs standard [round min-max]" in sec.columns and "fresh processes" not in sec.setup
    assert sec.data["times_s"] == runs[0]["times_s"] and "process_times_s" not in sec.data
    assert sec.data["ratios"]["mhc"] == pytest.approx([1.2, 1.4, 1.6]) and sec.data["processes"] == 1
    assert sec.notes == [steps.ONE_PROCESS_NOTE]


def test_runs_of_starts_one_child_per_process_only_when_asked(monkeypatch):
    calls = []
    monkeypatch.setattr(child, "run", lambda task, s, threads: calls.append((task, s.processes, threads)) or {"n": 1})
    assert harness.runs_of(harness.TINY, "overhead", lambda s: {"here": True}) == [{"here": True}] and calls == []
    three = replace(harness.TINY, processes=3)
    assert harness.runs_of(three, "lightning", lambda s: pytest.fail("measured in the parent")) == [{"n": 1}] * 3
    import torch

    assert calls == [("lightning", 3, torch.get_num_threads())] * 3


def test_isolate_times_every_model_in_its_own_process_in_rotating_rounds(monkeypatch):
    """``--isolate K``: K rounds; in each, one child process per model (task ``one_model``), the first model of the
    round rotating; each label gets one time per round, in round order."""
    calls = []

    def run(task, s, threads, label):
        calls.append((task, label))
        return {"s": 1.0 + len(calls) / 100}

    monkeypatch.setattr(child, "run", run)
    labels = ["standard", "mhc", "dca"]
    times = steps.isolated_times(replace(harness.TINY, isolate=2), labels)
    assert calls == [("one_model", "standard"), ("one_model", "mhc"), ("one_model", "dca"),
                     ("one_model", "mhc"), ("one_model", "dca"), ("one_model", "standard")]
    assert times == {"standard": [1.01, 1.06], "mhc": [1.02, 1.04], "dca": [1.03, 1.05]}
    assert steps.overhead_labels("compiled") == ["standard", *steps.OVERHEAD_GOALS, "hyper_connections (eager kernels)",
                                                 "mhc (eager kernels)"]
    assert steps.overhead_labels("eager") == ["standard", *steps.OVERHEAD_GOALS]


@pytest.mark.slow  # twelve child processes (imports and a few tiny steps each: ~1 min)
def test_overhead_section_with_every_model_in_its_own_process(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATIONS_STREAM_KERNELS", "eager")  # the children inherit it: no compile
    md, report = run_bench(tmp_path, "--tiny", "--threads", "1", "--sections", "overhead", "--isolate", "2")
    check_report(md, report, ["overhead"])
    sec = report["sections"]["overhead"]
    assert set(sec["data"]["times_s"]) == {"standard", *steps.OVERHEAD_GOALS}
    assert all(len(t) == 2 and len(set(t)) == 2 for t in sec["data"]["times_s"].values())  # two processes each
    for goal in sec["goals"]:
        label = goal["what"].split(" / ")[0]
        assert goal["rounds"] == pytest.approx(timing.round_ratios(sec["data"]["times_s"], label, "standard"))
    assert "every model in a fresh process of its own" in sec["setup"] and "2 rounds in rotating order" in sec["setup"]


@pytest.mark.slow
def test_overhead_batch_sets_section_11s_batch(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATIONS_STREAM_KERNELS", "eager")  # no compile: seconds
    md, report = run_bench(tmp_path, "--tiny", "--threads", "1", "--sections", "overhead", "--overhead-batch", "3")
    sec = report["sections"]["overhead"]
    assert report["meta"]["settings"]["overhead_batch"] == 3 and "batch 3;" in sec["setup"]
    assert set(sec["data"]["times_s"]) == {"standard", *steps.OVERHEAD_GOALS}


def lightning_run(vit: list[float], setup: float) -> dict:
    """A stand-in for one process's section-3 measurement: the plain loop 1 s a step in every round, the bare
    module 1.01 s, ViTClassifier ``vit``; every loop's set-up ``setup`` s."""
    per_step = {"plain PyTorch": [1.0] * len(vit), "Lightning, ViTClassifier": vit,
                "Lightning, bare module": [1.01] * len(vit)}
    config = {"dataset": "mnist5k", "embed_dim": 64, "depth": 4, "num_heads": 4, "patch_size": 7, "batch_size": 64,
              "label_smoothing": 0.1}
    return {"times_s": {f"{name} x{n}": [setup] * len(vit) for name in per_step for n in (60, 0)},
            "per_step_s": per_step, "config": config}


def test_lightning_over_processes_takes_the_median_of_each_process_median(monkeypatch):
    """Section 3 with ``--processes 2``: the ViTClassifier loop at 1.02x in one process and 1.10x in the other
    (per step, against the plain loop's) is 1.06x, a miss met in 1 of 2 processes; set-up and ms/step are the
    median of the processes' medians."""
    runs = [lightning_run(vit=[1.02, 1.0, 1.04], setup=0.5), lightning_run(vit=[1.10, 1.12, 1.08], setup=0.7)]
    monkeypatch.setattr(loops, "runs_of", stand_in("lightning", runs))
    sec = loops.bench_lightning(replace(harness.TINY, processes=2))
    goal = sec.goals[0]
    assert goal["what"] == "Lightning, ViTClassifier / plain, per step" and len(sec.goals) == 1
    assert goal["value"] == pytest.approx(1.06) and not goal["passed"] and goal["rounds"] == pytest.approx([1.02, 1.10])
    row = next(r for r in sec.rows if r[0] == "Lightning, ViTClassifier")
    assert row == ["Lightning, ViTClassifier", "600.0", "1060.0", "1.060x [1.02-1.10]", "≤ 1.05x",
                   "**miss** (1/2 processes)"]
    assert "per step vs plain [process min-max]" in sec.columns and "in each of 2 fresh processes" in sec.setup
    assert "mnist5k, embed 64" in sec.setup and sec.data["processes"] == 2
    assert sec.data["process_per_step_s"] == [r["per_step_s"] for r in runs]


@pytest.mark.slow  # two child processes per section (imports, eager steps, Lightning loops: ~1 min)
def test_sections_3_and_11_in_fresh_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATIONS_STREAM_KERNELS", "eager")  # the children inherit it: no compile
    md, report = run_bench(tmp_path, "--tiny", "--threads", "1", "--sections", "lightning,overhead",
                           "--processes", "2")
    check_report(md, report, ["lightning", "overhead"])
    loop = report["sections"]["lightning"]
    assert loop["data"]["processes"] == 2 and len(loop["data"]["process_per_step_s"]) == 2
    (goal,) = loop["goals"]
    per_process = [timing.median(timing.round_ratios(p, "Lightning, ViTClassifier", "plain PyTorch"))
                   for p in loop["data"]["process_per_step_s"]]
    assert goal["rounds"] == pytest.approx(per_process) and goal["value"] == pytest.approx(timing.median(per_process))
    data = report["sections"]["overhead"]["data"]
    assert data["processes"] == 2 and len(data["process_times_s"]) == 2 and data["stream_kernels"] == "eager"
    assert data["process_times_s"][0] != data["process_times_s"][1]  # two measurements, not one copied
    for goal in report["sections"]["overhead"]["goals"]:
        label = goal["what"].split(" / ")[0]
        per_process = [timing.median(timing.round_ratios(t, label, "standard")) for t in data["process_times_s"]]
        assert goal["rounds"] == pytest.approx(per_process) and goal["unit"] == "processes"
        assert goal["value"] == pytest.approx(timing.median(per_process))
    assert re.search(r"\| (pass|\*\*miss\*\*) \([0-2]/2 processes\) \|", md)
    assert "in each of 2 fresh processes" in md and "Sections 3 and 11 ran in 2 fresh processes each" in md


@pytest.mark.slow  # a cold torch.compile (inductor) on the CPU
def test_compile_section(tmp_path):
    md, report = run_bench(tmp_path, "--tiny", "--threads", "1", "--sections", "mfu", "--compile")
    check_report(md, report, ["mfu", "compile"])


@pytest.mark.slow  # two child processes per round (~25 s)
@pytest.mark.skipif(not allocator.glibc(), reason="glibc's malloc")
def test_malloc_section_compares_the_two_settings_in_child_processes(tmp_path):
    """Section 12: each round's children ran under the setting they were given (their own report of it), every
    timed model has a per-round ratio of the two settings' times (the tiny sizes' blocks are too small for malloc's
    settings to differ: tests/test_allocator.py checks the faults)."""
    md, report = run_bench(tmp_path, "--tiny", "--threads", "1", "--sections", "malloc")
    check_report(md, report, ["malloc"])
    sec = report["sections"]["malloc"]
    runs = sec["data"]["runs"]
    assert [r["malloc"] for r in runs["system"]] == ["system (ABLATIONS_MALLOC=system)"] * 2
    assert [r["malloc"].split(" (")[0] for r in runs["keep"]] == ["keep"] * 2
    assert set(sec["data"]["ratios"]) == {f"{m} ({size})" for m in ("standard", "mhc")
                                          for size in ("section 11", "study size")}
    assert all(len(r) == 2 and all(x > 0 for x in r) for r in sec["data"]["ratios"].values())
    assert "12. glibc's malloc" in md and "keep vs system" in md


def test_a_bad_malloc_choice_exits_2_with_one_line(monkeypatch, capsys):
    monkeypatch.setenv(allocator.ENV, "fast")
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--tiny", "--sections", "timm"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "ABLATIONS_MALLOC='fast' is not a malloc choice; valid choices: system, keep")


def test_settings_survive_the_child_process_payload():
    for settings in (harness.TINY, harness.QUICK, harness.FULL, dataclasses.replace(harness.FULL, variants=("dca",))):
        assert tasks.settings_from(json.loads(json.dumps(dataclasses.asdict(settings)))) == settings


@pytest.mark.slow  # starts a Python process
def test_a_failing_child_is_one_error_naming_its_task():
    with pytest.raises(RuntimeError, match=r"^the child process of task nope failed \(exit 1\): KeyError: 'nope'$"):
        child.run("nope", harness.TINY, 1)


def test_sections_by_name_or_number():
    assert cli.parse_sections("mfu,1, memory") == ["mfu", "timm", "memory"]
    assert cli.parse_sections("7,8") == ["data", "modes"]
    assert cli.parse_sections("9") == ["compile"]
    assert cli.parse_sections("10") == ["auto"] and cli.parse_sections("11") == ["overhead"]
    assert cli.parse_sections("12") == ["malloc"] and cli.parse_sections("15") == ["storage"]
    assert {"compile", "malloc", "storage"}.isdisjoint(harness.DEFAULT_SECTIONS) and {"data", "modes"} <= set(harness.DEFAULT_SECTIONS)


@pytest.mark.parametrize("argv", [["--sections", "nope"], ["--sections", "16"], ["--threads", "0"],
                                  ["--device", "tpu"], ["--variants", "standard,nope"],
                                  ["--processes", "0"], ["--processes", "3", "--sections", "timm,mfu"],
                                  ["--isolate", "-1"], ["--isolate", "2", "--processes", "2"],
                                  ["--isolate", "2", "--sections", "lightning"], ["--overhead-batch", "0"],
                                  ["--overhead-batch", "64", "--sections", "variants"]])
def test_bad_arguments_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err
    if argv[0] == "--variants":
        assert "unknown variant 'nope'" in err and "dca k=2" in err  # names the valid labels


def test_device_cuda_without_cuda_exits_2_with_one_line(monkeypatch, capsys, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        cli.main(["--device", "cuda", "--tiny", "--sections", "modes", "--out", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --device cuda:") and "\n" not in err
    assert not list(tmp_path.iterdir())


def test_interleave_rotates_rounds_and_pairs_ratios():
    calls = []
    fns = {name: (lambda n=name: calls.append(n)) for name in "ABC"}
    times = timing.interleave(fns, reps=3, steps=2, warmup=1)
    assert calls[:3] == ["A", "B", "C"]  # warm-up, untimed
    rounds = calls[3:]
    assert rounds == ["A", "A", "B", "B", "C", "C", "B", "B", "C", "C", "A", "A", "C", "C", "A", "A", "B", "B"]
    assert {k: len(v) for k, v in times.items()} == {"A": 3, "B": 3, "C": 3}
    assert timing.paired_ratio({"a": [2.0, 4.0, 9.0], "b": [1.0, 1.0, 3.0]}, "a", "b") == 3.0


def test_goal_marks_count_the_rounds_that_meet_it():
    sec = harness.Section("x", "9. x", "setup", ["a"])
    ratios = timing.round_ratios({"a": [1.0, 1.1, 1.3], "b": [1.0, 1.0, 1.0]}, "a", "b")
    assert sec.goal("a / b", timing.median(ratios), 1.05, "≤ 1.05x", "1.100x", rounds=ratios) == [
        "≤ 1.05x", "**miss** (1/3 rounds)"]
    assert sec.goal("mfu", 0.6, 0.55, "≥ 55%", "60%", at_most=False) == ["≥ 55%", "pass"]
    assert sec.goals[0]["rounds_meeting_goal"] == 1 and sec.goals[0]["passed"] is False
    assert harness.ratio_cell(ratios) == "1.100x [1.00-1.30]"
    assert harness.ratio_cell(ratios, percent=True) == "+10.0% [+0, +30]"


def test_saved_activation_bytes_counts_the_saved_storages_and_frees_the_graph():
    """Section 6's CPU measure: the bytes of the storages autograd saves (here a tanh saves its output, the
    multiply both inputs; the parameter is left out), and once it returns nothing of the graph is alive. Packing a
    saved output as itself made a cycle through its own grad_fn that kept every measured model's graph (the full
    run was killed for memory at 22 GiB)."""
    import gc
    import weakref

    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.ones(5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.out = weakref.ref(h := torch.tanh(x * self.w))  # saved by tanh's backward: an output
            return h.sum(dim=1, keepdim=True).expand(-1, 3) * 2.0

    net = Net()
    x, y = torch.randn(4, 5), torch.tensor([0, 1, 2, 0])
    # x * w saves x (4x5 floats) and w (a parameter: not counted); tanh its output (4x5); sum, expand and the
    # scalar multiply nothing; cross_entropy its log-softmax (4x3), the int64 targets (4) and NLL's total weight
    counted = steps.saved_activation_bytes(net, (x, y))
    assert counted == (20 + 20 + 12) * 4 + 4 * 8 + 4
    gc.collect()
    assert net.out() is None  # the graph, and the output it saved, are gone


@pytest.mark.slow  # two bench sections in a subprocess
def test_the_engine_sections_at_tiny_sizes_on_a_cpu(tmp_path):
    """Section 13 (opt-in): a stacked call trains K runs, so its time per trial is the call's time / K; the ratio
    column is that per-trial time against the plain step's, paired by round. Section 14 (opt-in, for --device
    cuda): the aggregate images/s of stacked processes, the paper recipe's step and the multi-stream designs'
    ratios; on a CPU at tiny sizes it runs the same code without graphs. (One bench process for both.)"""
    md, report = run_bench(tmp_path, "--tiny", "--threads", "1", "--sections", "engine,gpu")
    assert "## 13. The engine's levers" in md
    sec = report["sections"]["engine"]
    assert sec["error"] is None, sec["error"]
    (model,) = sec["data"]["models"]
    times = model["times_s"]
    assert set(times) == {"plain", "stacked 2"}
    per_trial = [s / 2 / p for s, p in zip(times["stacked 2"], times["plain"], strict=True)]
    assert model["per_trial_vs_plain"]["stacked 2"] == pytest.approx(timing.median(per_trial))
    assert model["per_trial_vs_plain"]["plain"] == 1.0
    assert cli.parse_sections("13") == ["engine"] and "engine" not in harness.DEFAULT_SECTIONS

    assert "## 14. The engine on the device" in md
    sec = report["sections"]["gpu"]
    assert sec["error"] is None, sec["error"]
    aggregate, paper, designs = (sec["data"][k] for k in ("aggregate", "paper", "designs"))
    (process,) = aggregate["processes"]
    assert aggregate["images_per_s"] == pytest.approx(process["images"] / process["seconds"])
    assert process["images"] == process["steps"] * 2 * 8 > 0
    assert paper["plain_mfu"] is None and paper["plain_images_per_s"] == pytest.approx(
        paper["batch"] / timing.median(paper["times_s"]["plain"]))
    assert set(designs["ratios"]) == set(steps.OVERHEAD_GOALS)
    assert {g["what"] for g in sec["goals"]} >= {"study-size aggregate images/s"}
    assert cli.parse_sections("14") == ["gpu"] and "gpu" not in harness.DEFAULT_SECTIONS


def test_a_gpu_sections_engine_step_is_the_dry_runs_flop_rate(tmp_path):
    from ablations.pricing import gpu_hours

    report = {"meta": {"device": "cuda", "started": "2026-12-05 10:00:00", "settings": {},
                       "machine": {"gpu": "NVIDIA H200"}},
              "sections": {"gpu": {"data": {"paper": {"engine graph_images_per_s": 90000.0, "batch": 1024,
                                                      "train_flops_per_image": 4.3e9}}}}}
    (tmp_path / "device" / "cuda" / "x").mkdir(parents=True)
    (tmp_path / "device" / "cuda" / "x" / "bench.json").write_text(json.dumps(report))
    (found,) = gpu_hours.find_measurements(tmp_path)
    assert found.flops_per_s == pytest.approx(90000 * 4.3e9) and found.gpu_class == "h200"
    assert found.kind == "engine" and found.mfu == pytest.approx(90000 * 4.3e9 / 989.4e12)
    older = gpu_hours.Measurement("training run", "NVIDIA H200", "h200", "bf16-mixed", 2.7e13, "dc.json", "2026", "")
    basis = gpu_hours.choose_basis("h200", "bf16-mixed", [older, found])
    assert basis.measurement is found  # a study on a GPU trains through the engine: its step is the rate


def test_the_storage_section_times_both_writes_of_a_whole_summary():
    """Section 15 at tiny size: both ways write the whole summary of a run's shape to trials of their own (the
    section checks what was stored), and the ratio is one transaction's time over one per attribute's."""
    from ablations.bench.storage import bench_storage, summary

    sec = bench_storage(harness.TINY)
    assert set(sec.data) == DATA_KEYS["storage"] and sec.data["attributes"] == len(summary()) == 53
    times = sec.data["times_s"]
    assert set(times) == {"per attribute", "one transaction"}
    assert all(len(t) == harness.TINY.reps for t in times.values())
    pairs = zip(times["one transaction"], times["per attribute"], strict=True)
    assert sec.data["ratio"] == timing.median([a / b for a, b in pairs])
    assert [g["what"] for g in sec.goals] == ["storage: one transaction vs one per attribute"]
    assert len(sec.rows) == 2 and sec.rows[1][2].startswith(f"{sec.data['ratio']:.3f}x")
