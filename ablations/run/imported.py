"""Continuing a study from its ``runs.csv`` (``python -m ablations.run --study NAME --import-runs FILE``): the
completed trials of a report made elsewhere (another machine, a storage that is gone) join this storage as done,
so that only the grid points they do not cover train.

Each row of the file must be a point of this study's grid as this study file and ``--set`` define it now: the same
residual and options, the same learning rate (a tuning-stage row: its grid's; a reported row: the rate this study's
tuning stage chose), and the same parameter count (a model built on the meta device: a row from another budget or
``--set`` differs there). A row that disagrees is a one-line error and nothing is added — except a reported row
that differs in its learning rate alone: this study's tuning stage chose another rate for its cell, so the point
trains again (the import says how many), and a row built in an earlier form of its point (runs.csv's ``form``: a
part of the model the same kind, the options given the same, a default changed since): it measured another design,
so its point trains again in today's form (counted too). A row's form of another kind (``--set norm_layer=dyt``)
or an explicitly given option at another value is a disagreement like the others. Rows that are not complete
(failed, pruned) are not imported: their points train again. An imported trial keeps the row's run summary, mode and
per-epoch validation curve (``val_acc_curve``; a runs.csv written before that column leaves it out of ``val_curves``),
and its per-image test results (``test_correct``) where the row has them; with ``--retrain-without-per-image`` a
reported row that trained (not diverged, not failed to train) but lacks them is left out and its point trains again,
so that every paired difference of the report gets its two-level bootstrap interval (seeds x test images); with
``--retrain-mode MODE`` a reported row that trained in that mode (runs.csv's ``mode``) trains again, in the mode
this run uses, so that a study continued on another machine can have all its reported runs in one mode. It
has no TensorBoard folder (the collapse table and the diagnostic figures read the diagnostics its row carries,
the ``diagnostics`` column) and carries ``imported_from`` (the file) instead of
a ``worker``.

Run the import once, from one process (the command that starts the workers does it before they start): two imports
into one storage at the same moment would both add every row.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FixedTrial, TrialState, create_trial

import data
import lit_modules

from .. import layout
from ..report.load import ReportError, own_seconds, run_mode
from ..report.runs import read
from .kept_modes import mode_facts
from .looks import same_rate
from .objective import FORM_PARTS, Objective, categorical_axes, form_of, jsonable, suggest
from .study import Stored, create_study, done_trials, point_key, trial_point

# torch (about 1.7 s, measured with python -X importtime) is imported where a model's parameters are counted, and
# the model and the datasets are reached through their packages (lit_modules, data: lazy, they load torch on first
# use), so that --help and --list answer without torch.

IMPORTED = "imported_from"  # user attr of an imported trial: the runs.csv it came from


def _number(value: Any) -> Any:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _grid_point_key(point: dict) -> str:
    """A point's key with its numbers as floats, so that a runs.csv row's 0.001 or 4 finds the grid's."""
    return repr(sorted((k, _number(v)) for k, v in point.items()))


def _matched(path: Path, spec, study_name: str) -> list[tuple[Any, dict | None]]:
    """This stage's rows of the runs file, each with the grid point of ``spec`` it trained (None: not a point)."""
    report = _read(path, spec, study_name)
    grid = {_grid_point_key(p): p for p in spec.grid()}
    keys = next(iter(grid.values())).keys()
    matched = []
    stages = {"tune": report.tune_runs, "contend": report.contend_runs,
              "round": [r for r in report.runs if r.phase == "round"]}  # a second look's seeds: their own stage
    for run in stages.get(spec.stage, [r for r in report.runs if r.phase != "round"]):
        values = {"variant": run.variant, "depth": run.depth, "seed": run.seed, "lr": run.lr, **dict(run.extras)}
        matched.append((run, grid.get(_grid_point_key({k: values.get(k) for k in keys}))))
    return matched


def _param_count(config, cache: dict) -> int:
    """The parameters of ``config``'s model, built on the meta device (shapes only)."""
    import torch

    model_config = config.model_config(data.dataset_shape(config))
    key = json.dumps(model_config.to_dict(), sort_keys=True, default=str)
    if key not in cache:
        with torch.device("meta"):
            cache[key] = sum(p.numel() for p in lit_modules.VisionTransformer(model_config, init_seed=0).parameters())
    return cache[key]


def _mismatch(run, config, cache: dict) -> str | None:
    """What differs between a row and the config this study trains its point at (None: nothing): the residual and
    its options, the learning rate, the parameter count (model size, patches, dataset shape), the classes and, for a
    run that did not diverge, its epochs (another budget or ``--set max_epochs``)."""
    stored = run.config or {}
    if (fault := _residual_fault(run, config) or _form_fault(run, config)) is not None:
        return fault
    if not same_rate(run.lr, config.lr):
        return f"learning rate {run.lr}, this study {config.lr:g}"
    params = run.summary.get("param_count")
    if params is not None and int(params) != (expected := _param_count(config, cache)):
        return f"{int(params):,} parameters, this study's model {expected:,}"
    classes, expected = stored.get("num_classes"), data.dataset_shape(config)["num_classes"]
    if classes is not None and int(classes) != expected:
        return f"{int(classes)} classes, this study's dataset {expected}"
    epochs = run.summary.get("epochs_completed")
    if epochs is not None and not run.diverged and int(epochs) != config.max_epochs:
        return f"{int(epochs)} epochs, this study {config.max_epochs}"
    return None


def _residual_fault(run, config) -> str | None:
    """The row's residual and the options given to it, where they are not this study's point's (None: the same)."""
    stored = run.config or {}
    if config.same_residual(stored):
        return None
    return (f"residual {stored.get('residual')} {json.dumps(stored.get('residual_options') or {})}, the study file "
            f"now {config.residual} {json.dumps(config.residual_options or {})}")


def _forms(run, config) -> tuple[dict, dict] | None:
    """(the form the row recorded, with the options added since filled in as they were (``lit_modules.
    upgraded_form``), the form this version builds for ``config``), both parsed; None for a row that recorded none
    (a runs.csv written before the column). ValueError (one line) for a form that is not JSON."""
    recorded = run.summary.get(layout.FORM_KEY)
    if not recorded:
        return None
    try:
        return lit_modules.upgraded_form(json.loads(layout.canonical_form(recorded))), form_of(config)
    except (json.JSONDecodeError, TypeError):
        raise ValueError(f"--import-runs: run {run.run_name or run.number}: column '{layout.FORM_KEY}' is not JSON: "
                         f"'{recorded}'") from None


def _form_fault(run, config) -> str | None:
    """What differs between the row's recorded form and this study's point other than a default (None: nothing):
    a part of another kind (``--set norm_layer=dyt``, another attention or parametrization) or an option this
    study gives explicitly at another value — another study file or ``--set``, not a default changed since."""
    forms = _forms(run, config)
    if forms is None:
        return None

    recorded, today = forms
    for part, (kind, options) in FORM_PARTS.items():
        was, now = recorded.get(part) or {}, today[part]
        if was.get("kind") != now["kind"]:
            return f"{kind} {was.get('kind')}, this study {now['kind']}"
        given = dict(getattr(config, options, None) or {}) if part != "residual" else {}
        for key in sorted(given):
            if (was.get("options") or {}).get(key) != now["options"].get(key):
                return f"{options} {key}={(was.get('options') or {}).get(key)!r}, this study {now['options'].get(key)!r}"
    return None


def _earlier_form(run, config) -> bool:
    """Whether the row was built in an earlier form of this study's point: it recorded a form (runs.csv's ``form``),
    trained this point's residual with the same options given and the same kind of every part, and differs only
    in an option's default (a variant's default changed since: the row measured another design, so its point trains
    again). Anything else that differs is :func:`_mismatch`'s to report; a row without a recorded form cannot be told
    apart."""
    if _residual_fault(run, config) is not None or _form_fault(run, config) is not None:
        return False
    recorded, today = _forms(run, config) or (None, None)
    return recorded is not None and recorded != today


def _only_the_rate(run, config, cache: dict) -> bool:
    """Whether a reported row differs from this study's point only in its learning rate: the tuning stage chose
    another rate for the cell (e.g. a study continued under more tuning seeds), so the row is no result of this
    study, but not a sign of another version, budget or --set either."""
    return run.lr is not None and _mismatch(run, config.replace(lr=run.lr), cache) is None


def _user_attrs(run, config, stage: str, path: Path) -> dict[str, Any]:
    attrs = {k: v for k, v in run.summary.items() if v is not None}
    if (run.config or {}).get("num_classes") is not None:  # a diverged run's chance level in the paired tests
        attrs["num_classes"] = run.config["num_classes"]
    if run.mode:  # "<precision> + <fused|explicit> attention[ on cuda]", as the report reads it back (run_mode)
        precision, _, attention = run.mode.removesuffix(" on cuda").partition(" + ")
        attrs |= {"precision": precision, "fused_attn": attention.startswith("fused"),
                  "device": "cuda" if run.mode.endswith(" on cuda") else "cpu"}
    return attrs | {"run_name": run.run_name, "phase": stage, IMPORTED: str(path),
                    "config": jsonable(config.to_dict()),
                    layout.MODEL_KEY: jsonable(config.model_config(data.dataset_shape(config)).to_dict())}


def _read(path: Path, spec, study_name: str):
    """The runs file as StudyData; a tuning stage's spec is read without its lr axis (a column of every row). A file
    written before the report recorded each run's configuration (no ``lr``, ``residual`` columns) is refused."""
    if path.is_file():
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            header = next(csv.reader(fh), [])
        missing = [c for c in ("lr", "residual", "residual_options", "param_count") if c not in header]
        if header and missing and not [c for c in ("number", "variant") if c not in header]:
            raise ValueError(f"--import-runs: runs file '{path}' was written by an earlier report (no "
                             f"{', '.join(missing)} column): its runs cannot be checked against this study; rerun "
                             "those points, or report the old storage again with this version first")
    reading = spec if spec.stage not in ("tune", "contend", "round") else dataclasses.replace(
        spec, axes={a: v for a, v in spec.axes.items() if a != "lr"})
    try:
        return read(path, reading, study_name)
    except ReportError as exc:
        raise ValueError(f"--import-runs: {exc}") from None


def lacks_per_image(run) -> bool:
    """A reported run that trained (its accuracy counts, not chance level) but has no per-image test results: a
    runs.csv row from a version that did not store them."""
    return run.ok and not run.summary.get("test_correct")


def retrain_rule(without_per_image: bool = False, modes: tuple[str, ...] = ()):
    """Which reported rows of the runs file train again instead of joining: a function of a row giving why (the
    import's count line says so), or None for a row that joins. ``without_per_image``: rows that
    :func:`lacks_per_image`; ``modes``: rows that trained in one of these modes (runs.csv's ``mode``, e.g.
    ``32-true + explicit attention``), so that a study continued on a machine that chose another mode trains every
    reported run in one. None when nothing is chosen."""
    if not without_per_image and not modes:
        return None

    def why(run) -> str | None:
        if modes and (mode := run_mode(run)) in modes:
            return f"trained in mode {mode} (they train again: --retrain-mode)"
        if without_per_image and lacks_per_image(run):
            return "without per-image test results (they train again: --retrain-without-per-image)"
        return None

    return why


def check_retrain_modes(path: str | Path, spec, study_name: str, modes: tuple[str, ...]) -> None:
    """ValueError (one line) for a ``--retrain-mode`` that no reported row of the file trained in, naming those it
    has."""
    found = sorted({run_mode(r) for r, _ in _matched(Path(path), spec, study_name)})
    for mode in modes:
        if mode not in found:
            raise ValueError(f"--retrain-mode: no reported row of '{path}' trained in mode '{mode}'; its modes: "
                             + ", ".join(f"'{m}'" for m in found))


def imported_done(path: str | Path, spec, study_name: str, retrain=None, known: frozenset = frozenset(),
                  tuned: dict[str, float] | None = None):
    """What the runs file would bring (:class:`ablations.run.study.Stored`, for a dry run): the points of each
    stage it completed, the points left, and its trials' wall times by (variant, depth) cell. ``known``: the
    (stage, point key) pairs a storage has done already (:attr:`Stored.finished`), whose rows the import leaves
    alone and which are not counted here; ``tuned``: the rates that storage's tuning stage chose, so that a reported
    row at another rate counts as training again, as the import treats it, and so does a row of an earlier form.
    Nothing else is checked against the study file beyond the points (the run does that)."""
    path = Path(path)
    stages = ([spec.tune_stage()] if spec.tune is not None else []) + [spec]
    done, left, seconds, modes, added = [], [], {}, [], set()
    for stage in stages:
        rows = [(r, p) for r, p in _matched(path, stage, study_name)
                if _joins(r, p, spec, stage, known, retrain, tuned)]
        finished = {point_key(p) for _, p in rows}
        done.append(len(finished))
        left += [p for p in stage.grid() if point_key(p) not in finished]
        added |= {(stage.stage, key) for key in finished}
        for r, point in rows:
            modes.append(mode_facts(_user_attrs(r, stage.run_config(point), stage.stage, path)))
            wall = own_seconds(r.summary)  # a stacked trial: its share of the stack's time
            if wall is not None:  # the cell as stored_done keys it
                seconds.setdefault((point["variant"], point.get("depth")), []).append(float(wall))
    tune_done, report_done = done if len(done) == 2 else (0, done[0])
    return Stored(tune_done, report_done, f"runs file {path} (--import-runs)", seconds, tuple(left), tuple(modes),
                  frozenset(added))


def _joins(run, point: dict | None, spec, stage, known: frozenset, retrain, tuned: dict[str, float] | None) -> bool:
    """Whether a row of the runs file joins ``stage`` of a dry run's storage as done (:func:`imported_done`): a
    completed row of a point not ``known`` there, not left to train again by ``retrain``, by an earlier form of its
    design or by a rate other than the ``tuned`` one of its cell."""
    if run.state != "complete" or point is None or (stage.stage, point_key(point)) in known:
        return False
    reported = stage.stage != "tune"
    if reported and retrain is not None and retrain(run):
        return False
    if _earlier_form(run, stage.run_config(point)):
        return False
    return not (reported and tuned and _other_rate(run, tuned.get(spec.tune_key(point))))


def _other_rate(run, chosen: float | None) -> bool:
    """Whether a reported row trained at another rate than the one its cell's tuning stage chose."""
    return chosen is not None and run.lr is not None and not same_rate(run.lr, chosen)


def import_runs(path: str | Path, spec, storage, study_name: str, overrides: dict,
                tuned: dict[str, float] | None = None, retrain=None) -> int:
    """Add the completed rows of ``path`` for this stage (``spec.stage``: ``tune`` rows to the tuning stage's
    study, ``report`` rows to the study) as COMPLETE trials of their grid points; points already done here are
    left alone; a reported row for which ``retrain`` (:func:`retrain_rule`) gives a reason is left out. ValueError
    (one line) for a row that is not this study's point; returns the trials added."""
    path = Path(path)
    matched = _matched(path, spec, study_name)
    study = create_study(spec, storage, study_name, seed=0)
    done = {point_key(trial_point(t)) for t in done_trials(study)}
    objective = Objective(spec, log_root=Path("."), overrides=overrides, tuned=tuned)
    joining = _Joining(path, spec, objective, done, categorical_axes(study, spec), retrain)
    for run, point in matched:
        joining.take(run, point)
    if joining.outside and not joining.trials and not joining.here:
        raise ValueError(f"--import-runs: no completed row of '{path}' is a point of {spec.stage} study "
                         f"'{study_name}' ({joining.outside} row(s) of other points): is it another study's runs.csv?")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.add_trials(joining.trials)
    stage = {"tune": "tuning-stage", "contend": "contending-rate", "round": "second-look"}.get(spec.stage, "reported")
    print(f"--import-runs {path}: {len(joining.trials)} completed {stage} trial(s) joined '{study_name}' as done"
          + "".join(f"; {n} {what}" for n, what in joining.left_out() if n), file=sys.stderr)
    return len(joining.trials)


@dataclasses.dataclass
class _Joining:
    """The rows of a runs file sorted for one stage's import (:func:`import_runs`), row by row: the trials to add
    (their points join ``done``) and a count of each kind of row left out."""

    path: Path
    spec: Any
    objective: Any
    done: set[str]
    categorical: frozenset[str]
    retrain: Any = None
    cache: dict = dataclasses.field(default_factory=dict)
    trials: list = dataclasses.field(default_factory=list)
    here: int = 0
    outside: int = 0
    incomplete: int = 0
    other_rate: int = 0
    earlier: int = 0
    again: dict[str, int] = dataclasses.field(default_factory=dict)

    def take(self, run, point: dict | None) -> None:
        """One row and the grid point it trained (None: not a point of the stage)."""
        if run.state != "complete":
            self.incomplete += 1
        elif point is None:
            self.outside += 1
        elif point_key(point) in self.done:
            self.here += 1
        elif self.retrain is not None and self.spec.stage != "tune" and (why := self.retrain(run)) is not None:
            self.again[why] = self.again.get(why, 0) + 1
        else:
            self._add(run, point)

    def _add(self, run, point: dict) -> None:
        """A completed row of a point not done here: a trial, unless its model's form or rate says it trains again;
        ValueError (one line) for a row that trained something else than its point."""
        spec, config = self.spec, self.objective.config(point)
        if _earlier_form(run, config):
            self.earlier += 1  # a default of its design changed since it trained: the point trains in today's form
            return
        fault = _mismatch(run, config, self.cache)
        if fault is not None and spec.stage != "tune" and _only_the_rate(run, config, self.cache):
            self.other_rate += 1  # this study's tuning stage chose another rate for its cell: the point trains again
            return
        if fault is not None:
            raise ValueError(f"--import-runs: {self.path}: {spec.stage} run {run.run_name or run.number} trained "
                             f"{fault}: the file is from another version, budget or --set of the study; none of "
                             f"its {spec.stage} rows were imported")
        fixed = FixedTrial(point)
        suggest(fixed, spec, self.categorical)  # the distributions the objective gives the point
        value = run.summary.get(spec.metric)
        value = float(value) if value is not None and math.isfinite(value) else (
            0.0 if spec.direction == "maximize" else math.inf)
        self.trials.append(create_trial(state=TrialState.COMPLETE, value=value, params=fixed.params,
                                        distributions=fixed.distributions,
                                        user_attrs=_user_attrs(run, config, spec.stage, self.path),
                                        system_attrs={"fixed_params": point},
                                        intermediate_values={epoch - 1: v for epoch, v in run.curve.items()}))
        self.done.add(point_key(point))

    def left_out(self) -> tuple[tuple[int, str], ...]:
        """(count, what) of each kind of row not added, in the order the import's line names them."""
        return ((self.here, "already done here"),
                (self.outside, "not points of this study (left out)"),
                (self.incomplete, "not complete (they train again)"),
                (self.other_rate, "trained at another learning rate than this study's tuning stage chose (they "
                                  "train again)"),
                (self.earlier, "built in an earlier form of their design, a default has changed since (they train "
                               "again)"),
                *((n, why) for why, n in self.again.items()))
