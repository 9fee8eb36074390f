"""The tuning stage of a study: each cell's learning rate chosen from the stage's runs (:func:`tune_outcome`), the
rates it adds beyond its grid's edges, and running it to its end before the reported grid (:func:`settle_rates`)."""

from __future__ import annotations

import dataclasses
import math
import sys

from optuna.trial import TrialState

from ..report.notes import save_note, tuning_note
from ..studies.spec import TUNE_AT_BOUND, TUNE_EXTRA, TUNE_GRID, TUNE_MEANS, TUNED_LR, tune_name
from ..studies.storage import repeated_results
from .study import cell_text, load_study, trial_point
from .workers import await_other_workers, run_grid


@dataclasses.dataclass
class TuneOutcome:
    """What the tuning stage's runs say (:func:`tune_outcome`): each cell's chosen rate, the mean per rate, the
    rate to add next where the best rate is at the edge of what the cell tried, and the cells whose best rate sits
    at a declared bound."""

    choice: dict[str, float]
    means: dict[str, dict[str, float | None]]
    extend: dict[str, float]
    at_bound: dict[str, str]


def tune_value(attrs: dict, metric: str, floor=None) -> float:
    """A tuning run's value in the choice: its ``metric``; 0 when it diverged, has no finite value, or trained
    below the study's floor (:class:`ablations.studies.spec.Floor`: failed to train)."""
    value = attrs.get(metric)
    if value is None or not math.isfinite(value) or attrs.get("diverged"):
        return 0.0
    if floor is not None:
        classes = attrs.get("num_classes") or (attrs.get("config") or {}).get("num_classes")
        if floor.failed(attrs.get(floor.metric), classes):
            return 0.0
    return float(value)


def tune_outcome(spec, study, extra: dict[str, list[float]] | None = None) -> TuneOutcome:
    """Each cell's learning rate (:meth:`StudySpec.tune_key`: the variant and its other axes) from the tuning stage's
    ``study`` (its grid plus the ``extra`` rates already added): the one whose tuning trials have the highest mean
    ``spec.tune.metric`` (a validation metric) over the tuning seeds; a run that diverged or failed to train counts
    as 0; ties go to the rate listed first (the grid's order, then the added rates). Where the best rate is the
    smallest or largest the cell tried, :meth:`TuneSpec.beyond` names the rate to add (``extend``) or the bound
    it sits at (``at_bound``). A rate without a completed trial on every tuning seed is a ValueError (a mean over
    fewer seeds than the others' is not the stage's choice: another worker may still be training the rest)."""
    tune_spec, metric = spec.tune_stage(extra), spec.tune.metric

    values: dict[tuple[str, float], list[float]] = {}
    seeds: dict[tuple[str, float], set] = {}
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    repeats = repeated_results(complete)
    for t in complete:
        if t.user_attrs.get("surplus") or "duplicate_of" in t.user_attrs or t.number in repeats:
            continue
        params = trial_point(t)
        cell = (spec.tune_key(params), float(params["lr"]))
        values.setdefault(cell, []).append(tune_value(t.user_attrs, metric, spec.floor))
        seeds.setdefault(cell, set()).add(params["seed"])
    means: dict[str, dict[str, float | None]] = {}
    for params in tune_spec.grid():
        key, lr = spec.tune_key(params), float(params["lr"])
        runs = values.get((key, lr), [])
        means.setdefault(key, {})[repr(lr)] = sum(runs) / len(runs) if runs else None
    choice, extend, at_bound = {}, {}, {}
    for key, by_lr in means.items():
        missing = [lr for lr, mean in by_lr.items() if mean is None]
        if missing:
            raise ValueError(f"tuning stage incomplete: {cell_text(key)} no result at lr {', '.join(missing)}")
        short = [f"{lr} ({len(seeds[key, float(lr)])} of {len(spec.tune.seeds)})" for lr in by_lr
                 if not set(spec.tune.seeds) <= seeds[key, float(lr)]]
        if short:
            raise ValueError(f"tuning stage incomplete: {cell_text(key)} not every tuning seed has a result at lr "
                             f"{', '.join(short)}")
        choice[key] = float(max(by_lr, key=lambda lr: (by_lr[lr], -list(by_lr).index(lr))))
        rate, bound = spec.tune.beyond([float(lr) for lr in by_lr], choice[key])
        if rate is not None:
            extend[key] = rate
        elif bound is not None:
            at_bound[key] = bound
    return TuneOutcome(choice, means, extend, at_bound)


def choose_lrs(spec, study, extra: dict[str, list[float]] | None = None) -> tuple[dict[str, float],
                                                                                   dict[str, dict[str, float | None]]]:
    """(choice, cell -> {lr: mean}) of :func:`tune_outcome`."""
    outcome = tune_outcome(spec, study, extra)
    return outcome.choice, outcome.means


def stored_extra(storage, tune_study_name: str) -> dict[str, list[float]]:
    """The rates the tuning stage has added beyond its grid (``TUNE_EXTRA`` of its study; {} before any)."""
    try:
        return dict(load_study(storage, tune_study_name).user_attrs.get(TUNE_EXTRA) or {})
    except KeyError:  # the tuning stage's study does not exist yet
        return {}


def settle_rates(spec, storage, study_name: str, args, overrides: dict, study, *, chosen: bool) -> int:
    """The learning rates the reported grid trains at: the tuning stage run to its end (:func:`run_tuning`) unless
    they are ``chosen`` (stored with ``study`` already), then said on stderr and noted on the tuning stage's
    dashboard. Returns the exit code of a tuning stage that did not complete (0: the rates are settled)."""
    if not chosen:
        code = run_tuning(spec, storage, tune_name(study_name), args, overrides, study)
        if code:
            return code
    _say_choice(spec, study_name, study.user_attrs)
    _tuning_note(spec, storage, study_name, study.user_attrs)
    return 0


def run_tuning(spec, storage, tune_study: str, args, overrides: dict, study) -> int:
    """Run the tuning stage to its end: its grid, then, while a cell's best rate is at the edge of the rates it
    tried, one more rate beyond that edge (``TuneOutcome.extend``, within ``tune.bounds``) on the same tuning seeds;
    store the choice with ``study``. Returns the exit code of a stage that did not complete (0: done)."""
    while True:
        extra = stored_extra(storage, tune_study)  # as stored: another worker may have added rates meanwhile
        stage = spec.tune_stage(extra)
        code = run_grid(stage, storage, tune_study, args, overrides, stage="tune")
        if code and stored_extra(storage, tune_study) != extra:
            continue  # another worker extended the grid meanwhile: the points it added wait for this one too
        if code:
            print(f"study '{study.study_name}': the tuning stage is not complete; the reported grid waits for it "
                  "(rerun the same command)", file=sys.stderr)
            return code
        if not await_other_workers(stage, storage, tune_study):  # the choice reads every tuning run
            continue
        if stored_extra(storage, tune_study) != extra:  # another worker extended the grid meanwhile: train it too
            continue
        outcome = tune_outcome(spec, load_study(storage, tune_study), extra)
        if not outcome.extend:
            break
        for key, rate in outcome.extend.items():
            extra.setdefault(key, []).append(rate)
        load_study(storage, tune_study).set_user_attr(TUNE_EXTRA, extra)
        print(f"study '{study.study_name}': best learning rate at the edge of the rates tried; adding "
              + "; ".join(f"{cell_text(k)} {rate:g}" for k, rate in outcome.extend.items())
              + f" (bounds {list(spec.tune.bounds)})", file=sys.stderr)
    study.set_user_attr(TUNED_LR, outcome.choice)
    study.set_user_attr(TUNE_MEANS, outcome.means)
    study.set_user_attr(TUNE_EXTRA, extra)
    study.set_user_attr(TUNE_AT_BOUND, outcome.at_bound)
    study.set_user_attr(TUNE_GRID, spec.tune.as_dict())
    return 0


def check_tuning_grid(spec, study) -> None:
    """A study whose stored rates were chosen on another tuning grid than the file's cannot continue (ValueError):
    its reported trials would mix two choices."""
    stored = study.user_attrs.get(TUNE_GRID) if spec.tune is not None else None
    if stored is not None and stored != spec.tune.as_dict():
        raise ValueError(f"study '{study.study_name}' chose its learning rates with the tuning grid {stored}; the "
                         f"study file now has {spec.tune.as_dict()}: its reported trials would mix two choices. Pass "
                         "--study-name NEW_NAME for a new study, or restore the file's tune section")


def _say_choice(spec, study_name: str, attrs: dict) -> None:
    """The rate each cell trains at, and the cells whose best rate sits at a bound of the tuning grid, on stderr."""
    print(f"study '{study_name}': learning rate per variant, chosen on tuning seeds {list(spec.tune.seeds)} by "
          f"mean {spec.tune.metric}: " + "; ".join(f"{cell_text(k)} {v:g}" for k, v in attrs[TUNED_LR].items()),
          file=sys.stderr)
    at_bound = attrs.get(TUNE_AT_BOUND) or {}
    if at_bound:
        print(f"study '{study_name}': best learning rate at a bound of the tuning grid {list(spec.tune.bounds)} "
              "(the report names these rows): " + "; ".join(f"{cell_text(k)} {side}" for k, side in at_bound.items()),
              file=sys.stderr)


def _tuning_note(spec, storage, study_name: str, attrs: dict) -> None:
    """The tuning stage's optuna-dashboard note: the learning rate each variant got (a failure is one line)."""
    try:
        note = tuning_note(study_name, attrs[TUNED_LR], attrs.get(TUNE_MEANS) or {}, metric=spec.tune.metric,
                           seeds=spec.tune.seeds)
        save_note(load_study(storage, tune_name(study_name)), note)
    except Exception as exc:  # noqa: BLE001 - a note must never stop the study
        print(f"tuning stage's dashboard note not saved: {' '.join(str(exc).split()) or type(exc).__name__}",
              file=sys.stderr)
