"""The statistics of the main table: per cell mean ± sample sd over seeds, and the paired comparison with the
baseline variant at the same depth (and the same extra grid axes).

Studies use common random numbers: with the same seed every variant gets the same initial weights, data split,
batch order and augmentation, so a variant and the baseline are compared *paired by seed*: d_s = acc(variant, s)
− acc(baseline, s) over the seeds where both have a result. A diverged run is kept in the pairs as a failure with
chance-level accuracy (1/num_classes: :func:`chance_level`), never dropped (dropping it would favour unstable
variants); runs without a result (failed, pruned, missing) drop their seed.

* Δ = mean d, its 95% confidence interval mean ± t_{0.975, n−1} · s_d / √n (unadjusted for multiplicity);
* the paired two-sided t-test (``scipy.stats.ttest_rel``) and, as a check that needs no normality, the Wilcoxon
  signed-rank test (``scipy.stats.wilcoxon``, two-sided). The exact Wilcoxon test's smallest two-sided p is
  2/2^n (n non-zero differences): at n ≤ 5 it cannot reach α = 0.05, and the tables say "n too small";
* one Holm–Bonferroni family per table: the comparisons with a defined t-test (m of them); the Wilcoxon p-values
  are adjusted over the same m comparisons. A cell is significant when its Holm-adjusted t p < α;
* MDE: the true mean difference δ at which the paired two-sided t-test at the Bonferroni level α' = α/m (Holm's
  first, strictest step) has the given power, from the noncentral t: P(|T| > t_{1−α'/2, n−1}) = power with
  T ~ t(n−1, noncentrality δ√n / s_d), solved for δ (``scipy.stats.nct``, ``scipy.optimize.brentq``).

A comparison whose n ≥ 2 paired differences are all equal (s_d = 0) has no interval, no test and no MDE: it is
shown as "all n differences equal: Δ = x, no interval" and never counts as significant. A test is undefined
(None) with fewer than 2 pairs as well.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

from .load import BASELINE, Run, StudyData, classes_of

ALPHA = 0.05  # family-wise significance level (Holm–Bonferroni over the table)
POWER = 0.8  # power of the minimum detectable effect
CONFIDENCE = 0.95  # of the paired-difference interval (unadjusted)
ZERO_SD = 1e-12  # paired differences whose sample sd is below this are "all equal" (accuracies are fractions)
DEFAULT_CHANCE = 0.1  # chance-level accuracy of a diverged run when its number of classes is not recorded


@dataclass
class Paired:
    """The paired comparison of one cell with the baseline (differences in accuracy fractions)."""

    n: int  # pairs (seeds with a result on both sides)
    delta: float | None = None  # mean difference
    sd: float | None = None  # sample sd of the differences (ddof=1), n >= 2
    ci_low: float | None = None  # unadjusted t interval; None when n < 2 or all differences are equal
    ci_high: float | None = None
    p_t: float | None = None  # paired two-sided t-test
    p_wilcoxon: float | None = None  # Wilcoxon signed-rank, two-sided
    n_nonzero: int = 0  # non-zero differences (the Wilcoxon test's n)
    boot_low: float | None = None  # two-level bootstrap interval (seeds x test images, :mod:`.bootstrap`)
    boot_high: float | None = None

    @property
    def all_equal(self) -> bool:
        """n ≥ 2 differences, all equal: no interval, no test, no MDE — never evidence."""
        return self.n >= 2 and self.sd is not None and self.sd <= ZERO_SD

    @property
    def wilcoxon_min_p(self) -> float | None:
        """The exact two-sided Wilcoxon test's smallest attainable p, 2 / 2^n (n non-zero differences)."""
        return 2.0 / 2 ** self.n_nonzero if self.n_nonzero else None

    @property
    def wilcoxon_too_small(self) -> bool:
        """The Wilcoxon test can never reject at α: 2 / 2^n ≥ α (n ≤ 5 at α = 0.05)."""
        return self.p_wilcoxon is not None and self.wilcoxon_min_p >= ALPHA


def paired(diffs: Sequence[float], confidence: float = CONFIDENCE) -> Paired:
    """Δ, s_d, the t-based CI, the paired t-test p and the Wilcoxon p of paired differences ``diffs``."""
    import numpy as np
    from scipy import stats

    d = np.asarray(list(diffs), dtype=float)
    result = Paired(n=len(d), n_nonzero=int(np.count_nonzero(d)))
    if result.n == 0:
        return result
    result.delta = float(d.mean())
    if result.n < 2:
        return result
    result.sd = float(d.std(ddof=1))
    if result.all_equal:
        return result
    half = float(stats.t.ppf(0.5 + confidence / 2, result.n - 1)) * result.sd / math.sqrt(result.n)
    result.ci_low, result.ci_high = result.delta - half, result.delta + half
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result.p_t = _finite_or_none(stats.ttest_rel(d, np.zeros_like(d)).pvalue)
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


def t_power(effect: float, sd: float, n: int, alpha: float) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` (n pairs, sd of the differences ``sd``) against a
    true mean difference ``effect``: P(|T| > t_{1−α/2, n−1}), T ~ noncentral t(n−1, effect·√n/sd)."""
    from scipy import stats

    df, nc = n - 1, effect * math.sqrt(n) / sd
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    upper, lower = float(stats.nct.sf(crit, df, nc)), float(stats.nct.cdf(-crit, df, nc))
    if not math.isfinite(upper):  # scipy's nct tail can be NaN far from the centre: the complement instead
        upper = 1.0 - float(stats.nct.cdf(crit, df, nc))
    return upper + (lower if math.isfinite(lower) else 0.0)


def mde(sd: float | None, n: int, alpha: float, power: float = POWER) -> float | None:
    """Minimum detectable effect of a paired two-sided t-test at level ``alpha`` with ``power``: the δ > 0 where
    :func:`t_power` = ``power`` (noncentral t, solved by brentq); None without a defined test (n < 2 or s_d = 0)."""
    if n < 2 or sd is None or sd <= ZERO_SD:
        return None
    from scipy import optimize, stats

    # the central-t approximation (t_{1−α/2} + t_power) · s_d / √n understates δ: bracket the root above it
    high = float(stats.t.ppf(1 - alpha / 2, n - 1) + stats.t.ppf(power, n - 1)) * sd / math.sqrt(n)
    while t_power(high, sd, n, alpha) < power:  # power grows with δ
        high *= 1.25
    return float(optimize.brentq(lambda e: t_power(e, sd, n, alpha) - power, 0.0, high, xtol=1e-14))


def num_classes(run: Run) -> int | None:
    """The run's number of classes as its summary or config recorded it (also inside ``dataset_options``)."""
    return classes_of(run)


def chance_level(run: Run) -> float:
    """Chance-level accuracy 1/num_classes of a run (:func:`num_classes`), else :data:`DEFAULT_CHANCE`: the
    value a diverged run counts with in the pairs."""
    classes = num_classes(run)
    return 1.0 / classes if classes else DEFAULT_CHANCE


def pair_value(run: Run) -> float | None:
    """A run's value in the paired differences: its accuracy when ok, chance level when it diverged or failed to
    train (below the study's floor), None (its seed drops out) when it has no result."""
    if run.ok:
        return float(run.acc)
    return chance_level(run) if run.at_chance else None


@dataclass
class Cell:
    """One row × depth cell of the main table."""

    row: str
    depth: int | None
    values: list[float]  # accuracies (fractions) of the ok runs, by seed
    seeds: list[int | None]
    n_runs: int = 0  # result trials in the cell (ok, diverged, failed to train, failed/pruned)
    n_diverged: int = 0
    n_failed_training: int = 0  # completed below the study's floor: at chance level in the pairs, like diverged
    n_failed: int = 0  # failed or pruned (no result) + completed without an accuracy
    mean: float | None = None
    std: float | None = None  # sample std (ddof=1), only for n >= 2
    baseline: bool = False  # the baseline variant's cell (no comparison)
    comparison: Paired | None = None  # vs the baseline cell; None for the baseline or without a baseline cell
    pair_seeds: list[int] = field(default_factory=list)
    pair_values: dict[int, float] = field(default_factory=dict)  # seed -> value in the pairs (diverged: chance)
    #: seed -> the run's per-image test results when they reproduce its value in the pairs (else absent); a run at
    #: chance level: its constant value
    pair_correct: dict = field(default_factory=dict)
    diverged_seeds: list[int] = field(default_factory=list)  # seeds at chance level in the pairs (diverged/failed)
    n_diverged_pairs: int = 0  # pairs in which either side diverged or failed to train (counted at chance level)
    p_t_holm: float | None = None
    p_wilcoxon_holm: float | None = None
    mde: float | None = None
    significant: bool = False  # Holm-adjusted paired t p < alpha
    best: bool = False

    @property
    def n(self) -> int:
        return len(self.values)


def compare(own: Cell, ref: Cell) -> tuple[list[int], Paired, int]:
    """(paired seeds, the comparison of ``own`` − ``ref`` over them, pairs in which either side diverged). When every
    pair has its per-image test results (or a constant at chance level), the comparison also gets the two-level
    bootstrap interval (:func:`ablations.report.bootstrap.two_level_ci`)."""
    from .bootstrap import two_level_ci

    seeds = sorted(set(own.pair_values) & set(ref.pair_values))
    diverged = set(own.diverged_seeds) | set(ref.diverged_seeds)
    result = paired([own.pair_values[s] - ref.pair_values[s] for s in seeds])
    if seeds and all(s in own.pair_correct and s in ref.pair_correct for s in seeds):
        ci = two_level_ci({s: own.pair_correct[s] for s in seeds}, {s: ref.pair_correct[s] for s in seeds})
        if ci is not None:
            result.boot_low, result.boot_high = ci
    return seeds, result, len(diverged & set(seeds))


def make_cell(row: str, depth: int | None, runs: Sequence[Run], baseline: bool = False) -> Cell:
    """The cell of ``runs``: mean ± sd over the ok runs, the per-seed values for pairing (first run of a seed)."""
    import numpy as np

    ok = [r for r in runs if r.ok]
    cell = Cell(row=row, depth=depth, values=[float(r.acc) for r in ok], seeds=[r.seed for r in ok],
                n_runs=len(runs), n_diverged=sum(1 for r in runs if r.diverged),
                n_failed_training=sum(1 for r in runs if r.failed_training),
                n_failed=sum(1 for r in runs if not r.ok and not r.at_chance), baseline=baseline)
    if cell.n:
        cell.mean = float(np.mean(cell.values))
        cell.std = float(np.std(cell.values, ddof=1)) if cell.n >= 2 else None
    for run in runs:
        value = pair_value(run)
        if run.seed is not None and value is not None and run.seed not in cell.pair_values:
            cell.pair_values[run.seed] = value
            if not run.ok:
                cell.diverged_seeds.append(run.seed)
                cell.pair_correct[run.seed] = value
            elif (correct := per_image(run)) is not None and abs(float(correct.mean()) - value) < 1e-6:
                cell.pair_correct[run.seed] = correct
    return cell


def per_image(run: Run):
    """The run's per-image test results (``test_correct``) as a boolean array, None when it has none."""
    from lit_modules.predictions import unpack

    text = run.summary.get("test_correct")
    return unpack(text) if isinstance(text, str) and text else None


def adjust(cells: Sequence[Cell], alpha: float = ALPHA, power: float = POWER) -> int:
    """One Holm family over ``cells`` (those with a defined t-test): Holm-adjusted t and Wilcoxon p-values over
    the same m comparisons, significance, and the MDE at α/m. Returns m."""
    family = [c for c in cells if c.comparison is not None and c.comparison.p_t is not None]
    m = len(family)
    for c, p_t, p_w in zip(family, holm([c.comparison.p_t for c in family]),
                           holm([c.comparison.p_wilcoxon if c.comparison.p_wilcoxon is not None else 1.0
                                 for c in family]), strict=True):
        c.p_t_holm, c.p_wilcoxon_holm = p_t, p_w if c.comparison.p_wilcoxon is not None else None
        c.significant = p_t < alpha
    for c in cells:
        if c.comparison is not None:
            c.mde = mde(c.comparison.sd, c.comparison.n, alpha / max(1, m), power)
    return m


def main_cells(data: StudyData, baseline: str = BASELINE, alpha: float = ALPHA, power: float = POWER) -> list[Cell]:
    """Row × depth cells: mean ± sample sd of the study's accuracy metric over the ok runs (seeds), the paired
    comparison with the baseline's cell (same depth, same extra axes; diverged runs at chance level), one Holm
    family over the table, MDE at α/m; best mean per depth."""
    cells = [make_cell(row, depth, data.by_row_depth(row, depth), data.row_variant.get(row) == baseline)
             for row in data.rows for depth in data.depths or [None]]
    by_key = {(c.row, c.depth): c for c in cells}
    for c in cells:
        base_row = None if c.baseline else data.baseline_row(c.row, baseline)
        base = by_key.get((base_row, c.depth)) if base_row is not None else None
        if base is not None:
            c.pair_seeds, c.comparison, c.n_diverged_pairs = compare(c, base)
    adjust(cells, alpha, power)
    for depth in data.depths or [None]:
        column = [c for c in cells if c.depth == depth and c.mean is not None]
        if column:
            top = max(c.mean for c in column)
            for c in column:
                c.best = math.isclose(c.mean, top, rel_tol=0.0, abs_tol=1e-12)
    return cells


def family_size(cells: Sequence[Cell]) -> int:
    """m: the comparisons with a paired t p-value (the one Holm family of the table, for both tests)."""
    return sum(1 for c in cells if c.comparison is not None and c.comparison.p_t is not None)


def _finite_or_none(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
