"""scripts/epoch_curves.py: runs' --json summaries into one CSV of accuracy by epoch, with each 5-epoch window's rise."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "epoch_curves.py"
spec = importlib.util.spec_from_file_location("epoch_curves", SCRIPT)
epoch_curves = importlib.util.module_from_spec(spec)
spec.loader.exec_module(epoch_curves)


def summary(run_name: str, val: list[float], test: list[float]) -> str:
    best = max(range(len(val)), key=lambda i: val[i])
    return json.dumps({"run_name": run_name, "val_acc_curve": val, "test_acc_curve": test,
                       "train_loss_curve": [1.0] * len(val), "best_val_acc": val[best], "best_epoch": best + 1})


def test_rise_is_the_least_squares_line_over_five_epochs():
    linear = [0.5 + 0.01 * e for e in range(8)]
    assert epoch_curves.rise(linear, 4) is None  # no full window yet
    assert epoch_curves.rise(linear, 5) == pytest.approx(4.0)  # 1 pp per epoch over 4 steps
    # 0.8, 0.9, 0.9, 0.9, 0.9: slope 0.02 per epoch (covariance 0.2 / variance 10), 4 steps -> 8 pp; the endpoints
    # alone would say 10 pp
    assert epoch_curves.rise([0.7, 0.8, 0.9, 0.9, 0.9, 0.9], 6) == pytest.approx(8.0)
    plateau = [0.5, 0.6, 0.7, 0.8, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]
    assert epoch_curves.settled(plateau, 0.2) == 9  # the first window of five equal values ends at epoch 9
    assert epoch_curves.settled(linear, 0.2) is None


def test_the_csv_and_the_printed_lines(tmp_path, capsys):
    rising = [0.5 + 0.01 * e for e in range(6)]
    (tmp_path / "a.json").write_text("progress line\n" + summary("standard_d4_w64_x_s100_1", rising, [0.4] * 6) + "\n")
    (tmp_path / "b.json").write_text(summary("standard_d12_w64_x_s100_2", [0.9] * 5, [0.8] * 5))
    out = tmp_path / "curves.csv"
    assert epoch_curves.main([str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [(r["depth"], r["max_epochs"], r["epoch"]) for r in rows] == (
        [("4", "6", str(e)) for e in range(1, 7)] + [("12", "5", str(e)) for e in range(1, 6)])
    assert [r["val_rise_5ep_pp"] for r in rows[:6]] == ["", "", "", "", "4.00", "4.00"]
    assert rows[5]["test_rise_5ep_pp"] == "0.00" and rows[5]["val_acc"] == "0.5500"
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("depth 4, 6-epoch schedule: final val 0.5500 test 0.4000, best val 0.5500 at epoch 6")
    assert printed[0].endswith("from epoch: val None, test 5")
    assert printed[1].endswith("from epoch: val 5, test 5")


def test_a_file_that_is_not_a_summary_is_one_line(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("not json\n")
    with pytest.raises(SystemExit) as excinfo:
        epoch_curves.main([str(tmp_path / "bad.json"), "--out", str(tmp_path / "c.csv")])
    assert excinfo.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {tmp_path / 'bad.json'}: not a run's --json summary (JSONDecodeError)"]
    assert not (tmp_path / "c.csv").exists()
