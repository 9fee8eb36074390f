"""The study in storage: creating it, its grid points and their keys, the learning rates stored with it, retrying
failed points, following an edited study file, and checking the points before anything runs. The tuning stage's
choice of those rates is :mod:`.tuning`."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import NamedTuple

import optuna
from optuna.distributions import (
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    check_distribution_compatibility,
)
from optuna.trial import TrialState

import data
import lit_modules

from .. import layout
from ..config import RunConfig
from ..machine.modes import choose_mode, model_size, probe, tokens
from ..report.notes import READING_ATTR, reading_line
from ..studies.overrides import check_stored
from ..studies.spec import TUNED_LR
from ..studies.storage import point_key
from .objective import categorical_axes, form_of, suggest

# torch (about 1.7 s, measured with python -X importtime) is imported where a cell's precision modes are timed, and
# the models and datasets (lit_modules, data: lazy packages that load torch and Lightning on first use) are reached
# through their packages, so that --help and --list answer without them.

REMOVED = "removed_from_study_file"  # user attr of a WAITING trial set aside because its point left the study file
STOPPED = "stopped_by"  # user attr of a trial failed by Ctrl-C or SIGTERM: SIGINT | SIGTERM


class Stored(NamedTuple):
    """What a stored study has done (:func:`ablations.run.plan.stored_done`): trials done per stage, where it is stored, and for a grid
    the wall times of its completed trials by (variant, depth) cell, both stages, with the grid points not done yet
    (both stages), and the mode facts of its completed runs (:func:`ablations.run.kept_modes.mode_facts`, both
    stages, in order), with the grid points done (``finished``: (stage, point key) pairs). A trial's wall time is as
    it ran, beside the other workers of its run."""

    tune_done: int
    report_done: int
    where: str
    seconds: dict[tuple[str, int | None], list[float]] = {}
    left: tuple[dict, ...] = ()
    modes: tuple[dict, ...] = ()
    finished: frozenset[tuple[str, str]] = frozenset()

    def joined(self, added: Stored) -> Stored:
        """This storage's trials with what a runs file ``added`` (its rows for points not done here,
        :func:`ablations.run.imported.imported_done` with ``known=self.finished``): what a run that imports the file
        into this storage would have done."""
        keys = {key for _, key in added.finished}
        seconds = {cell: [*self.seconds.get(cell, []), *added.seconds.get(cell, [])]
                   for cell in {**self.seconds, **added.seconds}}
        return Stored(self.tune_done + added.tune_done, self.report_done + added.report_done,
                      f"{self.where} and {added.where}", seconds,
                      tuple(p for p in self.left if point_key(p) not in keys), self.modes + added.modes,
                      self.finished | added.finished)


def load_study(storage, study_name: str):
    return optuna.load_study(study_name=study_name, storage=storage)


def stored_choice(storage, study_name: str) -> dict[str, float] | None:
    """The learning rates the tuning stage chose, as stored with the study (None: the study has no tuning stage)."""
    return load_study(storage, study_name).user_attrs.get(TUNED_LR)


def cell_text(key: str) -> str:
    variant, cell = json.loads(key)
    return variant + "".join(f" {axis}={value}" for axis, value in cell) + ":"


def measure_modes(spec, overrides: dict, results_dir: Path) -> None:
    """Precision ``auto`` on a CPU whose signature no modes table matches: measure the cells the study's points need
    once, here, before any worker starts (``ablations.machine.modes``; cached under ``<results_dir>/device/``), so that the
    workers find them instead of each measuring while the others train. One line per cell measured. Torch is
    imported only when a cell has to be measured (a matching table or the cache answers without it)."""
    threads = overrides.get("threads") or os.cpu_count() or 1
    seen = set()
    for params in spec.points():
        config = spec.run_config(params, overrides)
        if config.precision != "auto" or config.accelerator not in ("auto", "cpu"):
            continue
        shape = data.dataset_shape(config)
        patch = config.patch_size or shape["patch_size"]
        cell = (config.embed_dim, tokens(shape["img_size"], patch))
        if cell in seen or not choose_mode("cpu", *cell, results_dir=results_dir, threads=threads).source.startswith(
                "rule:"):
            continue
        seen.add(cell)
        import torch

        if torch.cuda.is_available():  # accelerator auto trains on the GPU: its rule needs no measurement
            return
        size = model_size(config, shape["img_size"], patch, shape["in_chans"], shape["num_classes"])
        print(f"precision auto, width {cell[0]}, {cell[1]} tokens, {threads} thread(s): timing the four precision "
              "modes on this CPU before the first trial (about a minute, once per machine: cached in "
              f"{layout.device_dir(results_dir)})", file=sys.stderr, flush=True)
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            mode = choose_mode("cpu", *cell, results_dir=results_dir, threads=threads,
                               measure=probe(size, config.batch_size))
        finally:
            torch.set_num_threads(before)
        if "(measured now)" in mode.source:  # not when another process measured it while this one waited
            print(f"precision auto, width {cell[0]}, {cell[1]} tokens, {threads} thread(s): measured the four "
                  f"modes here, {mode.key} ({mode.source})", file=sys.stderr)


def retry_failed_points(study, spec, storage, *, only_stopped: bool = False) -> list[str]:
    """Queue a retry (same parameters, same run folder, so it resumes from its last checkpoint) of every grid
    point whose trials all FAILed: an exception in training, Ctrl-C, SIGTERM. ``enqueue_trial(...,
    skip_if_exists=True)`` counts a FAIL trial as existing, so without this such a point never ran again and every
    rerun exited 1. Dead workers' trials are still RUNNING here; the heartbeat check retries those. The retry
    callback's ``max_retry`` bounds the attempts per point. Each run does this once at its start; running workers
    do it between trials with ``only_stopped``, for the trials that Ctrl-C or SIGTERM stopped (:data:`STOPPED`),
    so that the other workers of a study take over a preempted worker's trial (a trial that failed by itself is
    retried once per run, not by every worker in a row). Returns the numbers of the trials it queued a retry of."""
    retry = storage.get_heartbeat_stale_trial_callback()
    if retry is None:
        return []
    grid = {point_key(p) for p in spec.grid()}
    live, failed = set(), {}
    for t in study.get_trials(deepcopy=False):
        key = point_key(trial_point(t))
        if t.state == TrialState.FAIL:
            if key in grid and (key not in failed or t.number > failed[key].number):
                failed[key] = t
        elif t.state != TrialState.PRUNED or not ({"surplus", "duplicate_of"} & set(t.user_attrs)):
            live.add(key)
    queued, exhausted = [], []
    for key, t in failed.items():
        if key in live or (only_stopped and not t.user_attrs.get(STOPPED)):
            continue
        before = len(study.get_trials(deepcopy=False))
        retry(study, copy.deepcopy(t))  # adds a WAITING copy unless the point used up its retries
        (queued if len(study.get_trials(deepcopy=False)) > before else exhausted).append(str(t.number))
    if queued:
        print(f"retrying failed trial(s) {', '.join(queued)} (same parameters)", file=sys.stderr)
    if exhausted and not only_stopped:
        print(f"not retrying failed trial(s) {', '.join(exhausted)}: retries used up", file=sys.stderr)
    return queued


def grid_keys(spec) -> set[str] | None:
    return {point_key(p) for p in spec.grid()} if spec.kind == "grid" else None


def follow_study_file(study, spec, storage) -> None:
    """Make the stored grid follow an edited study file. Points added to the file have just been enqueued (only
    those: ``skip_if_exists``), so a rerun runs just them. A point removed from the file keeps its finished trials
    (the report still includes them: pass --study-name NEW_NAME for a study of the new grid alone), but its WAITING
    trials are set aside (:func:`_set_aside_removed`) instead of running; a point added back later is enqueued again.
    Changed variants, or an axis that changes kind, are refused before this (:func:`check_same_choices`)."""
    grid = {point_key(p): p for p in spec.grid()}
    set_aside = _set_aside_removed(study, storage, set(grid))
    if set_aside:
        print(f"not running waiting trial(s) {', '.join(map(str, set_aside))}: their grid points are no longer in "
              "the study file", file=sys.stderr)
    taken, kept = set(), 0
    for t in study.get_trials(deepcopy=False):
        key = point_key(trial_point(t))
        if t.user_attrs.get(REMOVED):
            continue
        if key in grid:
            taken.add(key)
        elif t.state == TrialState.COMPLETE:
            kept += 1
    for key in [k for k in grid if k not in taken]:  # only trials set aside had this point: it is back in the file
        study.enqueue_trial(grid[key])
    if kept:
        print(f"{kept} completed trial(s) of grid points no longer in the study file stay in the storage (the report "
              "includes them)", file=sys.stderr)


def _set_aside_removed(study, storage, grid: set[str]) -> list[int]:
    """PRUNE the WAITING trials of points that are not in the grid (``surplus`` and :data:`REMOVED` set: the report
    and the progress count skip them) and return their numbers. Each is claimed first (WAITING -> RUNNING, which
    fails if a worker has just taken it), so a trial that has started is never touched."""
    numbers = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if point_key(trial_point(t)) in grid:
            continue
        if storage.set_trial_state_values(t._trial_id, TrialState.RUNNING):
            storage.set_trial_user_attr(t._trial_id, "surplus", True)
            storage.set_trial_user_attr(t._trial_id, REMOVED, True)
            storage.set_trial_state_values(t._trial_id, TrialState.PRUNED)
            numbers.append(t.number)
    return numbers


def validate_points(spec, overrides: dict, check_data: bool = True) -> None:
    """Build every grid point's config (and check its residual options and, with ``check_data``, its data
    folder) before anything is stored; the tuning stage's points too."""
    if check_data:
        for config in data_configs(spec, overrides):
            check_data_folder(config)
    if spec.tune is not None:
        validate_points(spec.tune_stage(), overrides, check_data=False)
        spec = dataclasses.replace(spec, tune=None)  # its points' lr comes from the tuning stage
    _make_pruner(spec)
    seen = set()
    for params in spec.points():
        config = spec.run_config(params, overrides)
        key = (config.residual, repr(sorted(config.residual_options.items())), config.depth, config.embed_dim,
               config.class_attention_blocks)
        if key not in seen:
            seen.add(key)
            check_residual(config)


def data_configs(spec, overrides: dict) -> list:
    """One config per distinct (dataset, data_dir, dataset_options) the study's points (and its tuning stage's)
    train on."""
    specs = [spec] + ([spec.tune_stage()] if spec.tune is not None else [])
    found = {}
    for stage in specs:
        points = stage.grid() if stage.kind == "grid" else [{"variant": v.label} for v in stage.variants]
        for params in points:
            config = stage.run_config(params, overrides)
            found.setdefault((config.dataset, config.data_dir, repr(sorted(config.dataset_options.items())),
                              config.patch_size), config)
    return list(found.values())


def check_data_folder(config) -> None:
    """Constructing a DataModule checks its folder (missing / malformed: data.DataError) without loading data."""
    try:
        data.build_datamodule(config.dataset, data_dir=config.data_dir,
                              **data.fitted_options(config.dataset, config.dataset_options, config.patch_size))
    except TypeError as exc:
        raise ValueError(f"invalid dataset option for '{config.dataset}': {exc}") from None


def check_residual(config) -> None:
    variant = lit_modules.RESIDUALS[config.residual]
    options = variant.validate_options(dict(config.residual_options),
                                       backbone={"class_attention_blocks": config.class_attention_blocks})
    variant.check_options(options, dim=config.embed_dim, depth=config.depth)


def create_study(spec, storage, study_name: str, seed: int):
    sampler = optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(storage=storage, study_name=study_name, direction=spec.direction, sampler=sampler,
                                pruner=_make_pruner(spec), load_if_exists=True)
    if spec.kind == "grid" and READING_ATTR not in study.user_attrs:  # set first: optuna-dashboard lists it first
        study.set_user_attr(READING_ATTR, reading_line(None))
    check_same_choices(study, spec)
    check_stored(study, spec)
    if study.metric_names is None:
        study.set_metric_names([spec.metric])
    for key, value in (("spec_source", spec.source), ("budget", spec.budget), ("kind", spec.kind),
                       ("description", spec.description), ("metric", spec.metric)):
        study.set_user_attr(key, value)
    return study


def _make_pruner(spec):
    """The study's pruner, only the one its file names (each takes different options); ValueError (one line) for
    an option it does not take."""
    options = {k: v for k, v in spec.pruner.items() if k != "type"}
    try:
        if spec.pruner["type"] == "median":
            return optuna.pruners.MedianPruner(**options)
        if spec.pruner["type"] == "hyperband":
            return optuna.pruners.HyperbandPruner(**({"max_resource": spec.base.get("max_epochs", 30)} | options))
        return optuna.pruners.NopPruner()
    except TypeError as exc:
        raise ValueError(f"study file '{spec.source}': pruner {spec.pruner}: {exc}") from None


def check_same_choices(study, spec) -> None:
    """Optuna fixes a parameter's kind for the life of a study, and a categorical's choices: a study file whose
    variants (or label axes, or searched choices) changed, or whose numeric axis changed kind (integers to numbers,
    a linear range to a log one), cannot continue the stored study (its first new trial would FAIL with e.g.
    "CategoricalDistribution does not support dynamic value space"). Say so before anything is written. New values
    of a numeric axis (another seed or depth) are fine: the rerun runs just the new points."""
    expected = _expected_distributions(spec, categorical_axes(study, spec))
    stored = {(name, dist) for t in study.get_trials(deepcopy=False) for name, dist in t.distributions.items()}
    for name, old in sorted(stored, key=lambda item: item[0]):
        new = expected.get(name)
        if new is None:
            continue
        try:
            check_distribution_compatibility(old, new)
        except ValueError as exc:
            if isinstance(old, CategoricalDistribution) and isinstance(new, CategoricalDistribution):
                raise ValueError(
                    f"study '{study.study_name}' in the storage was run with {name} = {list(old.choices)}, the study "
                    f"file has {list(new.choices)}; a study's choices cannot change: pass --study-name NEW_NAME for a "
                    "new study, or restore the file") from None
            raise ValueError(
                f"study '{study.study_name}' in the storage was run with {name} as {_describe(old)}, the study file "
                f"makes it {_describe(new)} ({exc}); pass --study-name NEW_NAME for a new study, or restore the file"
            ) from None


def _expected_distributions(spec, categorical: frozenset[str]) -> dict:
    """Each parameter's distribution as the objective will suggest it (:func:`ablations.run.objective.suggest`)."""
    found: dict = {}
    for variant in spec.variants:
        recorder = _Recorder(variant.label)
        suggest(recorder, spec, categorical)
        found |= recorder.found
    return found


class _Recorder:
    """Stands in for an Optuna trial in ``suggest``: records the distribution each parameter would get."""

    def __init__(self, variant: str) -> None:
        self.variant = variant
        self.found: dict = {}

    def _record(self, name: str, make) -> None:
        try:
            self.found[name] = make()
        except ValueError:  # an invalid range: the trial itself reports it
            pass

    def suggest_categorical(self, name, choices):
        self._record(name, lambda: CategoricalDistribution(choices))
        return self.variant if name == "variant" else choices[0]

    def suggest_int(self, name, low, high, step=1, log=False):
        self._record(name, lambda: IntDistribution(low, high, log=log, step=step))
        return low

    def suggest_float(self, name, low, high, *, step=None, log=False):
        self._record(name, lambda: FloatDistribution(low, high, log=log, step=step))
        return low


def _describe(dist) -> str:
    if isinstance(dist, CategoricalDistribution):
        return f"one of {list(dist.choices)}"
    kind = "an integer" if isinstance(dist, IntDistribution) else "a number"
    return f"{kind} in [{dist.low}, {dist.high}]" + (" on a log scale" if dist.log else "")


def done_trials(study) -> list:
    """The trials that count as done: COMPLETE or PRUNED, not surplus or duplicate."""
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
            if not t.user_attrs.get("surplus") and "duplicate_of" not in t.user_attrs]


def trial_point(trial) -> dict:
    """A trial's grid point: the parameters it was enqueued with (its suggested ones when it was not)."""
    return trial.system_attrs.get("fixed_params", trial.params)


def count_done(study, grid: set[str] | None = None) -> int:
    """Trials done (:func:`done_trials`); for a grid, the points of ``grid`` done (trials of points removed from
    the study file do not count)."""
    done = done_trials(study)
    if grid is None:
        return len(done)
    return len({key for t in done if (key := point_key(trial_point(t))) in grid})


def earlier_forms(study) -> dict[str, int]:
    """The study's completed trials built in an earlier form of their design, counted by variant: the form a trial
    recorded (``layout.FORM_KEY``, with the options added since filled in as they were: ``lit_modules.upgraded_form``)
    is not the form this version builds for the config it trained, so a default of its design changed since.
    Trials that recorded no form, or whose config this version cannot build, are not counted."""
    counts = {}
    for t in done_trials(study):
        recorded, config = t.user_attrs.get(layout.FORM_KEY), t.user_attrs.get("config")
        if not recorded or not isinstance(config, dict):
            continue
        try:
            today = layout.canonical_form(form_of(RunConfig.from_dict(config)))
        except (ValueError, TypeError, KeyError):
            continue
        if layout.canonical_form(lit_modules.upgraded_form(recorded)) != today:
            variant = str(t.params.get("variant", config.get("residual", "?")))
            counts[variant] = counts.get(variant, 0) + 1
    return counts


def earlier_forms_warning(study) -> str | None:
    """One line naming a stored study's trials of an earlier form (:func:`earlier_forms`), None when it has none."""
    counts = earlier_forms(study)
    if not counts:
        return None
    return (f"warning: study '{study.study_name}': {sum(counts.values())} completed trial(s) were built in an "
            "earlier form of their design (a default has changed since): "
            + ", ".join(f"{v} {n}" for v, n in sorted(counts.items()))
            + "; they stay done and the report notes the rows that mix forms; to train them in today's form, "
            "continue a new study from its runs.csv with --import-runs (rows of an earlier form train again)")
