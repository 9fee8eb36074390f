"""The calibration table: the baseline's test accuracy beside published numbers for the same benchmark."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from ablations import report
from ablations.report.calibration import PUBLISHED
from ablations.report.cli import build_tables
from ablations.report.load import assemble
from ablations.studies.spec import _build

YAML = """\
name: calib
kind: grid
metric: test_acc
direction: maximize
base: {dataset: DATASET, max_epochs: 2}
variants:
  - {label: standard, residual: standard}
  - {label: layerscale, residual: layerscale}
axes: {depth: [2], seed: [0, 1, 2]}
"""


def load_spec_from_text(text: str):
    import yaml

    return _build(yaml.safe_load(text), "default", "x.yaml")


def _runs():
    accs = {"standard": (0.88, 0.90, 0.92), "layerscale": (0.5, 0.6, 0.7)}
    return [report.Run(number=3 * i + seed, state="complete", variant=variant, depth=2, seed=seed, row=variant,
                       acc=acc, config={"lr": 0.004, "max_epochs": 60},
                       summary={"test_acc": acc, "best_val_acc": acc, "param_count": 1234})
            for i, (variant, values) in enumerate(accs.items()) for seed, acc in enumerate(values)]


def test_a_fashion_mnist_study_gets_the_baseline_beside_the_published_numbers():
    spec = load_spec_from_text(YAML.replace("DATASET", "fashion_mnist"))
    tables, _, _ = build_tables(assemble("calib", spec, _runs()), spec)
    table = next(t for t in tables if t.name == "calibration")
    rows = table.frame.to_dict("records")
    ours = rows[0]
    half = stats.t.ppf(0.975, 2) * 0.02 / math.sqrt(3)  # sd of (0.88, 0.90, 0.92) is 0.02
    assert ours["model"] == "this study: standard, depth 2, 60 epochs" and ours["params"] == "1,234"
    assert ours["test_acc"] == pytest.approx(0.90) and ours["n"] == 3
    assert (ours["lower"], ours["upper"]) == (pytest.approx(0.90 - half), pytest.approx(0.90 + half))
    assert [r["model"] for r in rows[1:]] == [p.model for p in PUBLISHED["fashion_mnist"]]  # layerscale is not in it
    md = table.markdown()
    assert f"[{100 * (0.9 - half):.2f}, {100 * (0.9 + half):.2f}]" in md
    assert "| SVC (RBF kernel, C=10)" in md and "89.70" in md and "arXiv:1708.07747" in md
    assert all(ord(ch) < 128 for ch in table.latex("calibration"))


def test_a_dataset_without_published_numbers_gets_no_calibration_table():
    spec = load_spec_from_text(YAML.replace("DATASET", "synthetic"))
    tables, _, _ = build_tables(assemble("calib", spec, _runs()), spec)
    assert "calibration" not in [t.name for t in tables]
