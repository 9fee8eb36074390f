"""scripts/device_check.py: its commands, its stage records, and a real ``--device cpu --short`` check.

On a machine with a GPU, ``python scripts/device_check.py --device cuda`` is the check itself; here (no GPU) the
CUDA test is skipped and the CPU path runs at tiny sizes.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import assert_one_line_error, run_in_process

from ablations.bench import device_figures

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "device_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


dc = _load()


# --- commands -------------------------------------------------------------------------------------------------------
def test_bench_command_times_standard_and_the_dca_labels_on_the_device(tmp_path):
    command = dc.bench_command("cuda", False, tmp_path / "bench", python="python")
    assert command[:3] == ["python", "-m", "ablations.bench"]
    assert command[command.index("--device") + 1] == "cuda" and "--quick" in command and "--tiny" not in command
    assert command[command.index("--sections") + 1] == "timm,variants,mfu,data,overhead"
    labels = command[command.index("--variants") + 1].split(",")
    assert labels[0] == "standard" and "dca (default)" in labels and "dca k=2" in labels
    assert not any("seed" in label for label in labels)  # the seed notes' mix is not DCA proper
    assert command[command.index("--out") + 1] == str(tmp_path / "bench")
    assert "--tiny" in dc.bench_command("cpu", True, tmp_path, python="python")


def test_pytest_and_train_commands(tmp_path):
    assert dc.pytest_command("python")[:5] == ["python", "-m", "pytest", "-m", "cuda"]
    command = dc.train_command("cuda", False, "/data", tmp_path, python="python")
    assert command[1] == str(SCRIPT) and "--train-stage" in command and command[-2:] == ["--data-dir", "/data"]
    assert "--short" in dc.train_command("cpu", True, None, tmp_path)


def test_training_config_is_the_paper_budgets_first_point_for_two_epochs():
    from ablations.studies.spec import load_spec

    spec = load_spec("residual_variants", "paper")
    first = spec.run_config(spec.grid()[0])
    config, note = dc.training_config("cuda", short=False, data_dir=None)
    assert config.max_epochs == 2 and config.accelerator == "gpu"
    assert (config.residual, config.depth, config.embed_dim, config.batch_size) == (
        first.residual, first.depth, first.embed_dim, first.batch_size)
    assert config.dataset == "synthetic" and config.dataset_options == dc.CIFAR_LIKE_SYNTHETIC
    assert "no --data-dir" in note
    with_data, note = dc.training_config("cuda", short=False, data_dir="/data")
    assert with_data.dataset == first.dataset and with_data.data_dir == "/data" and "/data" in note
    short, _ = dc.training_config("cpu", short=True, data_dir=None)
    assert short.max_epochs == 1 and short.accelerator == "cpu" and short.embed_dim == 16


# --- records --------------------------------------------------------------------------------------------------------
def test_pytest_counts_read_the_summary_line():
    text = "SKIPPED [1] tests/test_x.py:3: needs a CUDA device\n1 passed, 2 skipped, 860 deselected, 1 error in 9.1s\n"
    assert device_figures.pytest_counts(text) == {"passed": 1, "skipped": 2, "failed": 0, "errors": 1, "deselected": 860}
    assert device_figures.pytest_counts("nothing ran") == {"passed": 0, "skipped": 0, "failed": 0, "errors": 0, "deselected": 0}


STAGE_THAT_HANGS = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
print("working", os.getpid(), child.pid, flush=True)
time.sleep(3600)
"""


def _gone(pid: int) -> bool:
    """The process has ended (a zombie waiting for its reaper counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_a_stage_over_its_limit_is_killed_and_recorded(tmp_path, monkeypatch):
    """A stage that never ends (it and a child of its own sleep for an hour) is killed at its limit, with its
    whole process group, and recorded as a timeout with its last output. No duration is asserted: the limit is
    counted from the moment the stage has printed its first line (an event, however slowly a loaded machine
    starts Python), and the stage can only end by being killed."""
    log = tmp_path / "logs" / "slow.log"

    class StartedPopen(subprocess.Popen):
        def wait(self, timeout=None):
            if timeout == 1.0 and not getattr(self, "started", False):  # the stage's limit: wait for its first line
                self.started = True
                while "\nworking " not in (log.read_text() if log.is_file() else ""):
                    assert self.poll() is None, log.read_text()
                    time.sleep(0.05)
            return super().wait(timeout)

    monkeypatch.setattr(dc.subprocess, "Popen", StartedPopen)
    result = dc.run_stage("slow", [sys.executable, "-c", STAGE_THAT_HANGS], 1.0, tmp_path)
    assert result.status == "timeout" and result.returncode is None
    assert "1 s limit" in result.error and "working" in result.error
    (printed,) = [line for line in log.read_text().splitlines() if line.startswith("working ")]
    stage_pid, child_pid = map(int, printed.split()[1:])
    assert _gone(stage_pid)  # reaped by run_stage
    deadline = time.monotonic() + 600  # a hang limit only: the child was signalled with its group, it ends
    while not _gone(child_pid):
        assert time.monotonic() < deadline, "the stage's child outlived the stage's process group"
        time.sleep(0.05)
    monkeypatch.undo()
    failed = dc.run_stage("bad", [sys.executable, "-c", "raise SystemExit('error: broken')"], 30, tmp_path)
    assert failed.status == "failed" and failed.returncode == 1 and "error: broken" in failed.error


def test_cuda_tests_skipped_on_cuda_fail_the_stage(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "t.log").write_text("1 skipped, 800 deselected in 3.2s\n")

    def stage():
        return dc.StageResult("passed", 3.0, 60, 0, "pytest", "logs/t.log")

    on_cpu, on_cuda = stage(), stage()
    dc.read_cuda_tests(on_cpu, tmp_path, "cpu")
    dc.read_cuda_tests(on_cuda, tmp_path, "cuda")
    assert on_cpu.status == "passed" and on_cpu.figures["skipped"] == 1
    assert on_cuda.status == "failed" and "skipped on a CUDA device" in on_cuda.error


def test_a_killed_training_run_reports_its_progress(tmp_path):
    (tmp_path / "train_progress.json").write_text(json.dumps({"epoch": 1, "batches": 40, "images": 39936,
                                                              "elapsed_s": 52.0, "images_per_s": 768.0}))
    result = dc.StageResult("timeout", 150.0, 150, None, "train", "logs/train.log", error="killed at its 150 s limit")
    dc.read_train(result, tmp_path)
    assert result.status == "timeout" and result.figures["progress"]["images_per_s"] == 768.0
    assert "768 images/s" in result.error and result.error.startswith("killed at its 150 s limit")


def test_bench_figures_pick_the_checks_numbers():
    report = {"sections": {
        "timm": {"goals": [{"what": "ours standard / timm", "value": 1.01, "passed": True}], "error": None},
        "variants": {"goals": [{"what": "dca", "value": 1.4, "passed": True}], "error": None,
                     "data": {"variants": {"standard": {"time_ratio": 1.0}, "dca (default)": {"time_ratio": 1.4}}}},
        "mfu": {"goals": [{"what": "MFU", "value": 0.2, "passed": False}], "error": None,
                "data": {"mfu": 0.2, "step_flops_per_s": 2e14, "peak_flops_per_s": 1e15}},
        "data": {"goals": [], "error": "RuntimeError: boom", "data": {"images_per_s": {"basic": [10.0, 30.0, 20.0]}}},
        "overhead": {"goals": [{"what": "mhc / standard", "value": 1.62, "limit": 1.5, "passed": False},
                               {"what": "dca / standard", "value": 1.1, "limit": 1.3, "passed": True}], "error": None},
    }}
    figures = device_figures.bench_figures(report)
    assert figures["ours_vs_timm"] == 1.01 and figures["step_time_vs_standard"] == {"dca (default)": 1.4}
    assert figures["mfu"] == 0.2 and figures["step_flops_per_s"] == 2e14
    assert figures["data_images_per_s"] == {"images_per_s/basic": 20.0}
    assert figures["overhead_vs_standard"] == {"mhc": {"ratio": 1.62, "limit": 1.5}, "dca": {"ratio": 1.1, "limit": 1.3}}
    assert figures["goals_met"] == "3/5" and figures["section_errors"] == {"data": "RuntimeError: boom"}


# --- the real thing, on the CPU -------------------------------------------------------------------------------------
@pytest.mark.slow
def test_short_cpu_check_writes_its_report(tmp_path):
    out = tmp_path / "device"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--short", "--out", str(out)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    report = json.loads((out / "device_check.json").read_text())
    stages = report["stages"]
    assert list(stages) == ["cuda_tests", "bench", "train"], proc.stderr
    assert report["format"] == 1 and report["device"] == "cpu" and report["short"] is True
    assert report["machine"]["torch"] and report["machine"]["gpu"] is None and report["date"]
    assert report["budget_s"]["total"] == sum(report["budget_s"][s] for s in stages)
    for stage in stages.values():
        assert {"status", "seconds", "timeout_s", "returncode", "command", "log", "error", "figures"} <= set(stage)
        assert (out / stage["log"]).is_file()
    # cuda_tests: the CUDA test is skipped here (the stage also fails on any collection error in the checkout)
    assert stages["cuda_tests"]["figures"]["skipped"] >= 1 and stages["cuda_tests"]["figures"]["failed"] == 0
    # bench: its own report, and the check's figures from it
    assert stages["bench"]["status"] == "passed", stages["bench"]["error"]
    assert (out / "bench" / "bench.json").is_file() and (out / "bench" / "bench.md").is_file()
    assert "dca (default)" in stages["bench"]["figures"]["step_time_vs_standard"]
    assert stages["bench"]["figures"]["mfu"] > 0 and stages["bench"]["figures"]["data_images_per_s"]
    assert set(stages["bench"]["figures"]["overhead_vs_standard"]) == {"attn_res", "hyper_connections", "dca", "mhc",
                                                                        "denseformer"}
    # train: the tiny run's summary figures
    train = stages["train"]
    assert train["status"] == "passed", train["error"]
    assert train["figures"]["train_images_per_s"] > 0 and train["figures"]["epochs_completed"] == 1
    assert train["figures"]["forward_flops_per_image"] > 0 and train["figures"]["config"]["max_epochs"] == 1
    # exit status and the printed total
    assert report["passed"] == all(s["status"] == "passed" for s in stages.values())
    assert proc.returncode == (0 if report["passed"] else 1)
    assert "stages passed in" in proc.stderr.splitlines()[-1]
    assert "| train | passed |" in (out / "device_check.md").read_text()


@pytest.mark.parametrize("argv, words", [
    (["--device", "tpu"], ["invalid choice: 'tpu'", "'cuda', 'cpu'"]),
    (["--device", "cpu", "--data-dir", "NOPE"], ["--data-dir", "is not a folder"]),
    (["--device", "cuda"], ["--device cuda", "no CUDA device"]),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(argv, words, monkeypatch, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    argv = [tmp_path / "nope" if a == "NOPE" else a for a in argv]
    assert_one_line_error(run_in_process(*argv, "--out", out, cwd=tmp_path, main=dc.main), *words)
    assert not out.exists()
