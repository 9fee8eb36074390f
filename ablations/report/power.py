"""How many seeds a study needs: the ``power`` table, a planning estimate from the study's own paired differences.

For each comparison of the paired table, the seeds n at which the paired two-sided t-test at the table's Bonferroni
level α′ = α/m (the MDE's level, :func:`ablations.report.stats.mde`) detects a true Δ of each target with power
0.8, if the paired differences keep the sample sd s_d they have now. The caption adds what a whole study would
cost: the seeds per row at which the table's median and largest MDE reach a target, and the trials and
worker-hours that takes at the study's own mean wall time per trial and worker (the tuning stage as it was).

s_d is itself an estimate: with n pairs its 95% interval is s_d·√((n−1)/χ²) between the χ² quantiles of n − 1
degrees of freedom (about 0.76–1.46 × s_d at n = 20), and the seeds needed scale roughly with its square — the
caption gives that range for the table's n.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from .format import Column, Table, frame
from .load import StudyData, mean_of, median_of, own_seconds
from .stats import ALPHA, POWER, Cell, family_size, mde

# Imported where they are used, not here: SciPy. Each takes from a tenth of a second to seconds to import, and the
# command-line tools start without them.

TARGETS_PP = (2.0, 1.0, 0.5)  # the MDEs a plan asks for, in percentage points
MAX_SEEDS = 10_000  # beyond this a target reads "> 10000": the differences are too noisy for it


def _key(target: float) -> str:
    return f"seeds_{target:g}pp"


POWER_KEYS = ["variant", "depth", "n_pairs", "sd", "mde", *map(_key, TARGETS_PP)]


def seeds_needed(mde_at: Callable[[int], float], target: float) -> int | None:
    """The smallest n ≥ 2 with ``mde_at(n)`` ≤ ``target`` (``mde_at`` decreases in n), None above ``MAX_SEEDS``."""
    low, high = 2, MAX_SEEDS
    if mde_at(high) > target:
        return None
    while low < high:  # bisection: mde_at(high) <= target throughout
        mid = (low + high) // 2
        if mde_at(mid) <= target:
            high = mid
        else:
            low = mid + 1
    return low


def _seeds_text(n: int | None) -> str:
    return f"> {MAX_SEEDS}" if n is None else str(n)


def sd_range(n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The factors (low, high) of the sample sd's ``confidence`` interval with n observations (χ², n − 1 df)."""
    from scipy import stats

    df = n - 1
    tail = (1 - confidence) / 2
    return math.sqrt(df / stats.chi2.ppf(1 - tail, df)), math.sqrt(df / stats.chi2.ppf(tail, df))


def _trial_seconds(data: StudyData) -> float | None:
    """The study's wall time per trial and worker (report and tuning runs alike; a stacked trial's share of its
    stack): the mean over its cells (row, depth and other grid axes) of each cell's median trial, so rows that cost
    more weigh in, and a trial whose worker was paused mid-training (its wall clock counting the pause) does not;
    None when none recorded it."""
    cells: dict[tuple, list[float]] = {}
    for r in [*data.runs, *data.tune_runs]:
        if (t := own_seconds(r.summary)) is not None:
            cells.setdefault((r.row, r.depth, r.extras), []).append(t)
    return mean_of(median_of(times) for times in cells.values())


def _cost_text(data: StudyData, seeds: int, seconds: float | None) -> str:
    """Reported trials at ``seeds`` per cell (row × depth, extra axes in the row), plus the tuning stage's trials as
    run, and their worker-hours at ``seconds`` per trial."""
    reported = len({(r.row, r.depth) for r in data.runs}) * seeds
    text = f"{reported} reported" + (f" + {len(data.tune_runs)} tuning" if data.tune_runs else "") + " trials"
    if seconds is not None:
        text += f", {(reported + len(data.tune_runs)) * seconds / 3600:.1f} worker-hours"
    return text


def power_table(data: StudyData, cells: Sequence[Cell], alpha: float = ALPHA, power: float = POWER) -> Table | None:
    """Seeds needed per comparison for each MDE target, at the level and power ``main_cells`` gave the MDE; None
    when no comparison has an sd to plan from."""
    planned = [c for c in cells if c.comparison is not None and c.mde is not None]
    if not planned:
        return None
    level = alpha / max(1, family_size(cells))

    @functools.cache
    def unit(n: int) -> float:  # the MDE is proportional to s_d (noncentrality δ√n/s_d): one solve per n
        return mde(1.0, n, level, power)

    records: list[dict[str, Any]] = []
    for c in planned:
        rec = {"variant": c.row, "depth": c.depth, "n_pairs": c.comparison.n, "sd": c.comparison.sd, "mde": c.mde}
        for t in TARGETS_PP:
            rec[_key(t)] = seeds_needed(lambda n, sd=c.comparison.sd: sd * unit(n), t / 100)
        records.append(rec)

    sds = [c.comparison.sd for c in planned]
    seconds = _trial_seconds(data)
    plans = []
    for name, pick, target in (("median", statistics.median, 1.0), ("largest", max, 2.0), ("largest", max, 1.0)):
        n = seeds_needed(lambda n, sd=pick(sds): sd * unit(n), target / 100)
        plans.append(f"the {name} MDE ≤ {target:.1f} pp needs {_seeds_text(n)} seeds per row"
                     + (f" ({_cost_text(data, n, seconds)})" if n is not None else ""))
    pace = f" (worker-hours at {seconds:.0f} s per trial and worker, the mean over the study's cells of each cell's median trial)" if seconds else ""
    pairs = sorted(c.comparison.n for c in planned)
    middle = pairs[len(pairs) // 2]
    low, high = sd_range(middle)
    columns = [Column("variant", "variant"), Column("depth", "depth", fmt="d"), Column("n_pairs", "pairs", fmt="d"),
               Column("sd", "s_d (pp)", fmt=".2f", scale=100.0), Column("mde", "MDE now (pp)", fmt=".2f", scale=100.0),
               *(Column(_key(t), f"seeds for MDE ≤ {t:g} pp", render=lambda rec, style, k=_key(t): _seeds_text(rec[k]))
                 for t in TARGETS_PP)]
    csv_cols = [("variant", "variant", ""), ("depth", "depth", ""), ("n_pairs", "n_pairs", ""),
                ("sd", "sd_differences", ".6f"), ("mde", "mde", ".6f"),
                *((_key(t), f"seeds_for_mde_{t:g}pp", "") for t in TARGETS_PP)]
    caption = (f"Seeds needed in study {data.name} ({data.metric}), a planning estimate: per comparison of table "
               f"'paired', the smallest number of paired seeds n at which the paired two-sided t-test at the "
               f"Bonferroni level α′ = α/m = {level:.4g} (α = {alpha}, m = {family_size(cells)}, as the MDE) detects "
               f"a true Δ of {' / '.join(f'{t:g}' for t in TARGETS_PP)} pp with power {power} (noncentral t), if "
               f"the paired differences keep their present sample sd s_d; '> {MAX_SEEDS}': out of reach. For the "
               f"whole table{pace}, {'; '.join(plans)}. s_d is itself estimated: at n = {middle} pairs "
               f"its 95% interval is {low:.2f}–{high:.2f} × s_d (χ²), and the seeds needed scale about with its "
               f"square.")
    return Table("power", f"{data.name}: seeds needed for a detectable effect", caption, frame(records, POWER_KEYS),
                 columns, csv_cols)
