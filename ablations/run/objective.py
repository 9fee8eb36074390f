"""One Optuna trial: parameters → RunConfig → ``run_training`` → ``trial.user_attrs``.

The trial's TensorBoard dir and checkpoints are named after the *original* trial number, so a trial retried
after its worker died (heartbeat + ``RetryHeartbeatStaleTrialCallback``) writes to the same place and resumes
from its last checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

import data
import lit_modules

from .. import layout
from ..dashboard import run_name, study_columns
from ..studies.spec import SPAWN_STRATEGIES, StudySpec
from ..studies.storage import retried_trial_number, set_user_attrs
from ..training import run_training, with_mode
from . import kept_modes
from .kept_modes import keep_mode, kept_for

# torch (about 1.7 s, measured with python -X importtime) and optuna_integration (which loads Lightning: seconds) are
# imported where a trial uses them, and the model and the datasets are reached through their packages (lit_modules,
# data: lazy, they load torch on first use), so that --help and --list answer without torch.

log = logging.getLogger("ablations.run")

#: Summary keys stored in ``trial.user_attrs`` besides the whole summary (for quick filtering in the dashboard).
_SURPLUS = "surplus"
__all__ = ["SPAWN_STRATEGIES", "Objective", "suggest"]  # SPAWN_STRATEGIES: defined in .spec, kept importable here


def suggest(trial, spec: StudySpec, categorical_axes: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Ask the trial for its parameters: the variant as a categorical, grid axes by :func:`suggest_axis`
    (``categorical_axes``: axes a stored study already holds as categoricals), searched options conditioned on
    the variant (``<label>.<option>``)."""
    params = {"variant": trial.suggest_categorical("variant", [v.label for v in spec.variants])}
    for axis, values in spec.axes.items():
        params[axis] = suggest_axis(trial, axis, values, grid=spec.kind == "grid",
                                    categorical=axis in categorical_axes, bounds=spec.axis_bounds.get(axis))
    for option, dist in spec.space.get(params["variant"], {}).items():
        name = f"{params['variant']}.{option}"
        if "choices" in dist:
            params[name] = trial.suggest_categorical(name, dist["choices"])
        elif isinstance(dist["low"], int) and isinstance(dist["high"], int) and not dist.get("log"):
            params[name] = trial.suggest_int(name, dist["low"], dist["high"])
        else:
            params[name] = trial.suggest_float(name, float(dist["low"]), float(dist["high"]),
                                               log=bool(dist.get("log", False)))
    return params


def suggest_axis(trial, axis: str, values: list, *, grid: bool, categorical: bool = False,
                 bounds: tuple[float, float] | None = None) -> Any:
    """One axis, numeric where its values are numbers, so optuna-dashboard orders its slice, contour and
    importance axes by value (a categorical is ordered as text: 12, 2, 6):

    - a grid (every point enqueued, so only the listed values ever run): integers as ``suggest_int`` and other
      numbers as ``suggest_float`` over [min, max] (log scale when all positive and spanning 100× or more);
    - a search (the sampler draws the values): integers in equal steps as ``suggest_int`` with that step;
    - anything else (labels, booleans, mixed types, unevenly spaced values a search must not interpolate, or
      ``categorical``) as a categorical.

    ``bounds``: a grid axis whose values may grow beyond the listed ones (the tuning stage's extended learning
    rates): ``suggest_float`` over the whole (low, high) on a log scale, the same distribution whatever was added."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    ints = numbers and all(isinstance(v, int) for v in values)
    low, high = (min(values), max(values)) if numbers else (None, None)
    if categorical or not numbers:
        return trial.suggest_categorical(axis, values)
    if grid and bounds is not None:
        return trial.suggest_float(axis, float(bounds[0]), float(bounds[1]), log=True)
    if grid and ints:
        return trial.suggest_int(axis, low, high)
    if grid:
        return trial.suggest_float(axis, float(low), float(high), log=low > 0 and high >= 100 * low)
    steps = sorted(set(values))
    step = steps[1] - steps[0] if len(steps) > 1 else 1
    if ints and steps == list(range(low, high + 1, step)):
        return trial.suggest_int(axis, low, high, step=step)
    return trial.suggest_categorical(axis, values)


def categorical_axes(study, spec: StudySpec) -> frozenset[str]:
    """Axes a stored study holds as categoricals although its file's values are numeric (a stored study keeps the
    distribution kind it began with): they stay categorical, since Optuna fixes a parameter's distribution kind
    for the life of a study."""
    found = set()
    for t in study.get_trials(deepcopy=False):
        found |= {n for n, d in t.distributions.items() if n in spec.axes and isinstance(d, CategoricalDistribution)}
    return frozenset(found)


@dataclass(frozen=True)
class Prepared:
    """A trial ready to train (:meth:`Objective.prepare`): its point, config, run folder, checkpoint folder, the
    Lightning checkpoint a retry resumes from (None: from scratch), the number of the trial it retries, and whether
    it resumes the dead attempt's training (the engine's own checkpoint, for a stacked retry)."""

    params: dict[str, Any]
    config: Any
    run_name: str
    ckpt_dir: Path
    ckpt_path: Path | None
    original: int | None
    resume: bool = False


class Objective:
    """Callable for ``study.optimize``: trains one configuration and returns ``summary[spec.metric]``."""

    def __init__(self, spec: StudySpec, *, log_root: Path, overrides: dict[str, Any] | None = None,
                 keep_checkpoints: bool = False, loggers: tuple[str, ...] = (),
                 results_dir: str | Path = layout.RESULTS_DIR, tuned: dict[str, float] | None = None,
                 kept_from: tuple | None = None) -> None:
        self.spec = spec
        self.kept: dict = {}  # cell -> the mode precision auto keeps in this study (.kept_modes; refresh_kept)
        self.kept_from = kept_from  # (storage, study name, stage, --retrain-mode modes): where refresh_kept reads
        self._kept_read = -math.inf  # when refresh_kept last read them
        self.results_dir = Path(results_dir)
        self.tuned = tuned  # the tuning stage's learning rate per cell (StudySpec.tune_key); None: the study's own
        self.log_root = Path(log_root)
        self.overrides = dict(overrides or {})
        self.keep_checkpoints = keep_checkpoints
        self.loggers = tuple(loggers)
        self._categorical: frozenset[str] | None = None  # read from the study at the first trial

    def refresh_kept(self) -> None:
        """Read the study's kept modes again (:mod:`.kept_modes`): other workers and machines complete runs too. At
        most every :data:`.kept_modes.REFRESH_S` seconds (reading every trial of a study takes about a second)."""
        if self.kept_from is not None and time.monotonic() - self._kept_read >= kept_modes.REFRESH_S:
            self.kept = kept_modes.stored_kept(*self.kept_from)
            self._kept_read = time.monotonic()

    def config(self, params: dict[str, Any], *, keep: bool = True):
        """The point's RunConfig with this objective's overrides (:meth:`StudySpec.run_config`), in a study with a
        tuning stage its variant's chosen learning rate, and for precision ``auto`` the mode the study's runs so far
        trained in (:mod:`.kept_modes`; ``keep=False``: ``auto`` as the study file says)."""
        if self.spec.tune is None or self.spec.stage == "tune":
            config = self.spec.run_config(params, self.overrides)
        elif self.tuned is None:
            raise ValueError(f"study '{self.spec.study_name}' has a tuning stage but no chosen learning rates")
        else:
            config = self.spec.run_config(params, {"lr": self.tuned[self.spec.tune_key(params)]} | self.overrides)
        return keep_mode(config, self.kept) if keep else config

    def __call__(self, trial) -> float:
        return self.train(trial, self.prepare(trial))

    def prepare(self, trial, engine: bool = False) -> Prepared:
        """Everything before training: the trial's point (``TrialPruned`` for a surplus or duplicate grid trial),
        its config, run folder and checkpoint to resume, and the user attrs that say what it is. ``engine``: the
        stacked engine trains it, which resumes a retry from its own checkpoint (:mod:`ablations.engine.loop`), not
        from Lightning's."""
        stored = trial.study.get_trials(deepcopy=False)
        frozen = next(t for t in stored if t.number == trial.number)
        if self.spec.kind == "grid" and "fixed_params" not in frozen.system_attrs:
            # Another worker took the last enqueued point between our check and ask(): nothing left to run.
            trial.set_user_attr(_SURPLUS, True)
            raise optuna.TrialPruned("grid exhausted: surplus trial")
        if self._categorical is None:
            self._categorical = categorical_axes(trial.study, self.spec)
        params = suggest(trial, self.spec, self._categorical)
        duplicate = self._duplicate_of(trial, params)
        if duplicate is not None:
            trial.set_user_attr("duplicate_of", duplicate)
            raise optuna.TrialPruned(f"grid point already run by trial {duplicate}")

        asked = self.config(params, keep=False)  # as the study file says (precision auto unresolved)
        kept = kept_for(asked, self.kept)  # the study's mode, not this machine's
        config = asked if kept is None else with_mode(asked, kept)
        original = retried_trial_number(frozen)
        run_name = self.run_name(trial, params, config, original)
        ckpt_dir = self.log_root / run_name / layout.CHECKPOINTS
        model = asked.model_config(data.dataset_shape(asked))
        form = layout.canonical_form(model_form(model))
        if original is not None:  # a retry: continue the dead attempt's training, unless it began in another form
            ckpt_path = None if engine else _usable_checkpoint(ckpt_dir / "last.ckpt")  # the engine reads its own
            resume = engine or ckpt_path is not None
            began = next((t.user_attrs.get(layout.FORM_KEY) for t in stored if t.number == original), None)
            if resume and began and layout.canonical_form(lit_modules.upgraded_form(began)) != form:
                log.warning("trial %d began in an earlier form of its design (a default changed since: %s, now %s); "
                            "not resuming its checkpoint: trial %d starts from scratch", original, began, form,
                            trial.number)
                ckpt_path, resume = None, False
        else:  # a first attempt never resumes: a checkpoint here is from an earlier study under this name
            ckpt_path, resume = None, False
            if (ckpt_dir / "last.ckpt").exists():
                log.warning("%s is left from an earlier run under this study name (was the storage reset?); "
                            "not resuming it: trial %d starts from scratch", ckpt_dir / "last.ckpt", trial.number)
        # phase: tune | report (the report tables read report trials only); resume_checkpoint: what was offered
        # (whether Lightning did restore it, ``resumed_from_checkpoint``, ``start_epoch``, ``start_global_step``,
        # and what this process trained itself come with the run's summary); config: the study's, precision auto
        # unresolved (what the run trained in, kept or its own, is the summary's precision and fused_attn)
        set_user_attrs(trial, {
            "run_name": run_name, "phase": self.spec.stage, "worker": worker_id(),
            "config": jsonable(asked.to_dict()),
            layout.MODEL_KEY: jsonable(model.to_dict()),
            layout.FORM_KEY: form,
            "log_dir": str(self.log_root / run_name),
            "resume_checkpoint": None if ckpt_path is None else str(ckpt_path),
            **({} if original is None else {"retry_of": original}),
            "mode_source": None if kept is None else kept.source})  # None: the run's own (a retry's is its own)
        return Prepared(params, config, run_name, ckpt_dir, ckpt_path, original, resume)

    def train(self, trial, prepared: Prepared) -> float:
        """Train a prepared trial as a plain run (``run_training``) and return its objective value."""
        from optuna_integration import PyTorchLightningPruningCallback

        # The pruning callback reports val acc per epoch (the curve the report draws); it prunes only when the
        # study's pruner says so (grids use NopPruner: every point runs in full).
        callbacks = [PyTorchLightningPruningCallback(trial, monitor="val/acc")]
        try:
            summary = run_training(prepared.config, log_dir=self.log_root, run_name=prepared.run_name,
                                   extra_callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                                   checkpoint_dir=prepared.ckpt_dir, ckpt_path=prepared.ckpt_path,
                                   hparams=self.hparams(prepared.params), loggers=self.loggers,
                                   experiment=self.spec.study_name, results_dir=self.results_dir)
            _check_pruned(callbacks[0], summary)
        except optuna.TrialPruned as exc:  # a finished trial too: keep the epochs it ran, drop its checkpoints
            self.pruned(trial, prepared, getattr(exc, "run_summary", None))
            raise
        except SystemExit as exc:
            # Lightning answers Ctrl-C in fit with its graceful shutdown and sys.exit(1), which optuna does not
            # catch: the trial would stay RUNNING until its heartbeat went stale and the CLI would exit 1 without
            # its message. As a KeyboardInterrupt the trial FAILs (its checkpoints kept: the next run resumes it).
            raise KeyboardInterrupt("interrupted during training") from exc
        return self.conclude(trial, prepared, summary)

    def pruned(self, trial, prepared: Prepared, summary: dict | None) -> None:
        """A pruned trial keeps the epochs it ran as user attrs; its checkpoints go."""
        set_user_attrs(trial, jsonable(summary or {}))
        if not self.keep_checkpoints:
            shutil.rmtree(prepared.ckpt_dir, ignore_errors=True)

    def conclude(self, trial, prepared: Prepared, summary: dict) -> float:
        """A trained trial: its summary as user attrs, its checkpoints removed, its objective value returned."""
        set_user_attrs(trial, jsonable(summary))
        if not self.keep_checkpoints:
            shutil.rmtree(prepared.ckpt_dir, ignore_errors=True)
        value = summary.get(self.spec.metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return 0.0 if self.spec.direction == "maximize" else float("inf")
        return float(value)

    def run_name(self, trial, params: dict[str, Any], config, original: int | None) -> str:
        """The trial's run folder (:func:`ablations.dashboard.run_name`): ``<variant>/depth=<d>/seed=<s>[/...]``,
        plus ``/trial_<n>`` for a search (its points can repeat) or when a first attempt finds the folder taken
        (left by an earlier study under this name). A retry continues the folder of the trial it retries."""
        if original is not None:
            dead = next((t for t in trial.study.get_trials(deepcopy=False) if t.number == original), None)
            if dead is not None and dead.user_attrs.get("run_name"):
                return dead.user_attrs["run_name"]
        axes = list(self.spec.axes)
        plain = run_name(params, config, axes)
        number = original if original is not None else trial.number
        if self.spec.kind != "grid":
            return run_name(params, config, axes, trial=number)
        if original is None and (self.log_root / plain).exists():
            unique = run_name(params, config, axes, trial=number)
            log.warning("run folder %s exists (left by an earlier study under this name? the storage was reset?); "
                        "trial %d writes to %s instead", self.log_root / plain, trial.number, unique)
            return unique
        return plain

    def hparams(self, params: dict[str, Any]) -> dict[str, Any]:
        """The trial's values of the study's HParams columns (:func:`ablations.dashboard.study_columns`)."""
        return {name: params[name] for name in study_columns(self.spec) if name in params}

    def _duplicate_of(self, trial, params: dict[str, Any]) -> int | None:
        """For grids: the number of another COMPLETE or earlier RUNNING trial with the same point (two machines
        enqueueing the same grid at the same instant can duplicate a WAITING trial; this keeps runs unique)."""
        if self.spec.kind != "grid":
            return None

        for other in trial.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)):
            if other.number == trial.number or other.params != params:
                continue
            if other.state == TrialState.COMPLETE or other.number < trial.number:
                return other.number
        return None


def worker_id(pid: int | None = None) -> str:
    """``<host>:<pid>`` of the process that trains a trial (the ``worker`` user attr): which machine and process
    ran it, for a study shared by many. ``pid``: another process of this machine (default: this one)."""
    return f"{socket.gethostname()}:{os.getpid() if pid is None else pid}"


def _check_pruned(pruning, summary: dict[str, Any]) -> None:
    """Under ``ddp_spawn`` the ranks only flag a pruned trial in the storage: raise ``TrialPruned`` here (with the
    summary of the epochs run, as a single-process prune has it). Nothing happens for single-process trials."""
    try:
        pruning.check_pruned()
    except optuna.TrialPruned as exc:
        exc.run_summary = summary
        raise


def _usable_checkpoint(path: Path) -> Path | None:
    """The checkpoint to resume from, or None. A missing, corrupt or unreadable file means a warning and a trial
    that restarts from scratch, not a failed study (a corrupt file is set aside as ``last.corrupt``)."""
    if not path.is_file():
        log.warning("no checkpoint %s to resume (the dead attempt saved none, or it was removed); restarting the "
                    "trial from scratch", path)
        return None
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
        if "state_dict" not in state or "epoch" not in state:
            raise ValueError("not a Lightning checkpoint")
    except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint means: start again
        bad = path.with_suffix(".corrupt")
        path.replace(bad)
        log.warning("checkpoint %s is unusable (%s); moved to %s, restarting the trial from scratch",
                    path, str(exc).splitlines()[0] if str(exc) else type(exc).__name__, bad.name)
        return None
    return path


def jsonable(value: Any) -> Any:
    """Plain JSON types for Optuna user attrs (numpy scalars, tuples, Paths, NaN → None)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


#: The swappable parts of a model as its form names them: part -> (the config field of its kind, of its options).
FORM_PARTS = {"residual": ("residual", "residual_options"), "attention": ("attention", "attention_options"),
              "norm": ("norm_layer", "norm_options"),
              "parametrization": ("parametrization", "parametrization_options")}


_FORMS: dict[str, str] = {}  # the form this version builds (JSON), by config without its seed and rate


def form_of(config) -> dict[str, dict[str, Any]]:
    """The form a run config's model is built in (:func:`model_form` of its model config), a fresh dict each call;
    remembered per config without its seed and learning rate, which do not change the form."""
    key = json.dumps({k: v for k, v in config.to_dict().items() if k not in ("seed", "lr")}, sort_keys=True,
                     default=str)
    if key not in _FORMS:
        _FORMS[key] = json.dumps(model_form(config.model_config(data.dataset_shape(config))))
    return json.loads(_FORMS[key])


def model_form(model) -> dict[str, dict[str, Any]]:
    """The form of a model config (``lit_modules.config.ViTConfig``): ``{part: {"kind": ..., "options": ...}}`` for
    its residual, attention, norm layer and parametrization, each part's options with their defaults filled in
    (``lit_modules.resolved_options``), as plain JSON values."""
    options = lit_modules.resolved_options(model)
    return jsonable({part: {"kind": getattr(model, kind), "options": options[part]}
                     for part, (kind, _) in FORM_PARTS.items()})
