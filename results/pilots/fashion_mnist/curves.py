"""Turn the pilot's ``python -m ablations.train --json`` summaries into curves.csv and print, per run, how much the
val and test accuracy still rise over each 5-epoch window (least-squares rise over the window's 5 epochs, in
percentage points: robust to one noisy epoch) and the first epoch from which every later window rises by less
than the threshold.

    python results/pilots/fashion_mnist/curves.py results/pilots/fashion_mnist/*.json \
        --out results/pilots/fashion_mnist/curves.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import re
from pathlib import Path

import numpy as np

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", nargs="+", type=Path, help="files holding one --json summary each")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threshold", type=float, default=0.2, help="pp per 5-epoch window")
    args = parser.parse_args()
    rows = []
    for path in args.summaries:
        s = json.loads(path.read_text().strip().splitlines()[-1])
        depth = int(re.search(r"_d(\d+)_", s["run_name"]).group(1))
        val, test, loss = s["val_acc_curve"], s["test_acc_curve"], s["train_loss_curve"]
        for e in range(1, len(val) + 1):
            rv, rt = rise(val, e), rise(test, e)
            rows.append({"depth": depth, "max_epochs": len(val), "epoch": e, "val_acc": f"{val[e - 1]:.4f}", "test_acc": f"{test[e - 1]:.4f}",
                         "train_loss": f"{loss[e - 1]:.4f}",
                         "val_rise_5ep_pp": "" if rv is None else f"{rv:.2f}",
                         "test_rise_5ep_pp": "" if rt is None else f"{rt:.2f}"})
        print(f"depth {depth}, {len(val)}-epoch schedule: {s['time_per_epoch_s']:.0f} s/epoch, final val {val[-1]:.4f} "
              f"test {test[-1]:.4f}, best val {s['best_val_acc']:.4f} at epoch {s['best_epoch']}; every later "
              f"5-epoch window below {args.threshold} pp from epoch: val {settled(val, args.threshold)}, "
              f"test {settled(test, args.threshold)}")
    with args.out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
