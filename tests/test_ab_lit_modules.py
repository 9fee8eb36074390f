"""scripts/ab_lit_modules.py: two checkouts' lit_modules side by side in one process, each variant's train step
timed against the other's and against standard."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "ab_lit_modules.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_another_checkout_is_timed_with_its_own_classes(tmp_path):
    """The baseline is a copy of this checkout's lit_modules in another folder: each model is built from its own
    copy's classes (the package loads lazily, so a baseline touched late would silently be this checkout)."""
    shutil.copytree(ROOT / "lit_modules", tmp_path / "lit_modules", ignore=shutil.ignore_patterns("__pycache__"))
    done = run(str(tmp_path), "--variants", "mhc,rezero", "--quick")
    assert done.returncode == 0, done.stderr
    for name in ("mhc", "rezero"):
        assert (f"{name}: old {tmp_path / 'lit_modules' / 'residual' / name}.py, "
                f"new {ROOT / 'lit_modules' / 'residual' / name}.py") in done.stdout, done.stdout
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
