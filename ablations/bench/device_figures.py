"""The device check's stage records (``StageResult``) and how it reads each stage's figures: the pytest counts of
the CUDA tests, the benchmark's ratios and rates, the training run's summary. ``scripts/device_check.py`` runs the
stages and writes ``device_check.json``."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_SECTIONS = ("timm", "variants", "mfu", "data", "overhead")  # the benchmark sections the check runs

@dataclass
class StageResult:
    """One stage's record in ``device_check.json``."""

    status: str  # passed | failed | timeout
    seconds: float
    timeout_s: float
    returncode: int | None
    command: str
    log: str
    error: str | None = None
    figures: dict = field(default_factory=dict)



# --- reading each stage's figures -----------------------------------------------------------------------------------
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed|warnings?)\b")


def pytest_counts(text: str) -> dict[str, int]:
    """The counts of pytest's last summary line (``1 passed, 2 skipped, 700 deselected in 9.1s``)."""
    summary = next((ln for ln in reversed(text.splitlines()) if PYTEST_COUNT.search(ln) and " in " in ln), "")
    counts = {"passed": 0, "skipped": 0, "failed": 0, "errors": 0, "deselected": 0}
    for number, word in PYTEST_COUNT.findall(summary):
        key = {"error": "errors", "warning": "warnings"}.get(word, word)
        counts[key] = counts.get(key, 0) + int(number)
    return counts


def read_cuda_tests(result: StageResult, out: Path, device: str) -> None:
    """Counts from the log. The stage fails on a failed test, an error (collection errors included), no test marked
    cuda at all, a CUDA test skipped on ``--device cuda``, or a non-zero exit status."""
    counts = pytest_counts((out / result.log).read_text(errors="replace"))
    result.figures = counts
    if result.status == "timeout":
        return
    problems = []
    if counts["failed"] or counts["errors"]:
        problems.append(f"{counts['failed']} failed, {counts['errors']} error(s) (collection errors included)")
    if not counts["passed"] and not counts["skipped"] and not counts["failed"]:
        problems.append("no test marked cuda ran")
    if device == "cuda" and counts["skipped"]:
        problems.append(f"{counts['skipped']} CUDA test(s) skipped on a CUDA device")
    if result.error:
        problems.append(result.error)
    result.status = "failed" if problems else "passed"
    result.error = "; ".join(problems) or None


def read_bench(result: StageResult, bench_out: Path) -> None:
    """Key figures of ``bench.json``; a missing section or a section error fails the stage."""
    path = bench_out / "bench.json"
    if not path.is_file():
        result.status = "failed" if result.status == "passed" else result.status
        result.error = result.error or f"no {path}"
        return
    report = json.loads(path.read_text())
    result.figures = bench_figures(report)
    missing = [s for s in BENCH_SECTIONS if s not in report.get("sections", {})]
    errors = result.figures["section_errors"]
    if result.status == "passed" and (missing or errors):
        result.status = "failed"
        result.error = "; ".join([f"sections not run: {', '.join(missing)}"] * bool(missing)
                                 + [f"{name}: {error}" for name, error in errors.items()])


def bench_figures(report: dict) -> dict:
    """The check's figures from a benchmark report: ours/timm, each DCA label vs standard, MFU, images/s, the
    depth-aggregation and multi-stream designs vs standard (section 11: the median ratio and its goal), goals."""
    sections = report.get("sections", {})
    figures: dict[str, Any] = {}
    timm = sections.get("timm") or {}
    figures["ours_vs_timm"] = next((g["value"] for g in timm.get("goals", []) if g["what"] == "ours standard / timm"),
                                   None)
    variants = ((sections.get("variants") or {}).get("data") or {}).get("variants") or {}
    figures["step_time_vs_standard"] = {label: row.get("time_ratio") for label, row in variants.items()
                                        if label != "standard"}
    mfu = (sections.get("mfu") or {}).get("data") or {}
    figures |= {key: mfu.get(key) for key in ("mfu", "step_flops_per_s", "peak_flops_per_s")}
    figures["data_images_per_s"] = _rates((sections.get("data") or {}).get("data") or {})
    overhead = sections.get("overhead") or {}
    figures["overhead_vs_standard"] = {g["what"].removesuffix(" / standard"): {"ratio": g["value"], "limit": g["limit"]}
                                       for g in overhead.get("goals", [])}
    goals = [g for s in sections.values() for g in s.get("goals", [])]
    figures["goals_met"] = f"{sum(bool(g['passed']) for g in goals)}/{len(goals)}"
    figures["section_errors"] = {name: s["error"] for name, s in sections.items() if s.get("error")}
    return figures


def _rates(data: dict, prefix: str = "", depth: int = 0, inside: bool = False) -> dict[str, float]:
    """Every number under a key containing ``per_s`` (images/s and the like; a list of rounds: its median), nested
    keys joined with '/'."""
    found: dict[str, float] = {}
    for key, value in data.items():
        name, rate = f"{prefix}{key}", inside or "per_s" in str(key)
        if isinstance(value, dict) and depth < 3:
            found |= _rates(value, f"{name}/", depth + 1, rate)
        elif rate and _is_number(value):
            found[name] = value
        elif rate and isinstance(value, list) and value and all(map(_is_number, value)):
            found[name] = statistics.median(value)
    return found


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


TRAIN_FIGURES = ("train_images_per_s", "wall_time_s", "time_per_epoch_s", "best_val_acc", "final_val_acc",
                 "epochs_completed", "diverged", "param_count")


def read_train(result: StageResult, out: Path) -> None:
    """The run's summary figures (``train_summary.json``, written by :func:`train_stage`); a diverged run fails.
    A run killed at its limit has no summary: its last progress record (``train_progress.json``) is reported."""
    path = out / "train_summary.json"
    if not path.is_file():
        progress = out / "train_progress.json"
        if progress.is_file():
            result.figures = {"progress": json.loads(progress.read_text())}
            p = result.figures["progress"]
            result.error = (f"{result.error}; " if result.error else "") + (
                f"by then: epoch {p['epoch']}, {p['images']:,} training images in {p['elapsed_s']:.0f} s "
                f"({p['images_per_s']:,.0f} images/s)")
        result.status = "failed" if result.status == "passed" else result.status
        result.error = result.error or f"no {path.name}"
        return
    result.figures = json.loads(path.read_text())
    if result.status == "passed" and result.figures.get("diverged"):
        result.status, result.error = "failed", "the run diverged (a non-finite loss)"
