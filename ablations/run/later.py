"""The dry run's price of the stages after the reported grid: the contending rates and a second look, counted from
the runs file to be imported where it tells them (:func:`ablations.run.contend.dry_run_trials`,
:func:`ablations.run.rounds.dry_run_trials`) and priced per (variant, depth) cell."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

from ..report.runs import read
from .contend import dry_run_trials as contend_trials
from .contend import has_stage
from .durations import duration_text
from .looks import price_cell
from .rounds import dry_run_trials as round_trials
from .rounds import has_second_look, new_seeds


def say_later_stages(spec, import_runs: Path | None, per_trial: float, workers: int, factor: float | None = None,
                     measured: dict | None = None) -> None:
    """The stages that may follow the reported grid: the contending rates, and a second look at undecided claims,
    priced for the trials the runs file to be imported (``import_runs``, read only when such a stage applies) does
    not hold yet: each at its (variant, depth) cell's median wall time in ``measured`` (a stored study's completed
    trials), a cell not measured at ``per_trial`` (the estimate, scaled by ``factor`` where that is given)."""
    if not (has_stage(spec) or has_second_look(spec)):
        return
    data = read(import_runs, spec, spec.study_name) if import_runs is not None else None
    price = LaterPrice(measured or {}, per_trial, workers, factor)
    if (contend := contend_trials(spec, data)) is not None:
        known, most, held, untuned = contend
        left, holds = _not_held(known + untuned if known is not None else most, held)
        upto = (f"each reported point of a cell a claim compares, at up to {spec.verdicts.max_rates - 1} more rates: "
                "which cells is known once the tuning stage is done")
        holding = f" ({holds} of them in the imported runs)" if holds else ""
        what = (f"at most {sum(most.values())} trials ({upto}){holding}" if known is None else
                f"{sum(known.values())} trials for the rate choices of the file's tuning stage that are not settled"
                + holding + (f", and at most {sum(untuned.values())} for the cells it has not tuned yet ({upto})"
                             if untuned else ""))
        print(f"contending rates (stage {spec.study_name}-contend, after the reported grid): {what}; "
              + (price(left) if sum(left.values()) else "none left"))
    if not has_second_look(spec):
        return
    stage = f"second look (stage {spec.study_name}-round, after the first look's verdicts)"
    if (second := round_trials(spec, data) if data is not None else None) is None:
        print(f"{stage}: the rows of the claim lines still undecided train {len(spec.axes.get('seed', []))} more seeds "
              f"each — at most {spec.size} trials, then their contending rates; the {spec.size} trials: "
              + price(Counter(map(price_cell, spec.grid()))))
        return
    points, cells, contending, held = second
    if not points:
        print(f"{stage}: none — the imported runs' first look leaves no line undecided that more seeds could decide")
        return
    left, holds = _not_held(Counter(map(price_cell, points)) + contending, held)
    print(f"{stage}: the imported runs' first look leaves undecided lines that more seeds could decide; "
          + ", ".join(f"{row} depth={depth}" for row, depth in sorted(cells, key=str))
          + f" train {len(new_seeds(spec))} more seeds each — {len(points)} trials, and "
          f"{sum(contending.values())} at their contending rates"
          + (f" ({holds} of them in the imported runs)" if holds else "") + "; "
          + (price(left) if sum(left.values()) else "none left"))


def _not_held(trials: Counter, held: Counter) -> tuple[Counter, int]:
    """(per cell, the ``trials`` a runs file does not hold yet; how many it holds), ``held`` counted at most up to
    each cell's trials."""
    left = Counter({cell: n - min(held[cell], n) for cell, n in trials.items()})
    return left, sum(trials.values()) - sum(left.values())


class LaterPrice:
    """``about T more`` for the trials of a later stage, per (variant, depth) cell: each at its cell's median
    measured wall time, a cell not measured at the estimate (times the study's measured / estimated factor where it
    has one); the sum divided by the workers, and how it was priced."""

    def __init__(self, measured: dict, estimate: float, workers: int, factor: float | None):
        self.median = {cell: statistics.median(times) for cell, times in measured.items() if times}
        self.estimate, self.workers, self.factor = estimate, max(1, workers), factor

    def __call__(self, trials: Counter) -> str:
        at_median = sum(n for cell, n in trials.items() if cell in self.median)
        rest = sum(trials.values()) - at_median
        total = sum(n * self.median.get(cell, self.estimate) for cell, n in trials.items()) / self.workers
        scaled = f" x {self.factor:.2f} as this study's measured cells ran" if self.factor else ""
        if not at_median:
            return f"about {duration_text(total)} more" + (f", the estimate{scaled}" if scaled else "")
        if not rest:
            return f"about {duration_text(total)} more, each trial at its cell's median wall time"
        return (f"about {duration_text(total)} more ({at_median} trials at their cell's median wall time, {rest} at "
                f"the estimate{scaled})")
