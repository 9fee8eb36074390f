"""The contending rates' stage: after the reported grid, the reported seeds of every cell whose rate choice is not
settled train again at each contending rate (:func:`ablations.studies.rules.contenders`), so that a verdict's
uncertainty can cover the choice (``ablations.report.resample``: a replicate that re-chooses a rate the reported
seeds never trained at counts against the claim). A study whose every choice is settled has no such stage."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter

from optuna.trial import TrialState

from ..report.evidence import side
from ..studies.claims import compared_cells
from ..studies.rules import contenders
from ..studies.spec import CONTEND_POINTS, TUNED_LR, contend_name, tune_name
from ..studies.storage import repeated_results
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
    if spec.tune is None or spec.first_look() or len(spec.tune.seeds) < 2:
        return None  # a first look is not evidence; one tuning seed cannot tell a settled choice
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


def cell_of(point: dict) -> tuple:
    """A point's (variant, depth) cell: what a trial's cost and a dry run's count go by."""
    return point["variant"], point.get("depth")


def contending_trials(spec, data, points: list[dict]) -> Counter:
    """Per (variant, depth) cell, the contending-rate trials ``points`` (reported grid points) call for, from the
    tuning stage and the chosen rates in ``data`` (a runs file's :class:`StudyData`): each point once per contending
    rate of its cell."""
    out: Counter = Counter()
    for (row, depth), seeds in Counter(cell_of(p) for p in points).items():
        cell = side(data, row, depth, lambda run: 1)
        if cell.chosen is not None and cell.tune:
            if found := contenders(cell.tune, cell.order, cell.chosen, spec.verdicts):
                out[(row, depth)] = seeds * len(found)
    return out


def first_look_runs(spec, data):
    """``data`` without a second look's runs (its reported seeds and their contending rates): the first look."""
    seeds = {int(s) for s in spec.axes.get("seed", [])}
    first = [r for r in data.contend_runs if not seeds or r.seed in seeds]
    return dataclasses.replace(data, runs=[r for r in data.runs if r.phase != "round"], contend_runs=first)


def dry_run_trials(spec, data=None) -> tuple[Counter | None, Counter, Counter] | None:
    """For a dry run, per (variant, depth) cell: (the trials the completed tuning stage of ``data`` — a runs file's
    :class:`StudyData` to be imported — calls for, None when not known (no file, or a tuning stage of fewer than
    three seeds: the choice's spread is not known from it); the most the stage can take; the completed ones
    ``data`` holds in the cells a claim compares). None for a study without the stage (no tuning stage, or a first
    look)."""
    if spec.tune is None or spec.first_look() or spec.kind != "grid":
        return None
    points = claim_points(spec)
    most = Counter({cell: n * (spec.verdicts.max_rates - 1) for cell, n in Counter(map(cell_of, points)).items()})
    if data is None:
        return None, most, Counter()
    first = first_look_runs(spec, data)
    known = contending_trials(spec, first, points) if len({r.seed for r in data.tune_runs}) >= 3 else None
    done = Counter((r.variant, r.depth) for r in first.contend_runs  # runs in cells no claim reads count for none
                   if r.state == "complete" and (r.variant, r.depth) in most)
    return known, most, done
