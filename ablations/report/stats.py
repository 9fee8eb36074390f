"""The statistics of the main table: per cell mean ± sample sd over seeds, and the paired comparison with the
baseline variant at the same depth (and the same extra grid axes).

Studies use common random numbers: with the same seed every variant gets the same initial weights, data split,
batch order and augmentation, so a variant and the baseline are compared *paired by seed*: d_s = acc(variant, s)
− acc(baseline, s) over the seeds where both have an ok result (completed, not diverged, finite accuracy).

* Δ = mean d, its 95% confidence interval mean ± t_{0.975, n−1} · s_d / √n;
* the paired two-sided t-test (``scipy.stats.ttest_rel``) and, as a check that needs no normality, the Wilcoxon
  signed-rank test (``scipy.stats.wilcoxon``, two-sided, scipy's exact distribution when it chooses it);
* Holm–Bonferroni over the table's family of comparisons (every non-baseline cell with a p-value), separately
  for the t and the Wilcoxon p-values; a cell is significant when its Holm-adjusted t p < α;
* MDE = (t_{1−α'/2, n−1} + t_{power, n−1}) · s_d / √n, the smallest true mean difference the paired t-test at the
  Bonferroni level α' = α/m (the first, strictest step of Holm) detects with the given power.

A test is undefined (None) with fewer than 2 pairs or when all paired differences are equal (s_d = 0: t = ±∞);
the Wilcoxon test also when every difference is zero.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

from .load import BASELINE, StudyData

ALPHA = 0.05  # family-wise significance level (Holm–Bonferroni over the table)
POWER = 0.8  # power of the minimum detectable effect
CONFIDENCE = 0.95  # of the paired-difference interval
ZERO_SD = 1e-12  # paired differences whose sample sd is below this are "all equal" (accuracies are fractions)


@dataclass
class Paired:
    """The paired comparison of one cell with the baseline (differences in accuracy fractions)."""

    n: int  # pairs (seeds ok on both sides)
    delta: float | None = None  # mean difference
    sd: float | None = None  # sample sd of the differences (ddof=1), n >= 2
    ci_low: float | None = None
    ci_high: float | None = None
    p_t: float | None = None  # paired two-sided t-test
    p_wilcoxon: float | None = None  # Wilcoxon signed-rank, two-sided


def paired(diffs: Sequence[float], confidence: float = CONFIDENCE) -> Paired:
    """Δ, s_d, the t-based CI, the paired t-test p and the Wilcoxon p of paired differences ``diffs``."""
    import numpy as np
    from scipy import stats

    d = np.asarray(list(diffs), dtype=float)
    result = Paired(n=len(d))
    if result.n == 0:
        return result
    result.delta = float(d.mean())
    if result.n < 2:
        return result
    result.sd = float(d.std(ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, result.n - 1)) * result.sd / math.sqrt(result.n)
    result.ci_low, result.ci_high = result.delta - half, result.delta + half
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        if result.sd > ZERO_SD:
            result.p_t = _finite_or_none(stats.ttest_rel(d, np.zeros_like(d)).pvalue)
        if np.any(d != 0):
            result.p_wilcoxon = _finite_or_none(stats.wilcoxon(d, alternative="two-sided").pvalue)
    return result


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm–Bonferroni adjusted p-values (None stays None and is not counted in the family): with the m p-values
    sorted ascending, p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j))."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(order)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def mde(sd: float | None, n: int, alpha: float, power: float = POWER) -> float | None:
    """Minimum detectable effect of a paired two-sided t-test at level ``alpha`` with ``power``:
    (t_{1−α/2, n−1} + t_{power, n−1}) · s_d / √n; None without a defined test (n < 2 or s_d = 0)."""
    if n < 2 or sd is None or sd <= ZERO_SD:
        return None
    from scipy import stats

    return float((stats.t.ppf(1 - alpha / 2, n - 1) + stats.t.ppf(power, n - 1)) * sd / math.sqrt(n))


@dataclass
class Cell:
    """One row × depth cell of the main table."""

    row: str
    depth: int | None
    values: list[float]  # accuracies (fractions) of the ok runs, by seed
    seeds: list[int | None]
    n_runs: int = 0  # result trials in the cell (ok, diverged, failed/pruned)
    n_diverged: int = 0
    n_failed: int = 0  # failed or pruned (no result) + completed without an accuracy
    mean: float | None = None
    std: float | None = None  # sample std (ddof=1), only for n >= 2
    baseline: bool = False  # the baseline variant's cell (no comparison)
    comparison: Paired | None = None  # vs the baseline cell; None for the baseline or without a baseline cell
    pair_seeds: list[int] = field(default_factory=list)
    p_t_holm: float | None = None
    p_wilcoxon_holm: float | None = None
    mde: float | None = None
    significant: bool = False  # Holm-adjusted paired t p < alpha
    best: bool = False

    @property
    def n(self) -> int:
        return len(self.values)


def main_cells(data: StudyData, baseline: str = BASELINE, alpha: float = ALPHA, power: float = POWER) -> list[Cell]:
    """Row × depth cells: mean ± sample sd of best_val_acc over the ok runs (seeds), the paired comparison with
    the baseline's cell (same depth, same extra axes), Holm over the table, MDE at α/m; best mean per depth."""
    import numpy as np

    cells = []
    for row in data.rows:
        for depth in data.depths or [None]:
            runs = data.by_row_depth(row, depth)
            ok = [r for r in runs if r.ok]
            cell = Cell(row=row, depth=depth, values=[float(r.acc) for r in ok], seeds=[r.seed for r in ok],
                        n_runs=len(runs), n_diverged=sum(1 for r in runs if r.diverged),
                        n_failed=sum(1 for r in runs if not r.ok and not r.diverged),
                        baseline=data.row_variant.get(row) == baseline)
            if cell.n:
                cell.mean = float(np.mean(cell.values))
                cell.std = float(np.std(cell.values, ddof=1)) if cell.n >= 2 else None
            cells.append(cell)
    by_key = {(c.row, c.depth): c for c in cells}
    for c in cells:
        base_row = None if c.baseline else data.baseline_row(c.row, baseline)
        base = by_key.get((base_row, c.depth)) if base_row is not None else None
        if base is None:
            continue
        own, ref = _by_seed(c), _by_seed(base)
        c.pair_seeds = sorted(set(own) & set(ref))
        c.comparison = paired([own[s] - ref[s] for s in c.pair_seeds])
    compared = [c for c in cells if c.comparison is not None]
    for c, p in zip(compared, holm([c.comparison.p_t for c in compared]), strict=True):
        c.p_t_holm = p
        c.significant = p is not None and p < alpha
    for c, p in zip(compared, holm([c.comparison.p_wilcoxon for c in compared]), strict=True):
        c.p_wilcoxon_holm = p
    m = family_size(cells)
    for c in compared:
        c.mde = mde(c.comparison.sd, c.comparison.n, alpha / max(1, m), power)
    for depth in data.depths or [None]:
        column = [c for c in cells if c.depth == depth and c.mean is not None]
        if column:
            top = max(c.mean for c in column)
            for c in column:
                c.best = math.isclose(c.mean, top, rel_tol=0.0, abs_tol=1e-12)
    return cells


def family_size(cells: Sequence[Cell]) -> int:
    """m: the comparisons with a paired t p-value (the Holm family of the table)."""
    return sum(1 for c in cells if c.comparison is not None and c.comparison.p_t is not None)


def _by_seed(cell: Cell) -> dict[int, float]:
    """seed -> accuracy of the cell's ok runs (the first run of a seed; runs without a seed cannot be paired)."""
    out: dict[int, float] = {}
    for seed, value in zip(cell.seeds, cell.values, strict=True):
        if seed is not None:
            out.setdefault(seed, value)
    return out


def _finite_or_none(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
