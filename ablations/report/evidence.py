"""What a claim line's verdict rests on (:class:`Evidence`), measured on the claim's own metric from a study's runs.

Every kind of claim (:data:`ablations.studies.spec.CLAIM_KINDS`) is a paired comparison of row A (the claim's
variant) with row B (its baseline), oriented so that positive is the paper's direction:

* ``superior`` / ``noninferior``: the claim's metric (default: the study's test accuracy); a run that diverged or
  failed to train counts at chance level. Non-inferiority shifts the difference by the margin δ: the claim holds
  when A is better than B − δ.
* ``faster``: steps to a target, the target being the baseline's own plateau (its mean validation accuracy over its
  last five epochs, per seed) minus ``target_drop``; the statistic is the log of the ratio (B's epochs / A's), a run
  that never reaches the target censored at one epoch past its last (it counts against the claim, never dropped).
* ``stable``: the share of (seed, rate) runs that train (above the floor, no non-finite loss), paired over every
  (seed, rate) both rows trained at — the tuning grid and the reported seeds —, tested by the exact McNemar test on
  the discordant pairs: stability is about the range of rates that work, not one tuned point.

For the first three the replicates come from the rate-aware bootstrap (:mod:`.resample`): tuning seeds (each row's
rate re-chosen), reported seeds and, for test accuracy with per-image results, test images.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .load import Run, StudyData, finite
from .resample import RESAMPLES, Side, accuracy_diff, line_seed, number_diff, resample
from .stats import chance_level, paired, per_image
from .tuning import tune_run_value

CONFIDENCE = 0.95


@dataclass
class Evidence:
    """A claim line's numbers: Δ (A − B, in the metric's units: an accuracy fraction, a log step ratio, a share) at
    the chosen rates, its rate-aware interval and replicates, and the tests' p-values before any family."""

    kind: str
    direction: str
    margin: float  # δ in the metric's units (for ``faster``: log of the ratio margin)
    n: int = 0  # paired seeds (stable: paired (seed, rate) runs)
    estimate: float | None = None  # Δ, A − B
    low: float | None = None  # the rate-aware interval Δ ± t·SE (CONFIDENCE)
    high: float | None = None
    p: float | None = None  # the deciding test (two-sided: along or against the claim)
    p_eq: float | None = None  # equivalence within ±δ (TOST on the replicates): superior and faster lines
    p_t: float | None = None  # the paired t-test over seeds at the chosen rates (a column, not the decision)
    oriented: np.ndarray | None = None  # replicates, paper's direction positive, shifted by δ for noninferior; NaN
    levels: tuple[str, ...] = ()  # what the replicates resampled
    coverage: float | None = None  # share of replicates whose re-chosen rates have reported runs
    rates: dict = field(default_factory=dict)  # side ("a", "b") -> rate -> share of replicates re-choosing it
    chosen: tuple = (None, None)  # the chosen rates of A and B
    tune_seeds: tuple[int, int] = (0, 0)  # tuning seeds behind each side's rate (0: no tuning stage)
    late: tuple = (None, None)  # late rise of A and B (val accuracy, mean over the reported seeds)
    counts: tuple | None = None  # stable: (A trains & B fails, A fails & B trains, pairs, A's share, B's share)
    n_chance: int = 0  # pairs in which a run counts at chance level (diverged or failed to train)
    all_equal: bool = False  # n ≥ 2 paired differences, all equal, and nothing else resampled: no interval, no test
    se: float | None = None  # the standard error of Δ over every resampled level (the replicates' sd, n/(n − 1))
    uncovered: float = 0.0  # share of replicates whose re-chosen rates were not trained on the reported seeds

    def critical(self, level: float) -> float:
        """t_{1 − level, n − 1}: the one-sided critical value at ``level``."""
        from scipy.stats import t

        return float(t.ppf(1.0 - level, max(1, self.n - 1)))

    @property
    def orientation(self) -> int:
        return 1 if self.direction == "higher" else -1

    @property
    def shift(self) -> float:
        return self.margin if self.kind == "noninferior" else 0.0

    def along(self) -> float | None:
        """Share of the replicates on the claim's side (uncovered ones count against it)."""
        if self.oriented is None:
            return None
        return float(np.mean(np.nan_to_num(self.oriented, nan=-np.inf) > 0))


def accuracy_payload(metric: str, data: StudyData) -> Callable[[Run], object]:
    """A run's value on an accuracy-like ``metric``: its per-image test results when the metric is the study's test
    accuracy and the run stored them, else its number; chance level for a run that diverged or failed to train;
    None (its seed drops out) for a run without a result."""
    def payload(run: Run):
        if run.at_chance:
            return chance_level(run)
        if run.state != "complete":
            return None
        value = run.acc if metric == data.metric else run.summary.get(metric)
        if not finite(value):
            return None
        if metric == data.metric and (correct := per_image(run)) is not None and \
                abs(float(correct.mean()) - float(value)) < 1e-6:
            return correct
        return float(value)
    return payload


def curve_payload(run: Run):
    """A run's validation curve (epoch -> accuracy), None without one or without a result."""
    if run.state != "complete" or not run.curve:
        return None
    return dict(run.curve)


def steps_diff(target_drop: float, window: int = 5) -> Callable[[dict, dict], float | None]:
    """log(B's epochs to the target / A's): the target is B's plateau (mean of its last ``window`` epochs) minus
    ``target_drop``; a curve that never reaches it counts one epoch past its last."""
    def diff(a: dict, b: dict) -> float | None:
        if not a or not b:
            return None
        last = sorted(b)[-window:]
        target = statistics.fmean(b[e] for e in last) - target_drop
        return math.log(epochs_to(b, target) / epochs_to(a, target))
    return diff


def epochs_to(curve: dict, target: float) -> int:
    """The first epoch at which ``curve`` reaches ``target``; one past its last epoch when it never does."""
    return next((e for e in sorted(curve) if curve[e] >= target - 1e-12), max(curve) + 1)


def late_rise(runs: list[Run], window: int) -> float | None:
    """Mean over ``runs`` of (mean val accuracy of the last 3 epochs − that of the 3 epochs ``window`` before):
    how much a row was still rising when its schedule ended; None without curves long enough."""
    rises = []
    for run in runs:
        epochs = sorted(run.curve)
        if run.ok and len(epochs) >= window + 3:
            now = statistics.fmean(run.curve[e] for e in epochs[-3:])
            before = statistics.fmean(run.curve[e] for e in epochs[-3 - window:len(epochs) - window])
            rises.append(now - before)
    return statistics.fmean(rises) if rises else None


def tune_cell(data: StudyData, row: str, depth) -> list[Run]:
    """The tuning runs that chose the rate of (row, depth): those at its depth, else — a row tuned at one depth and
    trained at every depth (``tune.axes``, ``tune_axes``) — those at the one depth it was tuned at."""
    here = [r for r in data.tune_runs if r.row == row and r.depth == depth]
    if here:
        return here
    depths = {r.depth for r in data.tune_runs if r.row == row}
    return [r for r in data.tune_runs if r.row == row] if len(depths) == 1 else []


def side(data: StudyData, row: str, depth, payload: Callable[[Run], object]) -> Side:
    """One side of a comparison: its tuning table, its chosen rate and its reported payloads at every rate it trained
    the reported seeds at (the chosen rate, and contending rates)."""
    reported_runs = data.by_row_depth(row, depth)
    rates = Counter(r.lr for r in reported_runs)  # None: runs that did not store their rate (one key for all)
    chosen = rates.most_common(1)[0][0] if rates else None
    out = Side(chosen=chosen)
    contend = [r for r in data.contend_runs if r.row == row and r.depth == depth and r.lr is not None]
    for run in [*reported_runs, *contend]:
        value = payload(run)
        if value is not None and run.seed is not None:
            out.reported.setdefault(run.lr, {}).setdefault(run.seed, value)
    for run in tune_cell(data, row, depth):
        if run.lr is not None and run.seed is not None:
            out.tune.setdefault(run.lr, {}).setdefault(run.seed, tune_run_value(run, data.tune_metric))
    grid = [float(lr) for lr in data.tune_grid]
    out.order = [lr for lr in grid if lr in out.tune] + sorted(lr for lr in out.tune if lr not in grid)
    return out


def measure(data: StudyData, claim, row: str, depth, base_row: str, base_depth, metric: str, rules,
            resamples: int = RESAMPLES) -> Evidence:
    """The evidence of one claim line (module docstring). Its replicates are seeded by the comparison alone (study,
    both sides, metric), so every line, premise and depth-table cell that compares the same two sides on the same
    metric reports the same interval."""
    kind = claim.kind
    margin = claim.margin if claim.margin is not None else (rules.ratio_margin if kind == "faster" else rules.margin)
    margin = math.log(margin) if kind == "faster" else margin
    ev = Evidence(kind=kind, direction=claim.direction, margin=margin)
    if kind == "stable":
        return _stable(ev, data, row, depth, base_row, base_depth)
    if kind == "faster":
        payload, diff = curve_payload, steps_diff(rules.target_drop)
    else:
        payload, diff = accuracy_payload(metric, data), accuracy_diff if metric == data.metric else number_diff
    a, b = side(data, row, depth, payload), side(data, base_row, base_depth, payload)
    rep = resample(a, b, diff, resamples=resamples,
                   seed=line_seed(data.name, row, depth, base_row, base_depth, metric))
    ev.n, ev.estimate, ev.levels, ev.coverage, ev.rates = rep.n, rep.estimate, rep.levels, rep.coverage, rep.rates
    ev.chosen = (a.chosen, b.chosen)
    ev.tune_seeds = (len(a.tune_seeds()), len(b.tune_seeds()))
    ev.late = (late_rise(data.by_row_depth(row, depth), rules.late_window),
               late_rise(data.by_row_depth(base_row, base_depth), rules.late_window))
    if rep.estimate is None:
        return ev
    seeds = sorted(set(a.reported.get(a.chosen, {})) & set(b.reported.get(b.chosen, {})))
    diffs = [float(np.mean(d)) for s in seeds
             if (d := diff(a.reported[a.chosen][s], b.reported[b.chosen][s])) is not None]
    ev.p_t = paired(diffs).p_t
    ev.n_chance = sum(1 for s in seeds if _at_chance(data, row, depth, s) or _at_chance(data, base_row, base_depth, s))
    if len(diffs) >= 2 and np.ptp(diffs) <= 1e-12 and "images" not in rep.levels and \
            len({r for shares in rep.rates.values() for r in shares}) <= 2:
        ev.all_equal = True  # every replicate would be this one number: no spread to test against
        return ev
    covered = rep.covered
    ev.oriented = ev.orientation * rep.deltas + ev.shift
    ev.uncovered = 1.0 - rep.coverage
    if covered.size < 2 or rep.n < 2 or float(np.std(covered)) <= 1e-15:
        return ev
    ev.se = float(np.std(covered, ddof=1)) * math.sqrt(rep.n / (rep.n - 1))
    half = ev.critical((1.0 - CONFIDENCE) / 2) * ev.se
    ev.low, ev.high = rep.estimate - half, rep.estimate + half
    ev.p = two_sided_t(ev.orientation * rep.estimate + ev.shift, ev.se, rep.n, ev.uncovered)
    if kind != "noninferior":
        ev.p_eq = equivalence_t(rep.estimate, margin, ev.se, rep.n, ev.uncovered)
    return ev


def _at_chance(data: StudyData, row: str, depth, seed: int) -> bool:
    return any(r.at_chance for r in data.by_row_depth(row, depth) if r.seed == seed)


def two_sided_t(estimate: float, se: float, n: int, uncovered: float = 0.0) -> float:
    """The deciding test of H0: Δ = 0: t = Δ / SE against Student's t with n − 1 degrees of freedom (n paired
    seeds, the top level of replication), SE the bootstrap's over every resampled level; the share of replicates
    that could not be evaluated (a re-chosen rate the reported seeds did not train) is added twice, as if each had
    fallen on the other side: p = min(1, 2·P(T ≥ |t|) + 2·uncovered)."""
    from scipy.stats import t

    return float(min(1.0, 2.0 * t.sf(abs(estimate) / se, max(1, n - 1)) + 2.0 * uncovered))


def equivalence_t(estimate: float, margin: float, se: float, n: int, uncovered: float = 0.0) -> float:
    """TOST within ±δ on the same t: the larger of the one-sided p-values of H0: Δ ≥ δ and H0: Δ ≤ −δ, plus the
    uncovered share."""
    from scipy.stats import t

    df = max(1, n - 1)
    return float(min(1.0, max(t.sf((margin - estimate) / se, df), t.sf((estimate + margin) / se, df)) + uncovered))


def trained(run: Run) -> bool | None:
    """Whether a run trained (complete, above the floor, finite loss); None for a run without a result."""
    if run.at_chance:
        return False
    return True if run.ok else None


def _stable(ev: Evidence, data: StudyData, row: str, depth, base_row: str, base_depth) -> Evidence:
    """The stability evidence: paired (seed, rate) runs of both rows in every phase, McNemar's exact test."""
    from scipy.stats import binomtest

    def runs_of(r: str, d) -> dict:
        out = {}
        for run in [*data.tune_runs, *data.runs, *data.contend_runs]:
            if run.row == r and run.depth == d and run.lr is not None and (t := trained(run)) is not None:
                out.setdefault((run.seed, run.lr), t)
        return out

    own, ref = runs_of(row, depth), runs_of(base_row, base_depth)
    keys = sorted(set(own) & set(ref))
    if not keys:
        return ev
    a = np.array([own[k] for k in keys], dtype=float)
    b = np.array([ref[k] for k in keys], dtype=float)
    up, down = int(np.sum((a == 1) & (b == 0))), int(np.sum((a == 0) & (b == 1)))
    ev.n, ev.estimate = len(keys), float(a.mean() - b.mean())
    ev.counts = (up, down, len(keys), float(a.mean()), float(b.mean()))
    ev.p = float(binomtest(up, up + down, 0.5).pvalue) if up + down else 1.0
    ev.levels = ("seeds x rates",)
    return ev
