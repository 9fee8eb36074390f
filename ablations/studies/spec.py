"""Study specifications: one short YAML file per study, loaded and validated into a ``StudySpec``.

A study file (see ``ablations/studies/*.yaml``) says what to run, never how::

    name: residual_variants
    description: all eight variants at their paper defaults × depth × seed
    kind: grid                     # grid (every point, enqueued, unpruned) | search (TPE + pruning)
    metric: best_val_acc           # a key of the run summary; the trial's objective value
    direction: maximize
    base: {dataset: digits, max_epochs: 30, embed_dim: 64}    # RunConfig fields shared by every trial
    variants:                      # labelled residual variants (the "variant" parameter)
      - {label: standard, residual: standard}
      - {label: layerscale, residual: layerscale, options: {init_value: auto}}
      - {label: highway, residual: highway}
      - {label: standard_params_matched_highway, residual: standard, params_of: highway}  # MLP width solved per point
    axes: {depth: [2, 6, 12], seed: [0, 1, 2]}                # grid axes: RunConfig fields × values
    tune:                          # optional: each variant's learning rate chosen on tuning seeds first
      lr: [5.0e-4, 1.0e-3, 2.0e-3, 4.0e-3]   # the starting grid
      seeds: [100, 101, 102]       # disjoint from the reported seeds; at least 3 (evidence budgets)
      bounds: [1.25e-4, 3.2e-2]    # the grid extends (x2 / /2) while the best rate is at its edge, within these
      metric: best_val_acc         # the validation metric the choice maximises (mean over the tuning seeds)
      axes: {depth: [4]}           # optional: tune at these values of an axis only (one value: used for all)
    search:                        # kind: search only
      n_trials: 40
      pruner: {type: median, n_startup_trials: 5, n_warmup_steps: 3}
      space:                       # per variant label: residual option -> distribution
        layerscale: {init_value: {low: 1.0e-6, high: 0.5, log: true}}
    budgets:                       # sizes: smoke (CI), quick, default, paper (GPU); each may override the above
      smoke: {base: {max_epochs: 2}, axes: {depth: [1], seed: [0]}}
    claims:                        # the papers' claims the report gives a computed verdict for (claims.md)
      - {id: layerscale_vs_standard, claim: "LayerScale improves accuracy", source: "CaiT, Table 1",
         variant: layerscale, baseline: standard, direction: higher, depth: 12}
      - {id: reattn_similarity, claim: "...", source: "...", testable: false, reason: "..."}

**Shared settings** (``extends:``): a study file may name a base file, its path relative to the study file, else
to ``ablations/studies/`` (so a study file anywhere finds the shared protocol)::

    extends: protocol/mnist5k.yaml   # ablations/studies/protocol/: the protocol the committed studies share

The base file holds any of the keys above (here: kind, metric, direction, base, tune and the smoke and paper
budgets); the study file is laid over it, and what results is loaded as if it were one file. The rules:

- a mapping updates the base file's mapping of the same key, key by key and recursively: the study's ``base``
  updates the base file's ``base``, a study's budget updates the base file's budget of that name (its ``base``,
  ``axes`` and ``tune`` each key by key), ``tune`` updates ``tune``;
- a ``base`` that sets ``recipe`` first drops the recipe fields of the ``base`` it updates (as a budget does below);
- a list or a single value replaces: ``variants``, ``claims``, an axis' values, ``tune.lr``, ``description``;
  a budget's ``add_variants`` appends its rows to the study's instead (e.g. a control a larger size needs);
- a key of the base file the study does not set stays; a mapping's keys keep the base file's order, then the
  study's new ones (an axis' place sets the grid's order);
- a base file may extend another; a file that extends itself (directly or not) is refused;
- a study whose ``base`` sets ``dataset`` keeps its data under every budget of its base file: the base file's
  ``dataset``, ``data_dir``, ``dataset_options`` and ``patch_size`` (:data:`DATA_FIELDS`), in its ``base`` and in
  its budgets', do not apply to it. The protocol's ``smoke`` and ``quick`` budgets shrink such a study (epochs, seeds,
  rates, width) on its own images; a budget of the study file itself may still change its data.

Only the files directly in ``ablations/studies/`` are studies (``--list``, ``--study NAME``): base files live in
a folder below it. ``--dry-run`` prints the resolved base of the trials, and the report writes the resolved study
(``study.yaml``).

A ``recipe`` (``basic``, ``paper``: :mod:`ablations.recipes`) set by a budget's base, a variant's overrides or an
axis replaces the recipe fields of the layers before it (the study's base), unless it sets them itself.

Every unknown key is a one-line ``ValueError`` naming the key, where it is, and the valid keys.

**The tuning stage** (``tune:``, grid studies): before the reported grid runs, a grid of its own — every variant
× the study's other axes (or ``tune.axes``) × ``tune.lr`` × ``tune.seeds`` — trains as the study
``<study name>-tune``; each variant's learning rate (per cell of the other axes) is the one with the highest mean
``tune.metric`` (a validation metric: nothing is chosen on the test split) over the tuning seeds, which never
appear among the reported seeds (a run that diverged or failed to train counts as 0). **While a cell's best rate is
the smallest or largest it tried, its grid extends by one rate** (÷2 or ×2) on the same tuning seeds, as long as
that rate lies within ``tune.bounds``; a cell whose best rate sits at a bound is recorded as such. The reported grid
then trains every point at its variant's chosen rate. Evidence budgets (not ``smoke``/``quick``) need at least
:data:`MIN_TUNE_SEEDS` tuning seeds, so that one seed's noise cannot pick the rate, and declared ``bounds``; a
first-look budget with a ``tune:`` of its own does not inherit the study's ``bounds`` (its short grid runs once).

**A floor for failed trainings** (``floor:``, optional): ``{metric: final_val_acc, chance_multiple: 2}`` says a run
whose metric ends below that multiple of chance level (1/classes) failed to train; such runs count like diverged
ones (at chance level in the pairs, as 0 in the tuning stage) and the tables show "k/n failed to train".
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..recipes import with_recipe
from .rules import VerdictRules
from .rules import parse as parse_rules

STUDY_DIR = Path(__file__).parent  # the study files beside this loader
PROTOCOL = STUDY_DIR / "protocol" / "mnist5k.yaml"  # the shared protocol of the committed studies
#: the fields that say which images a study trains on and how they are cut into tokens: a study file that sets
#: ``dataset`` in its ``base`` takes none of them from its base file or its base file's budgets (``_without_data``)
DATA_FIELDS = ("dataset", "data_dir", "dataset_options", "patch_size")
BUDGETS = ("smoke", "quick", "default", "gpu", "paper")
#: budgets that check a study runs (smoke) or give a first look in minutes (quick): too few seeds for evidence, and
#: the run and every report table say so (:meth:`StudySpec.first_look`)
FIRST_LOOK_BUDGETS = ("smoke", "quick")
_TOP_KEYS = ("extends", "name", "description", "kind", "metric", "direction", "base", "variants", "axes", "search",
             "tune", "floor", "budgets", "claims", "verdicts")
_BUDGET_KEYS = ("base", "variants", "add_variants", "axes", "search", "tune", "description")
_TUNE_KEYS = ("lr", "seeds", "bounds", "metric", "axes")
#: tuning seeds an evidence budget needs (the mean over them picks the rate; ``smoke``/``quick`` may use fewer)
MIN_TUNE_SEEDS = 3
#: the factor between a grid's edge and the rate the tuning stage adds beyond it (×2 above, ÷2 below)
TUNE_STEP = 2.0
_FLOOR_KEYS = ("metric", "chance_multiple")
FLOOR_METRICS = ("final_val_acc", "best_val_acc")
TUNE_METRICS = ("best_val_acc", "final_val_acc")  # validation metrics: the tuning stage never reads the test split
_VARIANT_KEYS = ("label", "residual", "options", "overrides", "params_of", "tune_axes")
_SEARCH_KEYS = ("n_trials", "pruner", "space", "sampler")
_PRUNERS = ("none", "median", "hyperband")
_DIST_KEYS = ("low", "high", "log", "choices")
_CLAIM_KEYS = ("id", "claim", "source", "variant", "baseline", "depth", "baseline_depth", "direction", "counts",
               "metric", "testable", "reason", "premise", "kind", "margin")
CLAIM_DIRECTIONS = ("higher", "lower")
#: what a claim asserts (:mod:`ablations.report.verdicts`): ``superior`` — better on its metric; ``noninferior`` —
#: at least as good, within the margin ("matches", "at least as well"); ``faster`` — reaches the baseline's plateau
#: in fewer epochs; ``stable`` — a larger share of its (seed, rate) runs train
CLAIM_KINDS = ("superior", "noninferior", "faster", "stable")
_PREMISE_KEYS = ("claim", "variant", "baseline", "depth", "baseline_depth", "direction", "metric")
#: what a premise asserts of its paired comparison (variant − baseline): ``lower`` / ``higher``: the 95% interval
#: lies below / above 0; ``not_higher`` / ``not_lower``: it is not significantly above / below 0 (e.g. "saturates")
PREMISE_DIRECTIONS = ("lower", "higher", "not_higher", "not_lower")
#: Metrics a claim may compare (fractions, so a diverged run counts at chance level): the accuracies and the AUC.
CLAIM_METRICS = ("best_val_acc", "final_val_acc", "test_acc", "test_acc_at_best_val", "val_acc_auc")
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
class Claim:
    """A paper's claim the study tests: ``variant`` vs ``baseline`` (at ``depth``, or every depth the variant ran at
    when None; the baseline at ``baseline_depth`` when it is a control of another depth, e.g. a deeper plain ViT of
    the same parameter count, else at the variant's) in ``direction`` on ``metric`` (None: the study's metric); or,
    with ``testable`` False, a claim the study's measure cannot test, with the ``reason``. The verdict is computed
    by the report, never written here."""

    id: str
    claim: str
    source: str
    variant: str | None = None
    baseline: str | None = None
    depth: int | None = None
    baseline_depth: int | None = None
    direction: str = "higher"
    counts: str = ""
    metric: str | None = None
    testable: bool = True
    reason: str = ""
    premise: Premise | None = None
    kind: str = "superior"  # CLAIM_KINDS
    margin: float | None = None  # the claim's own smallest effect worth having (None: the study's verdicts.margin)


@dataclass(frozen=True)
class Premise:
    """What a claim presupposes, measured in the same study as a paired comparison (``variant`` − ``baseline`` at
    ``depth`` / ``baseline_depth`` on ``metric``), e.g. "standard's accuracy falls from depth 4 to 16" =
    ``{variant: standard, depth: 16, baseline: standard, baseline_depth: 4, direction: lower}``. When the study does
    not show it (:data:`PREMISE_DIRECTIONS`), the claim's verdict is "premise absent", with the premise's numbers."""

    claim: str
    variant: str
    baseline: str
    depth: int | None = None
    baseline_depth: int | None = None
    direction: str = "lower"
    metric: str | None = None


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
        from .overrides import name_suffix

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
        return dataclasses.replace(self, axes=dict(self.axes) | {"lr": rates or [low]}, tune=None, stage="contend",
                                   extra_points=tuple(dict(p) for p in points), axis_bounds={"lr": (low, high)})

    def round_stage(self, points: list[dict]) -> StudySpec:
        """A second look's stage: ``points`` — reported grid points at new seeds, for the rows of the lines the first
        look left undecided (:mod:`ablations.run.rounds`) — as a study of its own (``<name>-round``) whose grid is
        exactly those points, each at its row's tuned rate; its runs are reported runs like the study's own."""
        seeds = sorted({*self.axes.get("seed", []), *(int(p["seed"]) for p in points)})
        return dataclasses.replace(self, axes=dict(self.axes) | {"seed": seeds}, stage="round",
                                   extra_points=tuple(dict(p) for p in points))

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
        return next(v for v in self.variants if v.label == label)

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
        fields = dict(self.base) | dict(paper)
        fields = with_recipe(fields, dict(variant.overrides))  # a later recipe replaces earlier fields
        fields = with_recipe(fields, {k: v for k, v in params.items() if k in self.axes})
        fields |= {"residual": variant.residual, "residual_options": options}
        if variant.params_of is not None:  # a parameter-matched control: its MLP width matches the row at this point
            from .matched import matched_mlp_ratio, param_count

            point = {k: v for k, v in params.items() if not k.startswith(prefix)} | {"variant": variant.params_of}
            target = param_count(self.config_for(point))
            fields["mlp_ratio"] = matched_mlp_ratio(fields, target, variant.label, variant.params_of)
        return fields

    def run_config(self, params: dict, overrides: dict | None = None):
        """The RunConfig of one study point (``params`` as a trial holds them), with ``overrides`` (e.g. threads,
        data_dir) on top: the one way a point becomes a config (run, dry run, validation, bench, the objective).
        A point on several devices runs with ``ddp_spawn`` (``auto``/``ddp`` are switched, with a warning once);
        other strategies re-launch the script per rank and are refused (ValueError)."""
        from ..config import RunConfig

        config = RunConfig.from_dict(self.config_for(params) | dict(overrides or {}))
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


def available_studies() -> dict[str, Path]:
    return {p.stem: p for p in sorted(STUDY_DIR.glob("*.yaml"))}


def load_spec(name_or_path: str, budget: str = "default") -> StudySpec:
    """Load a study by registry name or by path to a YAML file; ValueError (one line) on any problem."""
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget '{budget}'; valid choices: {', '.join(BUDGETS)}")
    studies = available_studies()
    path = studies.get(name_or_path) or Path(name_or_path)
    if not path.is_file():
        if path.suffix in (".yaml", ".yml"):
            raise ValueError(f"study file '{path}' does not exist")
        raise ValueError(f"unknown study '{name_or_path}'; valid studies: {', '.join(studies)} "
                         "(or a path to a .yaml file)")
    return _build(_read_study_file(path), budget, str(path))


def _read_study_file(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    """The mapping of a study file with its ``extends:`` chain resolved (the module docstring's rules); ValueError
    (one line) on any problem."""
    import yaml

    where = f"study file '{path}'" if not chain else f"base file '{path}' (extended by '{chain[-1]}')"
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        at = f" (line {line + 1})" if line is not None else ""
        raise ValueError(f"{where} is not valid YAML{at}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must hold a mapping with keys: {', '.join(_TOP_KEYS)}")
    _check_keys(raw, _TOP_KEYS, where)
    if "extends" not in raw:
        return raw
    extends = raw.pop("extends")
    if not isinstance(extends, str) or not extends.strip():
        raise ValueError(f"{where}: 'extends' must be the path of a base file, relative to the study file")
    base_path = _base_file(path, extends, where)
    if base_path in chain or base_path == path.resolve():
        raise ValueError(f"{where}: extends '{extends}', which extends it in turn (a circle of base files)")
    inherited = _read_study_file(base_path, (*chain, path.resolve()))
    if "dataset" in (raw.get("base") or {}):
        inherited = _without_data(inherited)
    return _laid_over(inherited, raw)


def _base_file(path: Path, extends: str, where: str) -> Path:
    """The base file ``extends`` names: a path relative to the study file, else to the committed studies' folder
    (``protocol/mnist5k.yaml`` finds the shared protocol from a study file anywhere); ValueError naming both."""
    candidates = [(path.parent / extends).expanduser().resolve(), (STUDY_DIR / extends).resolve()]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ValueError(f"{where}: extends '{extends}', but '{candidates[0]}' does not exist (nor '{candidates[1]}'); "
                     f"the path is relative to the study file or to {STUDY_DIR}: the shared protocol is "
                     f"'extends: {PROTOCOL.relative_to(STUDY_DIR)}'")


def _without_data(inherited: dict) -> dict:
    """A base file's mapping without the data it would give a study that names its own dataset: the
    :data:`DATA_FIELDS` of its ``base`` and of each budget's ``base``. A budget inherited from a base file shrinks a
    study (epochs, seeds, rates, width), never swaps its data; a budget of the study file itself may."""
    out = copy.deepcopy(inherited)
    for section in [out.get("base"), *[(b or {}).get("base") for b in (out.get("budgets") or {}).values()]]:
        for key in DATA_FIELDS:
            if isinstance(section, dict):
                section.pop(key, None)
    return out


def _laid_over(earlier: dict, later: dict) -> dict:
    """``later`` laid over ``earlier`` (a study file over its base file): mappings merge key by key, recursively (a
    ``base`` that sets a recipe first drops the recipe fields of the base it updates); lists and values replace."""
    merged = copy.deepcopy(earlier)
    for key, value in later.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            if key == "base":
                merged[key] = with_recipe(merged[key], copy.deepcopy(value))
            else:
                merged[key] = _laid_over(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _build(raw: dict, budget: str, source: str) -> StudySpec:
    where = f"study file '{source}'"
    _check_keys(raw, _TOP_KEYS, where)
    for key in ("name", "kind", "variants"):
        if key not in raw:
            raise ValueError(f"{where}: missing required key '{key}'")
    budgets = raw.get("budgets") or {}
    _check_keys(budgets, BUDGETS, f"{where} budgets")
    defined = tuple(b for b in BUDGETS if b == "default" or b in budgets)
    if budget not in defined:  # never the default's settings under another budget's name
        raise ValueError(f"{where} defines no '{budget}' budget; valid choices: {', '.join(defined)}")
    merged = copy.deepcopy({k: v for k, v in raw.items() if k != "budgets"})
    override = budgets.get(budget) or {}
    _check_keys(override, _BUDGET_KEYS, f"{where} budgets.{budget}")
    for key, value in override.items():
        if key == "base" and isinstance(value, dict):  # a budget's recipe replaces the study's recipe fields
            merged[key] = with_recipe(merged.get(key) or {}, value)
        elif key == "tune" and isinstance(value, dict) and isinstance(merged.get(key), dict):
            # a first look (smoke, quick) tunes its own short grid once: it extends only where it says so itself
            inherited = {k: v for k, v in merged[key].items() if k != "bounds" or budget not in FIRST_LOOK_BUDGETS}
            merged[key] = inherited | value
        elif key == "add_variants":
            if not isinstance(value, list):
                raise ValueError(f"{where} budgets.{budget}: add_variants is a list of variants to append, got "
                                 f"{type(value).__name__}")
            merged["variants"] = list(merged.get("variants") or []) + value
        elif key in ("axes", "search") and isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = (merged.get(key) or {}) | value
        else:
            merged[key] = value

    kind = merged["kind"]
    if kind not in ("grid", "search"):
        raise ValueError(f"{where}: kind '{kind}' is not valid; valid choices: grid, search")
    direction = merged.get("direction", "maximize")
    if direction not in ("maximize", "minimize"):
        raise ValueError(f"{where}: direction '{direction}' is not valid; valid choices: maximize, minimize")
    base = merged.get("base") or {}
    _check_config_keys(base, f"{where} base")
    variants = tuple(_variant(v, where) for v in merged["variants"] or [])
    if not variants:
        raise ValueError(f"{where}: 'variants' must list at least one variant")
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{where}: variant labels must be unique, got {', '.join(labels)}")
    matched = {v.label: v.params_of for v in variants if v.params_of is not None}
    for label, of in matched.items():
        if of not in labels or of == label or of in matched:
            valid = [v for v in labels if v != label and v not in matched]
            raise ValueError(f"{where}: variant '{label}' has params_of '{of}': it must name another row that is not "
                             f"itself matched; valid labels: {', '.join(valid)}")
    axes = merged.get("axes") or {}
    _check_config_keys(axes, f"{where} axes")
    for axis, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}: axis '{axis}' must be a non-empty list of values")
    for v in variants:
        for axis, values in v.tune_axes.items():
            if axis == "seed" or axis not in axes or any(x not in axes[axis] for x in values):
                raise ValueError(f"{where}: variant '{v.label}' tune_axes.{axis} {values} must list values of one of "
                                 f"the study's axes: {', '.join(f'{a} {axes[a]}' for a in axes if a != 'seed')}")
    search = merged.get("search") or {}
    _check_keys(search, _SEARCH_KEYS, f"{where} search")
    pruner = search.get("pruner") or {"type": "none"}
    if pruner.get("type") not in _PRUNERS:
        raise ValueError(f"{where}: pruner type '{pruner.get('type')}' is not valid; valid choices: {', '.join(_PRUNERS)}")
    space = search.get("space") or {}
    for label, params in space.items():
        if label not in labels:
            raise ValueError(f"{where}: search.space names variant '{label}'; valid labels: {', '.join(labels)}")
        for pname, dist in params.items():
            _check_keys(dist, _DIST_KEYS, f"{where} search.space.{label}.{pname}")
            if "choices" not in dist and not ("low" in dist and "high" in dist):
                raise ValueError(f"{where}: search.space.{label}.{pname} needs 'choices' or 'low' and 'high'")
    n_trials = int(search.get("n_trials", 0))
    if kind == "search" and n_trials <= 0:
        raise ValueError(f"{where}: a search study needs search.n_trials > 0")
    tune = _tune(merged.get("tune"), kind, axes, where, evidence=budget not in FIRST_LOOK_BUDGETS)
    return StudySpec(name=str(merged["name"]), budget=budget, kind=kind, description=str(merged.get("description", "")),
                     metric=str(merged.get("metric", "best_val_acc")), direction=direction, base=base,
                     variants=variants, axes=axes, n_trials=n_trials, pruner=pruner, space=space, source=source,
                     tune=tune, claims=_claims(merged.get("claims"), labels, where),
                     budgets=defined, floor=_floor(merged.get("floor"), where),
                     verdicts=parse_rules(merged.get("verdicts"), where))


def _floor(raw: Any, where: str) -> Floor | None:
    """The ``floor:`` section checked (one-line ValueErrors), or None when the study has none."""
    if raw is None:
        return None
    _check_keys(raw, _FLOOR_KEYS, f"{where} floor")
    metric = raw.get("metric", "final_val_acc")
    if metric not in FLOOR_METRICS:
        raise ValueError(f"{where} floor: metric '{metric}' is not valid; valid choices: {', '.join(FLOOR_METRICS)}")
    multiple = raw.get("chance_multiple", 2.0)
    if isinstance(multiple, bool) or not isinstance(multiple, (int, float)) or not 1.0 <= multiple:
        raise ValueError(f"{where} floor: chance_multiple must be a number >= 1 (a multiple of chance level), "
                         f"got {multiple!r}")
    return Floor(metric=metric, chance_multiple=float(multiple))


def _tune(raw: Any, kind: str, axes: dict, where: str, evidence: bool = True) -> TuneSpec | None:
    """The ``tune:`` section checked (one-line ValueErrors), or None when the study has none. ``evidence``: a budget
    whose numbers are evidence, which needs :data:`MIN_TUNE_SEEDS` tuning seeds and ``bounds``."""
    if raw is None:
        return None
    where = f"{where} tune"
    _check_keys(raw, _TUNE_KEYS, where)
    if kind != "grid":
        raise ValueError(f"{where}: a tuning stage needs kind: grid (a search study searches its own options)")
    for key in ("lr", "seeds"):
        if not isinstance(raw.get(key), list) or not raw[key]:
            raise ValueError(f"{where}: '{key}' must be a non-empty list")
    try:
        lrs = tuple(float(v) for v in raw["lr"])
    except (TypeError, ValueError):
        raise ValueError(f"{where}: 'lr' must list numbers, got {raw['lr']}") from None
    if any(not lr > 0 for lr in lrs) or len(set(lrs)) != len(lrs):
        raise ValueError(f"{where}: 'lr' must list distinct positive numbers, got {list(raw['lr'])}")
    seeds = raw["seeds"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"{where}: 'seeds' must list distinct integers >= 0, got {seeds}")
    shared = sorted(set(seeds) & set(axes.get("seed", [])))
    if shared:
        raise ValueError(f"{where}: tuning seeds {shared} are also reported seeds (axes.seed); the seeds an LR is "
                         "chosen on must never be reported")
    if "lr" in axes:
        raise ValueError(f"{where}: the study has an 'lr' axis; a tuning stage chooses the learning rate itself")
    metric = str(raw.get("metric", "best_val_acc"))
    if metric not in TUNE_METRICS:
        raise ValueError(f"{where}: metric '{metric}' is not a validation metric; valid choices: "
                         f"{', '.join(TUNE_METRICS)}")
    tune_axes = raw.get("axes") or {}
    _check_keys(tune_axes, tuple(a for a in axes if a != "seed"), f"{where} axes")
    for axis, values in tune_axes.items():
        if not isinstance(values, list) or not values or any(v not in axes[axis] for v in values):
            raise ValueError(f"{where}: axes.{axis} must list values of the study's axis {axis} {axes[axis]}, "
                             f"got {values}")
    if evidence and len(seeds) < MIN_TUNE_SEEDS:
        raise ValueError(f"{where}: {len(seeds)} tuning seed(s) {seeds}; a budget that is evidence needs at least "
                         f"{MIN_TUNE_SEEDS} (the mean over them chooses the rate: one seed's noise is the size of the "
                         "effects); only the smoke and quick budgets may use fewer")
    bounds = raw.get("bounds")
    if bounds is not None:
        if (not isinstance(bounds, list) or len(bounds) != 2
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 for b in bounds)
                or not bounds[0] <= min(lrs) <= max(lrs) <= bounds[1]):
            raise ValueError(f"{where}: 'bounds' must be [low, high], two positive numbers around the 'lr' grid "
                             f"{list(lrs)}, got {bounds}")
        bounds = (float(bounds[0]), float(bounds[1]))
    elif evidence:
        raise ValueError(f"{where}: 'bounds' is missing: declare [low, high] for the learning rates the grid may "
                         "extend to while its best rate is at an edge")
    return TuneSpec(lr=lrs, seeds=tuple(seeds), metric=metric, axes={k: list(v) for k, v in tune_axes.items()},
                    bounds=bounds)


def _variant(raw: Any, where: str) -> Variant:
    if not isinstance(raw, dict) or "residual" not in raw:
        raise ValueError(f"{where}: each variant needs at least 'residual' (keys: {', '.join(_VARIANT_KEYS)})")
    _check_keys(raw, _VARIANT_KEYS, f"{where} variant '{raw.get('label', raw['residual'])}'")
    _check_config_keys(raw.get("overrides") or {}, f"{where} variant overrides")
    label = str(raw.get("label", raw["residual"]))
    params_of = raw.get("params_of")
    if params_of is not None and (not isinstance(params_of, str) or "mlp_ratio" in (raw.get("overrides") or {})):
        raise ValueError(f"{where} variant '{label}': params_of names the label of the row whose parameter count "
                         f"this row's MLP width matches (then it sets no mlp_ratio itself), got {params_of!r}")
    tune_axes = raw.get("tune_axes") or {}
    if not isinstance(tune_axes, dict) or any(not isinstance(v, list) or not v for v in tune_axes.values()):
        raise ValueError(f"{where} variant '{label}': tune_axes maps an axis to the values this row's rate is tuned "
                         f"at (e.g. {{depth: [4]}}), got {tune_axes!r}")
    return Variant(label=label, residual=str(raw["residual"]), options=dict(raw.get("options") or {}),
                   overrides=dict(raw.get("overrides") or {}), params_of=params_of,
                   tune_axes={k: list(v) for k, v in tune_axes.items()})


def _claims(raw: Any, labels: list[str], where: str) -> tuple[Claim, ...]:
    """The ``claims:`` list: each a mapping of :data:`_CLAIM_KEYS`; ids unique; a testable claim names two variant
    labels and a direction, an untestable one (``testable: false``) its reason."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"{where}: 'claims' must be a list of mappings with keys: {', '.join(_CLAIM_KEYS)}")
    claims = [_claim(item, index, labels, where) for index, item in enumerate(raw)]
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{where}: claim ids must be unique, got {', '.join(ids)}")
    return tuple(claims)


def _claim(raw: Any, index: int, labels: list[str], where: str) -> Claim:
    at = f"{where} claims[{index}]"
    _check_keys(raw, _CLAIM_KEYS, at)
    for key in ("id", "claim", "source"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ValueError(f"{at}: '{key}' must be a non-empty string")
    at = f"{where} claim '{raw['id']}'"
    testable = raw.get("testable", True)
    if not isinstance(testable, bool):
        raise ValueError(f"{at}: 'testable' must be true or false, got '{testable}'")
    if not testable:
        if not isinstance(raw.get("reason"), str) or not raw["reason"].strip():
            raise ValueError(f"{at}: an untestable claim ('testable: false') needs a 'reason'")
        return Claim(id=raw["id"], claim=raw["claim"], source=raw["source"], testable=False, reason=raw["reason"])
    for key in ("variant", "baseline"):
        if raw.get(key) not in labels:
            raise ValueError(f"{at}: {key} '{raw.get(key)}' is not a variant label of the study; valid labels: "
                             f"{', '.join(labels)}")
    if raw["variant"] == raw["baseline"]:
        raise ValueError(f"{at}: variant and baseline are both '{raw['variant']}'")
    if raw.get("direction") not in CLAIM_DIRECTIONS:
        raise ValueError(f"{at}: direction '{raw.get('direction')}' is not valid; valid choices: "
                         f"{', '.join(CLAIM_DIRECTIONS)}")
    depth, baseline_depth = raw.get("depth"), raw.get("baseline_depth")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise ValueError(f"{at}: depth must be a positive integer (or left out: every depth), got '{depth}'")
    if baseline_depth is not None and (isinstance(baseline_depth, bool) or not isinstance(baseline_depth, int)
                                       or baseline_depth < 1):
        raise ValueError(f"{at}: baseline_depth must be a positive integer (or left out: the variant's depth), "
                         f"got '{baseline_depth}'")
    metric = raw.get("metric")
    if metric is not None and metric not in CLAIM_METRICS:
        raise ValueError(f"{at}: metric '{metric}' is not valid; valid choices: {', '.join(CLAIM_METRICS)}")
    if "reason" in raw:
        raise ValueError(f"{at}: 'reason' is for untestable claims ('testable: false') only")
    kind, margin = raw.get("kind", "superior"), raw.get("margin")
    if kind not in CLAIM_KINDS:
        raise ValueError(f"{at}: kind '{kind}' is not valid; valid choices: {', '.join(CLAIM_KINDS)}")
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float)) or margin <= 0):
        raise ValueError(f"{at}: margin must be a positive number (an accuracy fraction, or a ratio above 1 for kind "
                         f"faster), got {margin!r}")
    return Claim(id=raw["id"], claim=raw["claim"], source=raw["source"], variant=raw["variant"],
                 baseline=raw["baseline"], depth=depth, baseline_depth=baseline_depth, direction=raw["direction"],
                 counts=str(raw.get("counts", "")), metric=metric, premise=_premise(raw.get("premise"), labels, at),
                 kind=kind, margin=None if margin is None else float(margin))


def _premise(raw: Any, labels: list[str], at: str) -> Premise | None:
    """A claim's ``premise:`` (:class:`Premise`) checked: one-line ValueErrors, or None when it has none."""
    if raw is None:
        return None
    at = f"{at} premise"
    _check_keys(raw, _PREMISE_KEYS, at)
    if not isinstance(raw.get("claim"), str) or not raw["claim"].strip():
        raise ValueError(f"{at}: 'claim' must say what the premise is, in words")
    for key in ("variant", "baseline"):
        if raw.get(key) not in labels:
            raise ValueError(f"{at}: {key} '{raw.get(key)}' is not a variant label of the study; valid labels: "
                             f"{', '.join(labels)}")
    for key in ("depth", "baseline_depth"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{at}: {key} must be a positive integer, got '{value}'")
    if raw["variant"] == raw["baseline"] and raw.get("baseline_depth") in (None, raw.get("depth")):
        raise ValueError(f"{at}: variant and baseline are both '{raw['variant']}' at the same depth")
    direction = raw.get("direction", "lower")
    if direction not in PREMISE_DIRECTIONS:
        raise ValueError(f"{at}: direction '{direction}' is not valid; valid choices: {', '.join(PREMISE_DIRECTIONS)}")
    metric = raw.get("metric")
    if metric is not None and metric not in CLAIM_METRICS:
        raise ValueError(f"{at}: metric '{metric}' is not valid; valid choices: {', '.join(CLAIM_METRICS)}")
    return Premise(claim=raw["claim"], variant=raw["variant"], baseline=raw["baseline"], depth=raw.get("depth"),
                   baseline_depth=raw.get("baseline_depth"), direction=direction, metric=metric)


def _check_keys(mapping: Any, valid: tuple, where: str) -> None:
    if not isinstance(mapping, dict):
        raise ValueError(f"{where} must be a mapping with keys: {', '.join(valid)}")
    for key in mapping:
        if key not in valid:
            raise ValueError(f"{where}: unknown key '{key}'; valid keys: {', '.join(valid)}")


def _check_config_keys(mapping: dict, where: str) -> None:
    from ..config import RunConfig

    valid = tuple(f.name for f in dataclasses.fields(RunConfig))
    _check_keys(mapping, valid, where)
