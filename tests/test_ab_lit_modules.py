"""scripts/ab_lit_modules.py: two checkouts' lit_modules side by side in one process, each variant's train step
timed against the other's and against standard."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "ab_lit_modules.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_the_same_checkout_against_itself_times_both_copies(tmp_path):
    done = run(str(ROOT), "--variants", "mhc,rezero", "--quick")
    assert done.returncode == 0, done.stderr
    rows = dict(re.findall(r"^(\S+(?: old| new)?)\s+([\d.]+) ms\s+vs standard", done.stdout, re.M))
    assert set(rows) == {"standard", "mhc old", "mhc new", "rezero old", "rezero new"}
    assert all(float(ms) > 0 for ms in rows.values())
    ratios = dict(re.findall(r"^(\w+) new/old ([\d.]+)x", done.stdout, re.M))
    assert set(ratios) == {"mhc", "rezero"} and all(0.1 < float(r) < 10 for r in ratios.values())


def test_a_checkout_of_another_project_or_an_unknown_variant_is_one_line(tmp_path):
    done = run(str(tmp_path), "--quick")
    assert done.returncode == 2 and "has no lit_modules/ folder" in done.stderr
    assert "Traceback" not in done.stderr
    done = run(str(ROOT), "--variants", "nope", "--quick")
    assert done.returncode == 2 and "unknown residual(s) nope; valid choices" in done.stderr and "mhc" in done.stderr
    assert "Traceback" not in done.stderr
