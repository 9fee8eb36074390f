"""Accuracy by epoch of ``python -m ablations.train --json`` runs as one CSV, and how much each curve still rises.

    python scripts/epoch_curves.py results/pilots/fashion_mnist/*.json --out results/pilots/fashion_mnist/curves.csv

Each input file holds one run's ``--json`` summary (its last line is read). The CSV has one row per run and epoch:
depth (from the run name), the schedule's length, the epoch, val and test accuracy, train loss, and
``val_rise_5ep_pp`` / ``test_rise_5ep_pp``: the least-squares rise, in percentage points, over the 5 epochs ending
at that epoch (the line through those 5 values, from its first epoch to its last: one noisy epoch moves it less than
it moves the endpoints). Printed per run: its final and best accuracy and the first epoch from which every later
5-epoch window rises by less than ``--threshold`` pp (none: the curve was still moving at its end).
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WINDOW = 5


def rise(values: list[float], end: int) -> float | None:
    """Least-squares rise (pp) over the WINDOW epochs ending at 1-based epoch ``end``; None before a full window."""
    if end < WINDOW:
        return None
    y = 100 * np.asarray(values[end - WINDOW:end], dtype=np.float64)
    return float(np.polyfit(np.arange(WINDOW), y, 1)[0] * (WINDOW - 1))


def settled(values: list[float], threshold: float) -> int | None:
    """The first epoch E such that every window ending at E or later rises by less than ``threshold`` pp."""
    rises = [rise(values, e) for e in range(1, len(values) + 1)]
    for e in range(WINDOW, len(values) + 1):
        if all(abs(r) < threshold for r in rises[e - 1:]):
            return e
    return None


def read_summary(path: Path) -> dict:
    """One run's summary, checked for what the curves need; ValueError in one line."""
    try:
        lines = path.read_text().strip().splitlines()
        summary = json.loads(lines[-1]) if lines else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a run's --json summary ({type(exc).__name__})") from None
    keys = ("run_name", "val_acc_curve", "test_acc_curve", "train_loss_curve", "best_val_acc", "best_epoch")
    if not isinstance(summary, dict) or any(k not in summary for k in keys):
        raise ValueError(f"{path}: not a run's --json summary (needs {', '.join(keys)})")
    if not re.search(r"_d\d+_", summary["run_name"]):
        raise ValueError(f"{path}: run name {summary['run_name']!r} does not say its depth (_d<N>_)")
    if any(v is None for v in summary["val_acc_curve"] + summary["test_acc_curve"] + summary["train_loss_curve"]):
        raise ValueError(f"{path}: the run has epochs without a measurement (diverged or stopped early)")
    return summary


def curve_rows(summary: dict) -> list[dict]:
    depth = int(re.search(r"_d(\d+)_", summary["run_name"]).group(1))
    val, test, loss = summary["val_acc_curve"], summary["test_acc_curve"], summary["train_loss_curve"]
    rows = []
    for e in range(1, len(val) + 1):
        rv, rt = rise(val, e), rise(test, e)
        rows.append({"depth": depth, "max_epochs": len(val), "epoch": e, "val_acc": f"{val[e - 1]:.4f}",
                     "test_acc": f"{test[e - 1]:.4f}", "train_loss": f"{loss[e - 1]:.4f}",
                     "val_rise_5ep_pp": _pp(rv), "test_rise_5ep_pp": _pp(rt)})
    return rows


def _pp(value: float | None) -> str:
    return "" if value is None else f"{round(value, 2) + 0.0:.2f}"  # + 0.0: no "-0.00"


def main(argv: list[str] | None = None) -> int:
    from ablations.cli import OneLineParser, fail

    parser = OneLineParser(prog="python scripts/epoch_curves.py", description=__doc__.splitlines()[0])
    parser.add_argument("summaries", nargs="+", type=Path, help="files holding one run's --json summary each")
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write")
    parser.add_argument("--threshold", type=float, default=0.2, help="pp per 5-epoch window (default 0.2)")
    args = parser.parse_args(argv)
    try:
        summaries = [read_summary(path) for path in args.summaries]
    except ValueError as exc:
        fail(str(exc))
    rows = []
    for s in summaries:
        part = curve_rows(s)
        rows += part
        val, test = s["val_acc_curve"], s["test_acc_curve"]
        print(f"depth {part[0]['depth']}, {len(val)}-epoch schedule: final val {val[-1]:.4f} test {test[-1]:.4f}, "
              f"best val {s['best_val_acc']:.4f} at epoch {s['best_epoch']}; every later 5-epoch window below "
              f"{args.threshold:g} pp from epoch: val {settled(val, args.threshold)}, "
              f"test {settled(test, args.threshold)}")
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
