"""scripts/gpu_study.py: a whole study in one command, within the time budget it is given, in its CPU dry form.

On a GPU, ``python scripts/gpu_study.py --study residual_variants`` runs the headline; here the same script runs a
tiny study on the CPU through the engine's stacks, and the deadline is checked on a process that would outlive it.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import sys
import tarfile
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_study.py"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gs = _load()
TINY = {"name": "tiny", "kind": "grid", "metric": "test_acc",
        "base": {"dataset": "synthetic", "dataset_options": {"num_samples": 128, "img_size": 8}, "embed_dim": 8,
                 "num_heads": 2, "depth": 1, "max_epochs": 1, "patch_size": 4, "batch_size": 32, "threads": 1,
                 "precision": "32-true"},
        "variants": [{"label": "standard", "residual": "standard"}, {"label": "rezero", "residual": "rezero"}],
        "tune": {"lr": [0.001, 0.004], "seeds": [100, 101, 102], "bounds": [0.001, 0.004], "metric": "final_val_acc"},
        "axes": {"seed": [0, 1]}, "budgets": {"smoke": {"tune": {"seeds": [100]}}}}  # the test runs smoke: 8 trials


@pytest.mark.slow  # a whole study, its report and its pack (~18 s)
def test_the_cpu_dry_form_runs_the_study_reports_it_and_packs_four_files(tmp_path):
    study = tmp_path / "tiny.yaml"
    study.write_text(yaml.safe_dump(TINY, sort_keys=False))
    out, packed = tmp_path / "out", tmp_path / "pack"
    code = gs.main(["--study", str(study), "--budget", "smoke", "--device", "cpu", "--engine", "stacked", "--time-budget", "10m",
                    "--margin-s", "200", "--no-figures", "--out", str(out), "--pack", str(packed)])
    assert code == 0
    report = json.loads((out / "gpu_study.json").read_text())
    assert report["run"]["status"] == "passed" and report["report"]["status"] == "passed"
    assert report["planned"] == {"tiny-smoke": 4, "tiny-smoke-tune": 4}
    assert {name: c["complete"] for name, c in report["studies"].items()} == {"tiny-smoke": 4, "tiny-smoke-tune": 4}
    assert report["studies"]["tiny-smoke"]["engines"] == {"stacked 2": 4}  # each cell's two seeds, as one stack
    assert report["studies"]["tiny-smoke-tune"]["engines"] == {"stacked 2": 4}  # each cell's two learning rates
    assert report["images_per_s"] > 0 and report["wall_s"] <= 600
    assert report["runs_csv"] == f"written: {out / 'tiny-smoke' / 'runs.csv'}"  # before the report, from the storage
    files = sorted(p.name for p in packed.iterdir())
    assert files == ["gpu_study.json", "gpu_study.md", "runs.csv", "study.tar.gz"]
    rows = list(csv.DictReader(io.StringIO((packed / "runs.csv").read_text())))
    assert len(rows) == 8 and {r["phase"] for r in rows} == {"tune", "report"}
    with tarfile.open(packed / "study.tar.gz") as tar:
        names = tar.getnames()
    assert "optuna.db" in names and "tiny-smoke/runs.csv" in names and "logs/run.log" in names
    assert not any("events.out.tfevents" in n for n in names)
    assert "4 of 4" in (out / "gpu_study.md").read_text()


def test_the_run_is_stopped_at_its_deadline(tmp_path):
    """A run that would outlive its deadline gets SIGTERM there (a study stops cleanly on it), SIGKILL after the
    grace if it ignores it."""
    start = time.monotonic()
    code, stopped = gs.run_until([sys.executable, "-c", "import time; time.sleep(60)"], start + 2,
                                 tmp_path / "log", grace_s=5)
    assert stopped and code == -15 and time.monotonic() - start < 20
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    start = time.monotonic()
    code, stopped = gs.run_until([sys.executable, "-c", stubborn], start + 2, tmp_path / "log", grace_s=1)
    assert stopped and code == -9 and time.monotonic() - start < 20
    code, stopped = gs.run_until([sys.executable, "-c", "pass"], time.monotonic() + 60, tmp_path / "log")
    assert (code, stopped) == (0, False)
    code, stopped = gs.run_until([sys.executable, "-c", "raise SystemExit(3)"], gs.math.inf, tmp_path / "log")
    assert (code, stopped) == (3, False)  # no budget: no deadline


def test_bad_input_is_one_line(tmp_path, capsys):

    with pytest.raises(SystemExit) as exit_:
        gs.main(["--study", "residual_variants", "--device", "cpu", "--time-budget", "50", "--margin-s", "45"])
    assert exit_.value.code == 2
    assert "--time-budget (50 s) must exceed --margin-s (45) + 10 s" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        gs.main(["--study", "residual_variants", "--device", "cpu", "--time-budget", "soon"])
    assert exit_.value.code == 2 and "'soon' is not a duration" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        gs.main(["--study", "no_such_study", "--device", "cpu", "--out", str(tmp_path)])
    assert exit_.value.code == 2 and "no_such_study" in capsys.readouterr().err


def test_the_run_continues_an_earlier_run_s_runs_csv(tmp_path):
    """``--import-runs`` reaches ablations.run: a run stopped at its deadline is continued by the next one."""
    import argparse

    args = argparse.Namespace(study="residual_variants", budget="gpu", device="cuda", engine="auto", workers=12,
                              stack=20, sets=["max_epochs=120"], data_dir="/d", import_runs=tmp_path / "runs.csv")
    command = gs.run_command(args, tmp_path)
    assert command[command.index("--import-runs") + 1] == str(tmp_path / "runs.csv")
    assert command[command.index("--data-dir") + 1] == "/d" and command[command.index("--set") + 1] == "max_epochs=120"
    assert "--import-runs" not in gs.run_command(argparse.Namespace(**{**vars(args), "import_runs": None}), tmp_path)
