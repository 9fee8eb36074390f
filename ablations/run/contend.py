"""The contending rates' stage: after the reported grid, the reported seeds of every cell whose rate choice is not
settled train again at each contending rate (:func:`ablations.studies.rules.contenders`), so that a verdict's
uncertainty can cover the choice (``ablations.report.resample``: a replicate that re-chooses a rate the reported
seeds never trained at counts against the claim). A study whose every choice is settled has no such stage."""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import NamedTuple

from optuna.trial import TrialState

from ..report.evidence import side
from ..studies.claims import compared_cells
from ..studies.rules import contenders
from ..studies.spec import CONTEND_POINTS, TUNED_LR, contend_name, tune_name
from ..studies.storage import repeated_results
from .looks import first_look_runs, price_cell, run_cell, same_rate
from .study import cell_text, create_study, load_study, trial_point
from .tuning import tune_value


def tuning_table(spec, tune_study) -> dict[str, dict[float, dict[int, float]]]:
    """cell (:meth:`StudySpec.tune_key`) -> rate -> tuning seed -> value in the choice, from the tuning stage's
    completed trials (the rule of :func:`ablations.run.tuning.tune_value`)."""
    complete = tune_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    repeats = repeated_results(complete)
    table: dict[str, dict[float, dict[int, float]]] = {}
    for t in complete:
        if t.user_attrs.get("surplus") or "duplicate_of" in t.user_attrs or t.number in repeats:
            continue
        params = trial_point(t)
        rate = float(params["lr"])
        table.setdefault(spec.tune_key(params), {}).setdefault(rate, {})[int(params["seed"])] = tune_value(
            t.user_attrs, spec.tune.metric, spec.floor)
    return table


def rate_order(spec, rates) -> list[float]:
    """The tuning rule's tie order: the grid's rates as listed, then the added ones (ascending)."""
    grid = [float(r) for r in spec.tune.lr]
    return [r for r in grid if r in rates] + sorted(r for r in rates if r not in grid)


def contend_points(spec, tune_study, chosen: dict[str, float]) -> tuple[list[dict], dict[str, list[float]]]:
    """(the stage's points, cell -> its contending rates): every reported grid point of an unsettled cell, once per
    contending rate."""
    table = tuning_table(spec, tune_study)
    rates: dict[str, list[float]] = {}
    for key, by_rate in sorted(table.items()):
        if key in chosen:
            found = contenders(by_rate, rate_order(spec, by_rate), float(chosen[key]), spec.verdicts)
            if found:
                rates[key] = found
    points = [dict(p) | {"lr": rate} for p in claim_points(spec) for rate in rates.get(spec.tune_key(p), [])]
    return points, rates


def claim_points(spec) -> list[dict]:
    """The reported grid's points in the cells the study's claim lines and premises compare
    (:func:`ablations.studies.claims.compared_cells`; every point when it makes no claim): a cell no verdict reads
    has no contending rates to train."""
    grid = spec.grid()
    cells = compared_cells(spec.claims, sorted({p["depth"] for p in grid if p.get("depth") is not None}))
    return grid if cells is None else [p for p in grid if (p["variant"], p.get("depth")) in cells]


def stored_points(storage, study_name: str) -> list[dict]:
    """The points a contending-rates stage stored (its workers read them)."""
    return list(load_study(storage, study_name).user_attrs.get(CONTEND_POINTS) or [])


def prepare(spec, storage, study_name: str):
    """The contending stage of ``study_name`` (its spec, storage name and Optuna study), its points computed from the
    tuning stage and stored; None when every choice is settled (or the study has no tuning stage)."""
    if not has_stage(spec):
        return None
    chosen = load_study(storage, study_name).user_attrs.get(TUNED_LR) or {}
    points, rates = contend_points(spec, load_study(storage, tune_name(study_name)), chosen)
    if not points:
        return None
    name = contend_name(study_name)
    stage = spec.contend_stage(points)
    study = create_study(stage, storage, name, seed=0)
    study.set_user_attr(CONTEND_POINTS, json.loads(json.dumps(points)))
    print(f"study '{study_name}': rate choices not settled (re-chosen in under {spec.verdicts.settled_share:.0%} of "
          f"the tuning-seed resamples, or won by under {100 * spec.verdicts.settled_margin:.1f} pp): the reported seeds "
          "train again at " + "; ".join(f"{cell_text(k)} {', '.join(f'{r:g}' for r in v)}" for k, v in rates.items())
          + f" ({len(points)} trials, study '{name}')", file=sys.stderr)
    return stage, name, study


def has_stage(spec) -> bool:
    """Whether a study has a contending-rates stage: a grid with a tuning stage of two seeds or more (one cannot tell
    a settled choice), not a first look (which is not evidence)."""
    return spec.kind == "grid" and spec.tune is not None and len(spec.tune.seeds) >= 2 and not spec.first_look()


def contending_rates(spec, data, points: list[dict]) -> dict[tuple, list[float]]:
    """Per (row, depth) cell of ``points`` (reported grid points, :func:`~.looks.run_cell`) that ``data`` (a runs
    file's :class:`StudyData`) has tuned and reported, its contending rates from the tuning stage and the chosen rate;
    a settled cell has none."""
    out = {}
    for row, depth in dict.fromkeys(run_cell(spec, p) for p in points):
        cell = side(data, row, depth, lambda run: 1)
        if cell.chosen is not None and cell.tune:
            out[(row, depth)] = contenders(cell.tune, cell.order, cell.chosen, spec.verdicts)
    return out


def held_trials(spec, points: list[dict], rates: dict | None, runs) -> Counter:
    """Per (variant, depth) price cell (:func:`~.looks.price_cell`), the trials of ``points`` that ``runs`` hold
    completed: a run at a point's row, depth and seed, at one of its cell's ``rates`` (``None``: at any rate), each
    (point, rate) once."""
    wanted = {(*run_cell(spec, p), p.get("seed")): price_cell(p) for p in points}
    seen, out = set(), Counter()
    for r in runs:
        key = (r.row, r.depth, r.seed)
        if r.state != "complete" or key not in wanted:
            continue
        rate = r.lr if rates is None else next((x for x in rates.get(key[:2], ()) if same_rate(x, r.lr)), None)
        if rate is not None and (key, rate) not in seen:
            seen.add((key, rate))
            out[wanted[key]] += 1
    return out


def stage_trials(spec, rates: dict, points: list[dict]) -> Counter:
    """Per (variant, depth) price cell, the contending-rate trials ``points`` call for: each once per contending
    rate of its cell in ``rates`` (:func:`contending_rates`)."""
    out: Counter = Counter()
    for point in points:
        if n := len(rates.get(run_cell(spec, point), ())):
            out[price_cell(point)] += n
    return out


class Count(NamedTuple):
    """A dry run's count of the contending-rate stage, per (variant, depth) price cell (:func:`~.looks.price_cell`)."""

    known: Counter | None  # the trials the file's tuning stage calls for in the cells it tuned (None: not known)
    most: Counter  # the most the stage can take
    held: Counter  # those the file holds completed (at a contending rate of their cell, where that is known)
    untuned: Counter = Counter()  # the most in the cells the file's tuning stage has not reached yet


def dry_run_trials(spec, data=None) -> Count | None:
    """For a dry run, the contending-rate stage counted from ``data`` (a runs file's :class:`StudyData` to be
    imported): what its completed tuning stage calls for is not known without a file or with a tuning stage of
    fewer than three seeds (the choice's spread is not known from it). None for a study without the stage (no
    tuning stage of two seeds or more, or a first look), as :func:`prepare` decides."""
    if not has_stage(spec):
        return None
    points = claim_points(spec)
    most = Counter({cell: n * (spec.verdicts.max_rates - 1) for cell, n in Counter(map(price_cell, points)).items()})
    if data is None:
        return Count(None, most, Counter())
    first = first_look_runs(spec, data)
    if len({r.seed for r in data.tune_runs}) < 3:
        return Count(None, most, held_trials(spec, points, None, first.contend_runs))
    rates = contending_rates(spec, first, points)
    tuned = {price_cell(p) for p in points if run_cell(spec, p) in rates}
    return Count(stage_trials(spec, rates, points), most, held_trials(spec, points, rates, first.contend_runs),
                 Counter({cell: n for cell, n in most.items() if cell not in tuned}))
