"""What a study trains, once its file is read (:mod:`ablations.studies.spec`): its rows (:class:`Variant`), axes,
tuning stage (:class:`TuneSpec`), floor for failed trainings (:class:`Floor`) and claims, and the points and run
configurations they make (:class:`StudySpec`: ``grid``, ``tune_stage``, ``contend_stage``, ``config_for``,
``run_config``)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..config import RunConfig, layer
from .claims import Claim
from .matched import matched_mlp_ratio, param_count
from .overrides import name_suffix
from .rules import VerdictRules

# Imported where it is used, not here: lit_modules (torch), for the residuals' paper training settings.

STUDY_DIR = Path(__file__).parent  # the study files beside their loader
BUDGETS = ("smoke", "quick", "default", "gpu", "paper")
#: budgets that check a study runs (smoke) or give a first look in minutes (quick): too few seeds for evidence, and
#: the run and every report table say so (:meth:`StudySpec.first_look`)
FIRST_LOOK_BUDGETS = ("smoke", "quick")
#: the factor between a grid's edge and the rate the tuning stage adds beyond it (×2 above, ÷2 below)
TUNE_STEP = 2.0
#: Strategies that train a multi-device trial in fresh processes started by ``fit`` itself, so the trial stays in
#: this process: one Optuna trial per trial. ``ddp`` (and Lightning's default for several devices) re-runs the
#: whole script per rank, and each rank would ask the study for a trial of its own (ecosystem notes §2, §7); the
#: fork variants would copy this process's open database connections and heartbeat thread into the ranks.
SPAWN_STRATEGIES = ("ddp_spawn", "ddp_spawn_find_unused_parameters_false", "ddp_spawn_find_unused_parameters_true")
log = logging.getLogger("ablations.run")


@dataclass(frozen=True)
class Variant:
    """A labelled residual variant: ``residual`` with its ``options`` (+ any RunConfig ``overrides``). A
    parameter-matched control names the row it matches in ``params_of``: its MLP width is resolved at every point to
    that row's parameter count (:mod:`ablations.studies.matched`). ``tune_axes`` tunes this row's rate at these
    values of an axis only, in place of ``tune.axes`` (e.g. CompleteP at the shallowest depth, its rate used at
    every depth)."""

    label: str
    residual: str
    options: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)
    params_of: str | None = None
    tune_axes: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TuneSpec:
    """The tuning stage of a grid study (module docstring): learning rates, tuning seeds, the validation metric
    maximised, and the axis values tuned at (an axis not named: all of the study's values)."""

    lr: tuple[float, ...]
    seeds: tuple[int, ...]
    metric: str = "best_val_acc"
    axes: dict = field(default_factory=dict)
    bounds: tuple[float, float] | None = None  # None: the grid never extends

    def as_dict(self) -> dict:
        """The stored form (the study's ``tune_grid`` attribute): a changed grid invalidates a stored choice."""
        return {"lr": list(self.lr), "seeds": list(self.seeds), "metric": self.metric,
                "axes": {k: list(v) for k, v in sorted(self.axes.items())},
                "bounds": None if self.bounds is None else list(self.bounds)}

    def beyond(self, tried: list[float], best: float) -> tuple[float | None, str | None]:
        """The rate to add to a cell that ``tried`` these rates and found ``best`` best: (rate, None) one step
        beyond the edge it sits at; (None, "low"/"high") when that step would leave ``bounds`` (the best rate is
        at a bound); (None, None) when the best is inside the tried range or there are no bounds."""
        if self.bounds is None or len(tried) < 2 or min(tried) < best < max(tried):
            return None, None
        low, high = self.bounds
        if best == min(tried):
            rate = lr_value(best / TUNE_STEP)
            return (rate, None) if rate >= low * (1 - 1e-9) else (None, "low")
        rate = lr_value(best * TUNE_STEP)
        return (rate, None) if rate <= high * (1 + 1e-9) else (None, "high")


def lr_value(rate: float) -> float:
    """A learning rate rounded to 12 significant digits, so that ×2 and ÷2 steps give the same number (and the same
    text in stored keys) on every machine."""
    return float(f"{rate:.12g}")


@dataclass(frozen=True)
class Floor:
    """A study's floor for failed trainings: a run whose ``metric`` (a validation accuracy) ends below
    ``chance_multiple`` × chance level (1/classes) failed to train and counts like a diverged run."""

    metric: str = "final_val_acc"
    chance_multiple: float = 2.0

    def threshold(self, num_classes: int | None) -> float:
        """The accuracy below which a run failed: ``chance_multiple`` × chance level (classes unknown: 10), at most
        halfway from chance to 100% (5× chance of two classes would be 250%: every run would fail)."""
        chance = 1 / (num_classes or 10)
        return min(self.chance_multiple * chance, (1 + chance) / 2)

    def failed(self, value: float | None, num_classes: int | None) -> bool:
        """Whether a run with this metric value (None: no value) trained below the floor (classes unknown: 10)."""
        if value is None:
            return False
        return value < self.threshold(num_classes)

    def text(self) -> str:
        return f"{self.metric} below {self.chance_multiple:g}x chance level"



@dataclass(frozen=True)
class StudySpec:
    name: str
    budget: str
    kind: str
    description: str
    metric: str
    direction: str
    base: dict
    variants: tuple[Variant, ...]
    axes: dict
    n_trials: int = 0
    pruner: dict = field(default_factory=lambda: {"type": "none"})
    space: dict = field(default_factory=dict)
    source: str = ""
    tune: TuneSpec | None = None
    stage: str = "report"  # "tune": the tuning stage's own grid (tune_stage)
    claims: tuple[Claim, ...] = ()
    #: ``--set`` fields that change what a trial trains, as text (:func:`ablations.studies.overrides.apply_sets`)
    overrides: dict = field(default_factory=dict)
    #: the budgets the study file defines, in ``BUDGETS`` order (always ``default``): any other is refused
    budgets: tuple[str, ...] = ("default",)
    floor: Floor | None = None  # below it a run failed to train (counted like a diverged run)
    #: grid points beyond the axes' product (the tuning stage's extended rates: ``tune_stage(extra)``)
    extra_points: tuple[dict, ...] = ()
    #: (low, high) of a numeric axis whose values may grow beyond the listed ones (the tuning stage's lr): its
    #: distribution covers the whole range on a log scale, so an extended rate fits the stored study
    axis_bounds: dict = field(default_factory=dict)
    verdicts: VerdictRules = field(default_factory=VerdictRules)  # how its claims are decided (``verdicts:``)

    @property
    def study_name(self) -> str:
        """The name in the Optuna storage: budgets never share a study, nor do ``--set`` overrides
        (``+FIELD=VALUE``, :mod:`ablations.studies.overrides`); the tuning stage is ``<name>-tune``."""
        name = self.name if self.budget == "default" else f"{self.name}-{self.budget}"
        name += name_suffix(self.overrides)
        return {"tune": tune_name, "contend": contend_name, "round": round_name}.get(self.stage, str)(name)

    def first_look(self) -> str | None:
        """The label of a budget that is not evidence (``FIRST_LOOK_BUDGETS``), for the run's first line and the
        report's tables; None for the default and paper budgets."""
        if self.budget not in FIRST_LOOK_BUDGETS:
            return None
        return (f"Budget '{self.budget}' is a first look, underpowered by design: its numbers and verdicts are not "
                "evidence (the default budget is the study's evidence)")

    def tune_stage(self, extra: dict[str, list[float]] | None = None) -> StudySpec:
        """The tuning stage as a grid of its own: the study's other axes (or ``tune.axes``) × ``lr`` × tuning seeds,
        plus, for each cell (:meth:`tune_key`) in ``extra``, its extended rates × the tuning seeds."""
        assert self.tune is not None
        axes = {a: list(self.tune.axes.get(a, v)) for a, v in self.axes.items() if a != "seed"}
        axes |= {"seed": list(self.tune.seeds), "lr": list(self.tune.lr)}
        points = []
        for key, rates in sorted((extra or {}).items()):
            variant, cell = json.loads(key)
            points += [{"seed": seed, "variant": variant, **dict(cell), "lr": lr_value(lr)}
                       for lr in rates for seed in self.tune.seeds]
        bounds = self.tune.bounds or (min(self.tune.lr), max(self.tune.lr))
        return dataclasses.replace(self, axes=axes, tune=None, stage="tune", metric=self.tune.metric,
                                   direction="maximize", extra_points=tuple(points),
                                   axis_bounds={"lr": (min(bounds[0], *self.tune.lr), max(bounds[1], *self.tune.lr))})

    def contend_stage(self, points: list[dict]) -> StudySpec:
        """The contending rates' stage: ``points`` — reported grid points with an ``lr``, the reported seeds of the
        cells whose rate choice is not settled at each contending rate (:func:`ablations.studies.rules.contenders`)
        — as a study of its own (``<name>-contend``) whose grid is exactly those points."""
        assert self.tune is not None
        bounds = self.tune.bounds or (min(self.tune.lr), max(self.tune.lr))
        rates = sorted({float(p["lr"]) for p in points})
        low, high = min([bounds[0], *rates]), max([bounds[1], *rates])
        axes = dict(self.axes) | {"lr": rates or [low]} | self._seeds_with(points)  # a second look's seeds too
        return dataclasses.replace(self, axes=axes, tune=None, stage="contend",
                                   extra_points=tuple(dict(p) for p in points), axis_bounds={"lr": (low, high)})

    def round_stage(self, points: list[dict]) -> StudySpec:
        """A second look's stage: ``points`` — reported grid points at new seeds, for the rows of the lines the first
        look left undecided (:mod:`ablations.run.rounds`) — as a study of its own (``<name>-round``) whose grid is
        exactly those points, each at its row's tuned rate; its runs are reported runs like the study's own."""
        return dataclasses.replace(self, axes=dict(self.axes) | self._seeds_with(points), stage="round",
                                   extra_points=tuple(dict(p) for p in points))

    def _seeds_with(self, points: list[dict]) -> dict[str, list[int]]:
        """``{"seed": ...}``: the study's seeds and those of ``points`` (a stage's seed axis must hold every seed it
        trains); empty for a study without seeds."""
        seeds = sorted({*self.axes.get("seed", []), *(int(p["seed"]) for p in points if "seed" in p)})
        return {"seed": seeds} if seeds else {}

    def tune_axes(self) -> list[str]:
        """The axes a learning rate is chosen per (besides the variant): every axis but the seed."""
        return [a for a in self.axes if a != "seed"]

    def tune_key(self, params: dict) -> str:
        """The cell of a point whose learning rate is chosen together: its variant and its other axes' values, an
        axis tuned at a single value standing for all of its values (``tune.axes``)."""
        assert self.tune is not None
        cell = []
        own = self.variant(params["variant"]).tune_axes if any(v.label == params["variant"] for v in self.variants) \
            else {}
        for axis in self.tune_axes():
            tuned = own.get(axis, self.tune.axes.get(axis))
            value = params[axis]
            if tuned is not None and value not in tuned:
                if len(tuned) != 1:
                    raise ValueError(f"{axis}={value} was not tuned (tune.axes.{axis}: {tuned}); tune it, or tune "
                                     "a single value that stands for all")
                value = tuned[0]
            cell.append([axis, value])
        return json.dumps([params["variant"], cell])

    def variant(self, label: str) -> Variant:
        """The row labelled ``label``; KeyError naming the valid labels when the file has none."""
        found = next((v for v in self.variants if v.label == label), None)
        if found is None:
            raise KeyError(f"no variant '{label}' in study {self.name}; valid: "
                           + ", ".join(v.label for v in self.variants))
        return found

    def grid(self) -> list[dict]:
        """Every grid point as the trial's parameters: {'variant': label, axis: value, ...}, **seed-major**: every
        variant (and other axis value) of a seed before the next seed, so that a study stopped midway — or continued
        on another machine (``--import-runs``) — holds whole seeds, whose paired runs trained side by side."""
        if self.stage in ("contend", "round"):  # exactly its listed points (contend_stage, round_stage)
            return [dict(p) for p in self.extra_points]
        names = ["variant", *self.axes]
        values = [[v.label for v in self.variants], *self.axes.values()]
        order = sorted(range(len(names)), key=lambda i: names[i] != "seed")  # the seed first, the rest as listed
        grid = [{names[i]: point[order.index(i)] for i in range(len(names))}
                for point in itertools.product(*(values[i] for i in order))]
        if self.stage == "tune":  # a row that tunes at some values of an axis only (Variant.tune_axes)
            own = {v.label: v.tune_axes for v in self.variants if v.tune_axes}
            grid = [p for p in grid if all(p[a] in vals for a, vals in own.get(p["variant"], {}).items())]
        return grid + [dict(p) for p in self.extra_points]

    def points(self) -> list[dict]:
        """The settings the study's trials train at: a grid's points (:meth:`grid`), or a search's one point per
        variant (what every trial of the variant shares; the searched options vary)."""
        return self.grid() if self.kind == "grid" else [{"variant": v.label} for v in self.variants]

    @property
    def size(self) -> int:
        return len(self.grid()) if self.kind == "grid" else self.n_trials

    def config_for(self, params: dict) -> dict:
        """RunConfig fields of one trial: base, then the residual's paper training settings
        (``ResidualSite.paper_training``, e.g. nGPT's no weight decay and no warm-up), then the variant's overrides,
        then grid axes / searched options."""
        from lit_modules import RESIDUALS

        variant = self.variant(params["variant"])
        options = dict(variant.options)
        prefix = f"{variant.label}."
        options |= {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}
        paper = RESIDUALS[variant.residual].paper_training if variant.residual in RESIDUALS else {}
        fields = layer(self.base, paper)
        fields = layer(fields, variant.overrides)  # a later recipe replaces earlier fields
        fields = layer(fields, {k: v for k, v in params.items() if k in self.axes})
        fields |= {"residual": variant.residual, "residual_options": options}
        if variant.params_of is not None:  # a parameter-matched control: its MLP width matches the row at this point
            point = {k: v for k, v in params.items() if not k.startswith(prefix)} | {"variant": variant.params_of}
            target = param_count(self.config_for(point))
            fields["mlp_ratio"] = matched_mlp_ratio(fields, target, variant.label, variant.params_of)
        return fields

    def run_config(self, params: dict, overrides: dict | None = None):
        """The RunConfig of one study point (``params`` as a trial holds them), with ``overrides`` (e.g. threads,
        data_dir) on top: the one way a point becomes a config (run, dry run, validation, bench, the objective).
        A point on several devices runs with ``ddp_spawn`` (``auto``/``ddp`` are switched, with a warning once);
        other strategies re-launch the script per rank and are refused (ValueError)."""
        config = RunConfig(**(self.config_for(params) | dict(overrides or {})))
        if config.devices == 1 or config.strategy in SPAWN_STRATEGIES:
            return config
        if config.strategy not in ("auto", "ddp"):
            raise ValueError(f"strategy '{config.strategy}' with devices={config.devices} cannot run inside a study: "
                             f"it re-launches the script per rank and each rank would create its own Optuna trial; "
                             f"use one of {', '.join(SPAWN_STRATEGIES)}, or devices: 1 with one worker per device")
        _warn_spawn(config.devices, config.strategy)
        return config.replace(strategy="ddp_spawn")


@functools.cache  # once per process
def _warn_spawn(devices: int | str, strategy: str) -> None:
    log.warning("devices=%s with strategy '%s': each trial runs with strategy 'ddp_spawn' instead, so that it stays "
                "one Optuna trial (plain ddp re-launches the script per rank and each rank would create its own "
                "trial)", devices, strategy)


#: what a study stores about its tuning stage (Optuna user attributes): on the study, each cell's chosen rate, the
#: mean per rate, the grid it was chosen with, the rates added beyond the edges and the cells at a bound; the tuning
#: stage's own study also keeps the added rates (its workers read them)
TUNED_LR, TUNE_MEANS, TUNE_GRID = "tuned_lr", "tune_means", "tune_grid"
TUNE_EXTRA = "tune_extra"  # cell -> the rates added beyond the grid's edges
TUNE_AT_BOUND = "tune_at_bound"  # cell -> "low"/"high": its best rate sits at a declared bound


def tune_name(study_name: str) -> str:
    """The storage name of a study's tuning stage."""
    return f"{study_name}-tune"


def contend_name(study_name: str) -> str:
    """The storage name of a study's contending-rates stage (:meth:`StudySpec.contend_stage`)."""
    return f"{study_name}-contend"


#: what a study's contending-rates stage stores (on its own study): its points, each a reported grid point with an lr
CONTEND_POINTS = "contend_points"
#: what a study's second look stores (on its own study): its points, reported grid points at new seeds
ROUND_POINTS = "round_points"


def round_name(study_name: str) -> str:
    """The storage name of a study's second look (:meth:`StudySpec.round_stage`)."""
    return f"{study_name}-round"


def parent_name(study_name: str) -> str:
    """The study a stage's storage name belongs to (``<name>-tune``, ``-contend``, ``-round`` -> ``<name>``)."""
    for suffix in ("-tune", "-contend", "-round"):
        if study_name.endswith(suffix):
            return study_name[:-len(suffix)]
    return study_name


def resolved(spec: StudySpec) -> dict:
    """What a study trains under its budget, with its base files and the budget resolved (``extends:``, the module
    docstring): the report's ``study.yaml``, and the dry run's ``base`` line."""
    source = Path(spec.source).resolve()
    if source.is_relative_to(STUDY_DIR.parent.parent):  # a committed study: its path in the repository
        source = source.relative_to(STUDY_DIR.parent.parent)
    out = {"name": spec.name, "budget": spec.budget, "source": str(source), "kind": spec.kind, "metric": spec.metric,
           "direction": spec.direction, "base": dict(spec.base),
           "variants": [{k: v for k, v in dataclasses.asdict(variant).items() if v not in ({}, None)}
                        for variant in spec.variants],
           "axes": {k: list(v) for k, v in spec.axes.items()}}
    if spec.tune is not None:
        out["tune"] = spec.tune.as_dict()
    if spec.kind == "search":
        out["search"] = {"n_trials": spec.n_trials, "pruner": dict(spec.pruner), "space": dict(spec.space)}
    if spec.overrides:
        out["overrides"] = dict(spec.overrides)
    return out
