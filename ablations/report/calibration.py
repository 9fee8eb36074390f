"""Calibration: the baseline's test accuracy beside published numbers for the same data.

A study on a benchmark with published results (:data:`PUBLISHED`) gets ``calibration.md`` (and ``.tex``/``.csv``):
``standard``'s mean test accuracy per depth, with its 95 % t-interval over the reported seeds and its parameter
count, above published small-model accuracies on the same official test set, so that a reader can see the baseline
is not broken (or that it is). The published rows are the dataset paper's and its repository's, each with its source;
none is a number this suite measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from .aggregate import band
from .format import Column, Table, frame
from .load import BASELINE, StudyData


@dataclass(frozen=True)
class Published:
    """One published test accuracy (fraction) on a dataset's official test set."""

    model: str
    params: str  # as its source states it ("" when it does not)
    augmentation: str  # as its source states it ("" when it does not)
    test_acc: float
    source: str


_PAPER = "Xiao et al. 2017, arXiv:1708.07747v2, Table 3 (scikit-learn, mean of 5 runs)"
_REPO = "zalandoresearch/fashion-mnist README, Benchmark table (submitted, untested by the authors)"

#: dataset name (``--dataset``) -> published accuracies on its official test set, lowest first
PUBLISHED: dict[str, tuple[Published, ...]] = {
    "fashion_mnist": (
        Published("human (majority of 3 non-expert labels, 1,000 test images)", "", "", 0.835,
                  "zalandoresearch/fashion-mnist README, Human Performance"),
        Published("logistic regression (C=1, one-vs-rest, L1)", "", "", 0.842, _PAPER),
        Published("k-nearest neighbours (k=5, distance-weighted, p=1)", "", "", 0.854, _PAPER),
        Published("MLP (one hidden layer of 100, ReLU)", "", "", 0.871, _PAPER),
        Published("random forest (100 trees, entropy, depth 100)", "", "", 0.873, _PAPER),
        Published("MLP 256-128-100", "", "none", 0.8833, _REPO),
        Published("SVC (RBF kernel, C=10)", "", "", 0.897, _PAPER),
        Published("2 conv + pooling", "", "none", 0.916, _REPO),
        Published("3 conv + BN + pooling", "", "none", 0.921, _REPO),
        Published("2 conv", "~113K", "normalisation", 0.922, _REPO),
        Published("2 conv", "<100K", "none", 0.925, _REPO),
        Published("Capsule network", "8M", "shifts of at most 2 px, horizontal flips", 0.936, _REPO),
        Published("ResNet18", "", "flips, translation, rotation", 0.949, _REPO),
        Published("WRN-28-10 + random erasing", "", "crops, flips, random erasing", 0.963, _REPO),
    ),
}

KEYS = ["model", "params", "augmentation", "test_acc", "lower", "upper", "n", "source"]


def calibration_table(data: StudyData, dataset: str | None) -> Table | None:
    """The calibration table of a study on ``dataset`` (None when no published numbers are kept for it or the study
    has no completed ``standard`` run with a test accuracy)."""
    published = PUBLISHED.get(dataset or "")
    if not published:
        return None
    ours, epochs = [], data.config_value("max_epochs")
    for row in data.rows:
        if data.row_variant.get(row) != BASELINE:
            continue
        for depth in data.depths or [None]:
            runs = [r for r in data.by_row_depth(row, depth) if r.ok and r.summary.get("test_acc") is not None]
            result = band(r.summary["test_acc"] for r in runs)
            if result is None:
                continue
            params = {r.summary.get("param_count") for r in runs} - {None}
            ours.append({
                "model": f"this study: {row}" + (f", depth {depth}" if depth is not None else "")
                         + (f", {epochs} epochs" if epochs else ""),
                "params": f"{params.pop():,}" if len(params) == 1 else "",
                "augmentation": "the study's",
                "test_acc": result.mean, "lower": result.lower if result.n > 1 else None,
                "upper": result.upper if result.n > 1 else None, "n": result.n, "source": "runs.csv"})
    if not ours:
        return None
    records = ours + [{"model": p.model, "params": p.params, "augmentation": p.augmentation, "test_acc": p.test_acc,
                       "lower": None, "upper": None, "n": None, "source": p.source} for p in published]

    def interval(rec, style):
        if rec["lower"] is None:
            return ""
        return f"[{100 * rec['lower']:.2f}, {100 * rec['upper']:.2f}]"

    columns = [Column("model", "model", align="l"), Column("params", "parameters"),
               Column("augmentation", "augmentation", align="l"),
               Column("test_acc", "test acc. (%)", fmt=".2f", scale=100.0),
               Column("lower", "95% CI", render=interval), Column("n", "n", render=lambda rec, style: (
                   "" if rec["n"] is None else str(rec["n"]))),
               Column("source", "source", align="l")]
    caption = (f"Calibration of study {data.name} on {dataset}: the baseline's test accuracy on the official test set "
               "(mean over the reported seeds, 95% t-interval) beside published accuracies on the same test set. "
               "The published rows were trained on all the training images (this study keeps a validation share "
               "apart) with their own recipes; they are other people's numbers, quoted from their sources, not "
               "reproduced here.")
    fmts = {"test_acc": ".6f", "lower": ".6f", "upper": ".6f"}
    return Table("calibration", f"{data.name}: calibration against published {dataset} results", caption,
                 frame(records, KEYS), columns, [(k, k, fmts.get(k, "")) for k in KEYS], index="model")
