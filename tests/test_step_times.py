"""scripts/step_times.py: every row of a study timed against its standard row at the study's size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import write_study

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "step_times.py"


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.mark.slow
def test_a_study_s_rows_are_timed_against_standard_at_its_size(tmp_path):
    rows = [{"label": "standard", "residual": "standard"}, {"label": "gpas", "residual": "gpas"},
            {"label": "gated", "residual": "standard", "overrides": {"attention_gate": "elementwise"}}]
    study = write_study(tmp_path / "tiny.yaml", variants=rows, base={"embed_dim": 16, "batch_size": 4, "depth": 2})
    done = run("--study", str(study), "--rounds", "2", "--steps", "1", "--attention", "explicit", "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    timed = {r["row"]: r for r in report["rows"]}
    assert list(timed) == ["standard", "gpas", "gated"]
    assert timed["standard"]["time_ratios"] == [1.0, 1.0] and all(r["ms_per_step"] > 0 for r in timed.values())
    assert timed["gpas"]["params"] == timed["standard"]["params"] + 2  # one gate per block, depth 2
    assert timed["gated"]["params"] == timed["standard"]["params"] + 2 * (16 * 16 + 16)  # W_g, b_g per block
    assert "width 16" in report["meta"]["size"] and "batch 4" in report["meta"]["size"]
    assert report["meta"]["attention"] == "explicit"


def test_a_study_without_a_standard_row_is_one_line(tmp_path):
    study = write_study(tmp_path / "nostd.yaml", variants=[{"label": "gpas", "residual": "gpas"}])
    done = run("--study", str(study), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "error: study 'nostd' has no 'standard' row to time the others against"
