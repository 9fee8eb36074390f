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
  ``axes`` and ``tune`` each key by key), ``tune`` updates ``tune``; a budget is laid over the study by the same
  rule (:func:`ablations.config.tree.merge`);
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
from pathlib import Path
from typing import Any

from ..config import OPTIONS, flat, layer
from ..config.tree import check_keys, merge
from .claims import Claim, parse_claims
from .design import (
    BUDGETS,
    CONTEND_POINTS,
    FIRST_LOOK_BUDGETS,
    ROUND_POINTS,
    SPAWN_STRATEGIES,
    STUDY_DIR,
    TUNE_AT_BOUND,
    TUNE_EXTRA,
    TUNE_GRID,
    TUNE_MEANS,
    TUNED_LR,
    Floor,
    StudySpec,
    TuneSpec,
    Variant,
    contend_name,
    lr_value,
    parent_name,
    resolved,
    round_name,
    tune_name,
)
from .rules import parse as parse_rules

# Imported where it is used, not here: PyYAML (a tenth of a second; the command-line tools start without it).

__all__ = ["BUDGETS", "CONTEND_POINTS", "DATA_FIELDS", "FIRST_LOOK_BUDGETS", "MIN_TUNE_SEEDS", "PROTOCOL",
           "ROUND_POINTS", "SPAWN_STRATEGIES", "STUDY_DIR", "TUNED_LR", "TUNE_AT_BOUND", "TUNE_EXTRA", "TUNE_GRID",
           "TUNE_MEANS", "Claim", "Floor", "StudySpec", "TuneSpec", "Variant", "available_studies", "contend_name",
           "load_spec", "lr_value", "parent_name", "resolved", "round_name", "tune_name"]

PROTOCOL = STUDY_DIR / "protocol" / "mnist5k.yaml"  # the shared protocol of the committed studies
#: the fields that say which images a study trains on and how they are cut into tokens: a study file that sets
#: ``dataset`` in its ``base`` takes none of them from its base file or its base file's budgets (``_without_data``)
DATA_FIELDS = ("dataset", "data_dir", "dataset_options", "patch_size")

_TOP_KEYS = ("extends", "name", "description", "kind", "metric", "direction", "base", "variants", "axes", "search",
             "tune", "floor", "budgets", "claims", "verdicts")
_BUDGET_KEYS = ("base", "variants", "add_variants", "axes", "search", "tune", "description")
_TUNE_KEYS = ("lr", "seeds", "bounds", "metric", "axes")
#: tuning seeds an evidence budget needs (the mean over them picks the rate; ``smoke``/``quick`` may use fewer)
MIN_TUNE_SEEDS = 3
_FLOOR_KEYS = ("metric", "chance_multiple")
FLOOR_METRICS = ("final_val_acc", "best_val_acc")
TUNE_METRICS = ("best_val_acc", "final_val_acc")  # validation metrics: the tuning stage never reads the test split
_VARIANT_KEYS = ("label", "residual", "options", "overrides", "params_of", "tune_axes")
_SEARCH_KEYS = ("n_trials", "pruner", "space", "sampler")
_PRUNERS = ("none", "median", "hyperband")
_DIST_KEYS = ("low", "high", "log", "choices")
#: how a study file is laid over its base file and a budget over its study: the one merge
#: (:func:`ablations.config.tree.merge`), a ``base`` by the rule of a run's settings (:func:`ablations.config.layer`:
#: the options' flat names, the recipe rule)
_LAID_OVER = {"base": layer}


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
    check_keys(raw, _TOP_KEYS, where)
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
    return merge(inherited, raw, at=_LAID_OVER)


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


def _with_budget(raw: dict, budget: str, where: str) -> dict:
    """The study file's mapping with the budget's settings laid over it, and without its ``budgets``. A budget's
    ``add_variants`` appends rows to the study's; a first look (smoke, quick) that tunes a short grid of its own does
    not inherit the study's ``bounds`` (it extends only where it says so itself)."""
    study = {k: v for k, v in raw.items() if k != "budgets"}
    override = dict((raw.get("budgets") or {}).get(budget) or {})
    check_keys(override, _BUDGET_KEYS, f"{where} budgets.{budget}")
    if "add_variants" in override:
        rows = override.pop("add_variants")
        if not isinstance(rows, list):
            raise ValueError(f"{where} budgets.{budget}: add_variants is a list of variants to append, got "
                             f"{type(rows).__name__}")
        override["variants"] = list(override.get("variants", study.get("variants")) or []) + rows
    if budget in FIRST_LOOK_BUDGETS and isinstance(override.get("tune"), dict) and isinstance(study.get("tune"), dict):
        study["tune"] = {k: v for k, v in study["tune"].items() if k != "bounds"}
    return merge(study, override, at=_LAID_OVER)


def _build(raw: dict, budget: str, source: str) -> StudySpec:
    where = f"study file '{source}'"
    check_keys(raw, _TOP_KEYS, where)
    for key in ("name", "kind", "variants"):
        if key not in raw:
            raise ValueError(f"{where}: missing required key '{key}'")
    budgets = raw.get("budgets") or {}
    check_keys(budgets, BUDGETS, f"{where} budgets")
    defined = tuple(b for b in BUDGETS if b == "default" or b in budgets)
    if budget not in defined:  # never the default's settings under another budget's name
        raise ValueError(f"{where} defines no '{budget}' budget; valid choices: {', '.join(defined)}")
    merged = _with_budget(raw, budget, where)
    kind = _choice("kind", merged.get("kind", "grid"), ("grid", "search"), where)
    direction = _choice("direction", merged.get("direction", "maximize"), ("maximize", "minimize"), where)
    base = _check_config_keys(merged.get("base") or {}, f"{where} base")
    variants = _variants(merged.get("variants"), where)
    labels = [v.label for v in variants]
    axes = _axes(merged.get("axes"), variants, where)
    n_trials, pruner, space = _search(merged.get("search"), kind, labels, where)
    tune = _tune(merged.get("tune"), kind, axes, where, evidence=budget not in FIRST_LOOK_BUDGETS)
    return StudySpec(name=str(merged["name"]), budget=budget, kind=kind, description=str(merged.get("description", "")),
                     metric=str(merged.get("metric", "best_val_acc")), direction=direction, base=base,
                     variants=variants, axes=axes, n_trials=n_trials, pruner=pruner, space=space, source=source,
                     tune=tune, claims=parse_claims(merged.get("claims"), labels, where),
                     budgets=defined, floor=_floor(merged.get("floor"), where),
                     verdicts=parse_rules(merged.get("verdicts"), where))


def _choice(key: str, value: Any, valid: tuple[str, ...], where: str) -> str:
    if value not in valid:
        raise ValueError(f"{where}: {key} '{value}' is not valid; valid choices: {', '.join(valid)}")
    return value


def _variants(raw: Any, where: str) -> tuple[Variant, ...]:
    """The study's rows: at least one, labels unique, each ``params_of`` naming another row that is not matched."""
    variants = tuple(_variant(v, where) for v in raw or [])
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
    return variants


def _axes(raw: Any, variants: tuple[Variant, ...], where: str) -> dict:
    """The grid's axes (config fields -> non-empty lists), and each row's ``tune_axes`` checked against them."""
    axes = _check_config_keys(raw or {}, f"{where} axes")
    for axis, values in axes.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}: axis '{axis}' must be a non-empty list of values")
    for v in variants:
        for axis, values in v.tune_axes.items():
            if axis == "seed" or axis not in axes or any(x not in axes[axis] for x in values):
                raise ValueError(f"{where}: variant '{v.label}' tune_axes.{axis} {values} must list values of one of "
                                 f"the study's axes: {', '.join(f'{a} {axes[a]}' for a in axes if a != 'seed')}")
    return axes


def _search(raw: Any, kind: str, labels: list[str], where: str) -> tuple[int, dict, dict]:
    """``search:`` checked: (n_trials, pruner, space)."""
    search = raw or {}
    check_keys(search, _SEARCH_KEYS, f"{where} search")
    pruner = search.get("pruner") or {"type": "none"}
    if pruner.get("type") not in _PRUNERS:
        raise ValueError(f"{where}: pruner type '{pruner.get('type')}' is not valid; valid choices: {', '.join(_PRUNERS)}")
    space = search.get("space") or {}
    for label, params in space.items():
        if label not in labels:
            raise ValueError(f"{where}: search.space names variant '{label}'; valid labels: {', '.join(labels)}")
        for pname, dist in params.items():
            check_keys(dist, _DIST_KEYS, f"{where} search.space.{label}.{pname}")
            if "choices" not in dist and not ("low" in dist and "high" in dist):
                raise ValueError(f"{where}: search.space.{label}.{pname} needs 'choices' or 'low' and 'high'")
    n_trials = int(search.get("n_trials", 0))
    if kind == "search" and n_trials <= 0:
        raise ValueError(f"{where}: a search study needs search.n_trials > 0")
    return n_trials, pruner, space


def _floor(raw: Any, where: str) -> Floor | None:
    """The ``floor:`` section checked (one-line ValueErrors), or None when the study has none."""
    if raw is None:
        return None
    check_keys(raw, _FLOOR_KEYS, f"{where} floor")
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
    check_keys(raw, _TUNE_KEYS, where)
    if kind != "grid":
        raise ValueError(f"{where}: a tuning stage needs kind: grid (a search study searches its own options)")
    for key in ("lr", "seeds"):
        if not isinstance(raw.get(key), list) or not raw[key]:
            raise ValueError(f"{where}: '{key}' must be a non-empty list")
    lrs = _tune_rates(raw["lr"], where)
    seeds = _tune_seeds(raw["seeds"], axes, where)
    if "lr" in axes:
        raise ValueError(f"{where}: the study has an 'lr' axis; a tuning stage chooses the learning rate itself")
    metric = str(raw.get("metric", "best_val_acc"))
    if metric not in TUNE_METRICS:
        raise ValueError(f"{where}: metric '{metric}' is not a validation metric; valid choices: "
                         f"{', '.join(TUNE_METRICS)}")
    tune_axes = raw.get("axes") or {}
    check_keys(tune_axes, tuple(a for a in axes if a != "seed"), f"{where} axes")
    for axis, values in tune_axes.items():
        if not isinstance(values, list) or not values or any(v not in axes[axis] for v in values):
            raise ValueError(f"{where}: axes.{axis} must list values of the study's axis {axis} {axes[axis]}, "
                             f"got {values}")
    if evidence and len(seeds) < MIN_TUNE_SEEDS:
        raise ValueError(f"{where}: {len(seeds)} tuning seed(s) {seeds}; a budget that is evidence needs at least "
                         f"{MIN_TUNE_SEEDS} (the mean over them chooses the rate: one seed's noise is the size of the "
                         "effects); only the smoke and quick budgets may use fewer")
    return TuneSpec(lr=lrs, seeds=tuple(seeds), metric=metric, axes={k: list(v) for k, v in tune_axes.items()},
                    bounds=_tune_bounds(raw.get("bounds"), lrs, where, evidence))


def _tune_rates(raw: list, where: str) -> tuple[float, ...]:
    try:
        lrs = tuple(float(v) for v in raw)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: 'lr' must list numbers, got {raw}") from None
    if any(not lr > 0 for lr in lrs) or len(set(lrs)) != len(lrs):
        raise ValueError(f"{where}: 'lr' must list distinct positive numbers, got {list(raw)}")
    return lrs


def _tune_seeds(seeds: list, axes: dict, where: str) -> list[int]:
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"{where}: 'seeds' must list distinct integers >= 0, got {seeds}")
    shared = sorted(set(seeds) & set(axes.get("seed", [])))
    if shared:
        raise ValueError(f"{where}: tuning seeds {shared} are also reported seeds (axes.seed); the seeds an LR is "
                         "chosen on must never be reported")
    return seeds


def _tune_bounds(bounds: Any, lrs: tuple[float, ...], where: str, evidence: bool) -> tuple[float, float] | None:
    if bounds is None:
        if evidence:
            raise ValueError(f"{where}: 'bounds' is missing: declare [low, high] for the learning rates the grid may "
                             "extend to while its best rate is at an edge")
        return None
    if (not isinstance(bounds, list) or len(bounds) != 2
            or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and b > 0 for b in bounds)
            or not bounds[0] <= min(lrs) <= max(lrs) <= bounds[1]):
        raise ValueError(f"{where}: 'bounds' must be [low, high], two positive numbers around the 'lr' grid "
                         f"{list(lrs)}, got {bounds}")
    return float(bounds[0]), float(bounds[1])


def _variant(raw: Any, where: str) -> Variant:
    if not isinstance(raw, dict) or "residual" not in raw:
        raise ValueError(f"{where}: each variant needs at least 'residual' (keys: {', '.join(_VARIANT_KEYS)})")
    check_keys(raw, _VARIANT_KEYS, f"{where} variant '{raw.get('label', raw['residual'])}'")
    overrides = _check_config_keys(raw.get("overrides") or {}, f"{where} variant overrides")
    label = str(raw.get("label", raw["residual"]))
    params_of = raw.get("params_of")
    if params_of is not None and (not isinstance(params_of, str) or "mlp_ratio" in overrides):
        raise ValueError(f"{where} variant '{label}': params_of names the label of the row whose parameter count "
                         f"this row's MLP width matches (then it sets no mlp_ratio itself), got {params_of!r}")
    tune_axes = raw.get("tune_axes") or {}
    if not isinstance(tune_axes, dict) or any(not isinstance(v, list) or not v for v in tune_axes.values()):
        raise ValueError(f"{where} variant '{label}': tune_axes maps an axis to the values this row's rate is tuned "
                         f"at (e.g. {{depth: [4]}}), got {tune_axes!r}")
    return Variant(label=label, residual=str(raw["residual"]), options=dict(raw.get("options") or {}),
                   overrides=overrides, params_of=params_of,
                   tune_axes={k: list(v) for k, v in tune_axes.items()})


def _check_config_keys(mapping: dict, where: str) -> dict:
    """``mapping``'s settings by their options' flat names (``optim.lr`` is ``lr``), each an option of RunConfig."""
    if not isinstance(mapping, dict):
        raise ValueError(f"{where} must be a mapping with keys: {', '.join(OPTIONS)}")
    names = flat(mapping)
    check_keys(names, tuple(OPTIONS), where)
    return names
