"""A study's second look: after its reported grid (and its contending rates), the rows of every claim line the first
look left undecided train as many new seeds again, as the study ``<name>-round``, and the verdicts are computed over
all of them. The group-sequential rule (``verdicts.looks``, ``verdicts.spending``: ``ablations.report.decide``) makes
that second look cost alpha at the first, so deciding in two looks keeps the family-wise error at α.

A line is left alone when it is decided, rests on old evidence (its rate tuned on fewer than three seeds: more seeds
would not measure the choice), has no test, or is futile: even at twice the seeds, with the same estimate and its
standard error shrunk by √2, it could neither reach its look's share of α alone nor show equivalence.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter

from ..report.claims import claim_records
from ..report.load import collect, open_tune_study
from ..report.stats import ALPHA
from ..studies.spec import ROUND_POINTS, contend_name, round_name, tune_name
from .contend import contending_rates, held_trials, stage_trials
from .contend import dry_run_trials as contend_trials
from .looks import first_look_runs, run_cell
from .study import create_study, load_study

# scipy.stats (about 0.9 s, measured with python -X importtime beside the 0.5 s of `python -m ablations.run --help`) is
# imported where a second look's futility is computed.


def new_seeds(spec) -> list[int]:
    """The second look's seeds: as many as the first look's, after its largest, never a tuning seed."""
    first = [int(s) for s in spec.axes.get("seed", [])]
    taken = set(first) | {int(s) for s in (spec.tune.seeds if spec.tune is not None else ())}
    out, seed = [], max(first, default=-1) + 1
    while len(out) < len(first):
        if seed not in taken:
            out.append(seed)
        seed += 1
    return out


def futile(ev, rules, alpha: float) -> bool:
    """Whether twice the seeds could not decide the line: at its estimate with the standard error shrunk by √2, its p
    at the second look (with that look's share of α) stays at or above α even alone in its family, and its
    equivalence test too."""
    from scipy.stats import t

    if ev.se is None or ev.estimate is None or ev.n < 2:
        return True
    n2, se2 = 2 * ev.n, ev.se / math.sqrt(2)
    share = rules.look_alpha(n2, ev.n, alpha)
    oriented = abs(ev.orientation * ev.estimate + ev.shift)
    decide = 2 * t.sf(oriented / se2, n2 - 1) * alpha / share
    if decide < alpha:
        return False
    if ev.kind in ("superior", "faster"):
        equiv = max(t.sf((ev.margin - ev.estimate) / se2, n2 - 1), t.sf((ev.estimate + ev.margin) / se2, n2 - 1))
        return equiv * alpha / share >= alpha
    return True


def undecided_cells(records: list[dict], rules, alpha: float) -> set[tuple[str, object]]:
    """(row, depth) of both sides of every line worth a second look (module docstring)."""
    cells = set()
    for rec in records:
        ev = rec.get("_evidence")
        if ev is None or rec["verdict"] != "not resolved" or rec.get("old_evidence") or ev.kind == "stable":
            continue
        if futile(ev, rules, alpha):
            continue
        cells.add((rec["variant"], rec["depth"]))
        cells.add((rec["baseline"], rec["baseline_depth"] if rec.get("baseline_depth") is not None else rec["depth"]))
    return cells


def has_second_look(spec) -> bool:
    """Whether a study may take a second look: a grid with claims, two looks or more, not a first look."""
    return spec.kind == "grid" and bool(spec.claims) and spec.verdicts.looks > 1 and not spec.first_look()


def round_points(spec, data) -> tuple[list[dict], set]:
    """(the second look's points, the cells they are for): the first look's grid points of every undecided cell,
    once per new seed."""
    if not has_second_look(spec):
        return [], set()
    records, _ = claim_records(data, spec.claims, spec=spec)
    cells = undecided_cells(records, spec.verdicts, ALPHA)
    first = min(spec.axes.get("seed", [0]))
    points = []
    for point in spec.grid():
        if point["seed"] == first and run_cell(spec, point) in cells:
            points += [dict(point) | {"seed": seed} for seed in new_seeds(spec)]
    return points, cells


def stored_points(storage, study_name: str) -> list[dict]:
    """The points a second look stored (its workers read them)."""
    return list(load_study(storage, study_name).user_attrs.get(ROUND_POINTS) or [])


def prepare(spec, storage, study_name: str, results_dir):
    """The second look of ``study_name`` (its spec, storage name and Optuna study), its points computed from the
    verdicts of everything stored so far and stored; None when no line needs one. A second look already stored
    keeps its points (the verdicts that chose them may read otherwise once its runs are in)."""
    name = round_name(study_name)
    try:
        stored = stored_points(storage, name)
    except KeyError:
        stored = []
    if not stored:
        study = load_study(storage, study_name)
        data = collect(study, spec, results_dir, tune_study=open_tune_study(study, tune_name),
                       contend_study=open_tune_study(study, contend_name))
        stored, cells = round_points(spec, data)
        if not stored:
            return None
        print(f"study '{study_name}': lines not decided at the first look — a second look trains "
              f"{len(new_seeds(spec))} more seeds of " + ", ".join(f"{row} depth={depth}" for row, depth in
                                                                   sorted(cells, key=str))
              + f" ({len(stored)} trials, study '{name}')", file=sys.stderr)
    stage = spec.round_stage(stored)
    round_study = create_study(stage, storage, name, seed=0)
    round_study.set_user_attr(ROUND_POINTS, json.loads(json.dumps(stored)))
    return stage, name, round_study


def dry_run_trials(spec, data) -> tuple[list[dict], set, Counter, Counter] | None:
    """For a dry run from a runs file to be imported (``data``, its :class:`StudyData`): (the second look's points,
    the cells they are for, per (variant, depth) price cell the contending-rate trials they call for, and per price
    cell the trials of both that ``data`` holds completed) once the file's first look is complete — every point of
    its reported grid and its contending rates —, else None (which lines stay undecided is not known yet)."""
    if not has_second_look(spec):
        return None
    first = first_look_runs(spec, data)
    done = {(r.row, r.depth, r.seed) for r in first.runs if r.state == "complete"}
    if any((*run_cell(spec, p), p.get("seed")) not in done for p in spec.grid()):
        return None
    contend = contend_trials(spec, data)
    if contend is not None and (contend.known is None or contend.untuned
                                or any(contend.held[c] < n for c, n in contend.known.items())):
        return None
    points, cells = round_points(spec, first)
    rates = contending_rates(spec, first, points) if contend is not None else {}
    contending = stage_trials(spec, rates, points)
    held = held_trials(spec, points, None, [r for r in data.runs if r.phase == "round"])
    return points, cells, contending, held + held_trials(spec, points, rates, data.contend_runs)
