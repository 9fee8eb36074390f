"""``RunConfig``: one training run's configuration, one tree of frozen dataclasses (nanoGPT's config, passed whole)::

    RunConfig
    ├── model          lit_modules.config.ViTConfig: the backbone; its geometry is the dataset's (model_config)
    ├── data           data.DataConfig: the dataset, its splits and its loading
    ├── recipe         the training recipe (ablations.recipes): the defaults of the augmentation and the optimiser
    ├── augmentation   ablations.recipes.AugmentConfig: per-image and per-batch training augmentation
    ├── optim          lit_modules.config.OptimConfig: the optimiser and its learning-rate schedule
    └── trainer        TrainerConfig: epochs, seed, precision, devices, diagnostics

Each field is declared once, with its default, help line and valid names (``metadata``), in the dataclass that
holds it. Every option is a leaf named by its own field name, unique in the tree (:data:`OPTIONS`,
:func:`ablations.config.tree.leaves`): ``lr`` is ``optim.lr``, ``embed_dim`` is ``model.embed_dim``. Study files, ``--set``,
the command line (``--lr``: generated from the tree, :mod:`ablations.config.options`), stored results
(``to_dict()``: the flat names) and attribute access (``config.lr``) use these names; ``optim: {lr: ...}`` and
``optim.lr`` name the same leaf (:func:`flat`). One rule lays settings over settings (:func:`layer`).

Torch-free on purpose (the CLI's ``--help`` must not pay the ~4 s torch/lightning import): names are checked
against the torch-free name tables (``lit_modules.names``, ``data.names``; a test keeps them equal to the real
registries). Options that need the model to check (a residual variant's own options, dataset folder contents) are
checked when the run is built and raise ValueError there.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ablations.recipes import RECIPE_FIELDS, RECIPE_HELP, RECIPE_NAMES, AugmentConfig, recipe_values
from data.names import DATASET_NAMES
from data.settings import DataConfig
from lit_modules.config import GEOMETRY, PRESETS, OptimConfig, ViTConfig, in_range, option, positive
from lit_modules.names import (
    ATTENTION_NAMES,
    NORM_LAYER_NAMES,
    RESIDUAL_NAMES,
    STREAM_KERNEL_NAMES,
)
from lit_modules.names import OPTIMIZER_NAMES as OPTIMIZERS

from .tree import Leaf, coerce, leaves, merge, subtrees

__all__ = ["ATTENTION_NAMES", "DATASET_NAMES", "NORM_LAYER_NAMES", "OPTIMIZERS", "RESIDUAL_NAMES"]

#: The option of each variant that ``--init-value`` sets (its "init knob"); variants not listed have none.
INIT_VALUE_OPTIONS: dict[str, str] = {
    "layerscale": "init_value",  # float, 'auto' (CaiT's depth rule) or None (no LayerScale: standard)
    "rezero": "init_value",
    "skipinit": "init_value",
    "highway": "gate_bias",
}

#: Lightning precision strings accepted by ``TrainerConfig.precision``, and ``auto`` (:mod:`ablations.machine.modes`).
PRECISIONS: tuple[str, ...] = ("auto", "32-true", "64-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true")
ACCELERATORS: tuple[str, ...] = ("auto", "cpu", "gpu", "cuda")
#: A run's backbone before its dataset is known: the study preset (``lit_modules.config.PRESETS``), its geometry
#: (image size, channels, classes, default patch) the dataset's (:meth:`RunConfig.model_config`).
RUN_MODEL = PRESETS["study"].replace(**dict.fromkeys(GEOMETRY))


@dataclass(frozen=True)
class TrainerConfig:
    """How long, where and in which arithmetic the run trains, and what it measures on the way."""

    max_epochs: int = option(30, "training epochs")
    seed: int = option(0, "seed of the model init, the data split, shuffling and augmentation")
    threads: int | None = option(None, "torch.set_num_threads (None: all cores)")
    precision: str = option("auto", "Lightning precision", PRECISIONS, " (auto: the fastest measured for the device, "
                                                                       "together with the attention kernel unless "
                                                                       "fused_attn is given)")
    accuracy_thresholds: tuple[float, ...] = option((0.5, 0.8, 0.9, 0.95), "absolute val accuracies for "
                                                                           "epochs_to_acc_<t>")
    diagnostics_every: int = option(0, "residual diagnostics every N epochs (0: off)")
    diagnostics_batch_size: int = option(64, "images in the fixed diagnostics batch")
    diagnostics_sim_k: int = option(3, "DeepViT similarity against the K following blocks (the paper's K was not "
                                       "retrieved)")
    accelerator: str = option("auto", "where to train", ACCELERATORS, " (auto: cuda if available, else cpu)")
    devices: int | Literal["auto"] = option(1, "devices per node (an int or auto)")
    strategy: str = option("auto", "Lightning strategy (auto, ddp, ddp_spawn, ...)")
    compile: bool = option(False, "compile the backbone in place (model.compile(); slow start on CPU)")
    stream_kernels: str = option("auto", "Hyper-Connections' and mHC's per-token passes", STREAM_KERNEL_NAMES,
                                 " (auto: compiled on a CPU where torch.compile builds kernels, eager on a GPU or with "
                                 "--compile; the same function)")

    def check(self) -> None:
        for name in ("max_epochs", "diagnostics_batch_size", "diagnostics_sim_k"):
            positive(name, getattr(self, name))
        for name in ("seed", "diagnostics_every"):
            in_range(name, getattr(self, name), 0, math.inf)
        if self.threads is not None:
            positive("threads", self.threads)
        if not self.accuracy_thresholds:
            raise ValueError("accuracy_thresholds must not be empty")
        for t in self.accuracy_thresholds:
            in_range("accuracy_thresholds", t, 0.0, 1.0, low_open=True)
        if self.devices != "auto":
            positive("devices", self.devices)
        if not self.strategy:
            raise ValueError("strategy must be a non-empty string")


@dataclass(frozen=True, init=False)
class RunConfig:
    """One run. Immutable; ``RunConfig(**values)`` takes options by name (``lr=2e-3``), by path (``optim.lr``), as
    mappings (``optim={"lr": 2e-3}``) or as whole subtrees (``optim=OptimConfig(...)``), options named on their own
    winning over the subtree that holds them; a recipe option not given is the recipe's. ``replace(**changes)``
    returns a validated copy. Invalid values raise ValueError with a one-line message (``unknown residual 'foo';
    valid choices: ...``). ``config.lr`` reads the leaf ``config.optim.lr``."""

    model: ViTConfig = field(default_factory=lambda: RUN_MODEL)
    data: DataConfig = field(default_factory=DataConfig)
    recipe: str = option("basic", "training recipe, the default of every option marked 'recipe'", RECIPE_NAMES,
                         " (" + "; ".join(f"{k}: {v}" for k, v in RECIPE_HELP.items()) + ")")
    augmentation: AugmentConfig = field(default_factory=AugmentConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __init__(self, **values: Any) -> None:
        wholes = {k: values.pop(k) for k in list(values) if k in SUBTREES and dataclasses.is_dataclass(values[k])}
        given = flat(values)
        unknown = [k for k in given if k not in OPTIONS]
        if unknown:
            raise ValueError(f"unknown config key {unknown[0]!r}; valid keys: {', '.join(OPTIONS)}")
        recipe = coerce("recipe", str, given.pop("recipe", "basic"))
        defaults = recipe_values(recipe)  # ValueError naming the recipes for an unknown one
        object.__setattr__(self, "recipe", recipe)
        for name in SUBTREES:
            tree = wholes.get(name) or _DEFAULT_TREES[name]
            recipe_says = {} if name in wholes else defaults  # a subtree given whole is given whole
            changes = {leaf.name: coerce(leaf.name, leaf.hint,
                                         given.get(leaf.name, recipe_says.get(leaf.name, getattr(tree, leaf.name))))
                       for leaf in OPTIONS.values() if leaf.path[0] == name}
            same = all(type(v) is type(getattr(tree, k)) and v == getattr(tree, k) for k, v in changes.items())
            object.__setattr__(self, name, tree if same else dataclasses.replace(tree, **changes))
        self._check()

    def __getattr__(self, name: str) -> Any:  # config.lr: the leaf optim.lr (only called for names not found)
        leaf = OPTIONS.get(name)
        if leaf is None or len(leaf.path) < 2:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(object.__getattribute__(self, leaf.path[0]), name)

    def _check(self) -> None:
        for leaf in OPTIONS.values():
            value = getattr(self, leaf.name)
            if leaf.choices and value not in leaf.choices:
                raise ValueError(f"unknown {leaf.name} {value!r}; valid choices: {', '.join(leaf.choices)}")
            if leaf.is_mapping:
                for key in value:
                    if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                        raise ValueError(f"{leaf.name} key {key!r} is not a valid option name")
        self.model.check(geometry=False)  # the backbone's own checks, without the geometry the dataset decides
        self.data.check()
        self.augmentation.check()
        self.optim.check()
        self.trainer.check()

    # --- conversions -------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunConfig:
        """Build from a plain mapping (a YAML study entry, ``to_dict()``, a nested ``to_tree()``); unknown keys raise
        ValueError naming the valid ones."""
        return cls(**dict(values))

    def to_dict(self) -> dict[str, Any]:
        """Every option by its flat name, as plain Python values (dicts copied, tuples kept); ``from_dict`` inverts
        it. This is what a study stores of each trial."""
        return {name: _copy(getattr(self, name)) for name in OPTIONS}

    def to_tree(self) -> dict[str, Any]:
        """Every option in the tree's shape (``{"recipe": ..., "model": {...}, "optim": {"lr": ...}, ...}``)."""
        out: dict[str, Any] = {}
        for name, leaf in OPTIONS.items():
            node = out
            for part in leaf.path[:-1]:
                node = node.setdefault(part, {})
            node[name] = _copy(getattr(self, name))
        return out

    def replace(self, **changes: Any) -> RunConfig:
        """A validated copy with some options changed. A new ``recipe`` also resets the recipe's options that are
        not among ``changes`` to the new recipe's values."""
        keep: dict[str, Any] = {name: getattr(self, name) for name in SUBTREES}
        if "recipe" in changes:
            keep = {k: v for k, v in keep.items() if k not in ("augmentation", "optim")}
        return RunConfig(**keep, **({"recipe": self.recipe} | changes))

    def recipe_values(self) -> dict[str, Any]:
        """This run's values of the recipe fields (:data:`ablations.recipes.RECIPE_FIELDS`)."""
        return {name: getattr(self, name) for name in RECIPE_FIELDS}

    def model_config(self, shape: Mapping[str, Any]) -> ViTConfig:
        """The backbone this run trains, its geometry resolved from the dataset's ``shape`` (``img_size``,
        ``in_chans``, ``num_classes`` and the default ``patch_size``: ``data.dataset_shape`` or a DataModule's
        attributes); the run's ``patch_size`` wins over the dataset's. Every consumer (training, FLOP counts, the
        report's costs) builds the model from this one object."""
        geometry = {name: shape[name] for name in GEOMETRY}
        geometry["patch_size"] = self.model.patch_size or shape["patch_size"]
        return self.model.replace(**geometry)

    def same_residual(self, stored: Mapping[str, Any]) -> bool:
        """Whether a stored run's configuration (its ``residual`` and ``residual_options``, as ``to_dict`` or a
        runs.csv row gives them) names this run's residual with the same options."""
        return (stored.get("residual") == self.residual
                and dict(stored.get("residual_options") or {}) == dict(self.residual_options or {}))

    @property
    def mixes(self) -> bool:
        """Whether training batches are mixed (Mixup or CutMix on, and augmentation on)."""
        return self.data.augment and self.augmentation.mixes

    def to_hparams(self) -> dict[str, int | float | str | bool]:
        """Flat scalars for Lightning/TensorBoard HParams: options flattened as ``residual.<key>``,
        ``attention.<key>`` and ``dataset.<key>``, tuples/lists as comma-joined strings, None as the string
        ``'None'``."""
        flat_: dict[str, Any] = {}
        for name, leaf in OPTIONS.items():
            value = getattr(self, name)
            if leaf.is_mapping:
                prefix = name[: -len("_options")]
                flat_.update({f"{prefix}.{k}": _scalar(v) for k, v in sorted(value.items())})
            else:
                flat_[name] = _scalar(value)
        return flat_

    def run_name(self) -> str:
        """A short file-name-safe description, e.g. ``layerscale-init_value=auto_d8_w64_digits_s0``; a
        non-default attention, class-attention head, norm layer or value residual is appended to the residual's
        part (``standard+re_attention-head_norm=layer+ca2+rmsnorm+vr_fixed_d8_...``)."""
        m, default = self.model, RUN_MODEL
        opts = _options_text(m.residual_options)
        if m.attention != default.attention or m.attention_options:
            opts += f"+{m.attention}" + _options_text(m.attention_options)
        if m.class_attention_blocks:
            opts += f"+ca{m.class_attention_blocks}"
        if m.norm_layer != default.norm_layer or m.norm_options:
            opts += f"+{m.norm_layer}" + _options_text(m.norm_options)
        if m.value_residual != default.value_residual:
            opts += f"+vr_{m.value_residual}"
        if m.qk_norm != default.qk_norm:
            opts += f"+qk_{m.qk_norm}"
        if m.attention_gate != default.attention_gate:
            opts += f"+gate_{m.attention_gate}"
        if m.parametrization != default.parametrization or m.parametrization_options:
            opts += f"+{m.parametrization}" + _options_text(m.parametrization_options)
        name = f"{m.residual}{opts}_d{m.depth}_w{m.embed_dim}_{self.dataset}_s{self.seed}"
        return re.sub(r"[^A-Za-z0-9._=+-]", "", name.replace(" ", ""))

    def __hash__(self) -> int:  # dict fields: hash the canonical repr instead
        return hash(repr(sorted(self.to_hparams().items())))


#: The subtrees of a run (``model``, ``data``, ``augmentation``, ``optim``, ``trainer``) and their classes.
SUBTREES: dict[str, type] = subtrees(RunConfig)
_DEFAULT_TREES = {f.name: f.default_factory() for f in dataclasses.fields(RunConfig) if f.name in SUBTREES}
#: Every option of a run by its flat name (:func:`ablations.config.tree.leaves`), in the tree's order.
OPTIONS: dict[str, Leaf] = leaves(RunConfig)
_BY_PATH = {leaf.path: name for name, leaf in OPTIONS.items()}
#: The top of the tree, in order: the subtrees and the run's own options (the command line's option groups).
GROUPS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RunConfig))


def flat(values: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    """Settings by their options' flat names: ``{"optim": {"lr": 1e-3}}`` and ``{"optim.lr": 1e-3}`` become
    ``{"lr": 1e-3}``; flat names and keys that name no option stay as they are (the caller refuses those)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        path = (*prefix, *str(key).split("."))
        if len(path) == 1 and path[0] in SUBTREES and isinstance(value, Mapping):
            out |= flat(value, path)
        elif path in _BY_PATH or len(path) > 1:
            out[_BY_PATH.get(path, ".".join(path))] = value
        else:
            out[key] = value
    return out


def layer(earlier: Mapping[str, Any], later: Mapping[str, Any]) -> dict[str, Any]:
    """``later``'s settings laid over ``earlier``'s (a study's base and a budget's, a row's overrides, a grid
    point, ``--set``, a config file and the command line): by the flat names (:func:`flat`), with
    :func:`ablations.config.tree.merge` (an options mapping merges key by key), except that a ``recipe`` in ``later`` first
    drops the recipe options of ``earlier``: the new recipe supplies them unless ``later`` sets them too."""
    earlier, later = flat(earlier), flat(later)
    if "recipe" in later:
        earlier = {k: v for k, v in earlier.items() if k not in RECIPE_FIELDS}
    return merge(earlier, later)


def mapping_options() -> tuple[str, ...]:
    """Names of the options that hold a mapping of options (``residual_options``, ``attention_options``, ...)."""
    return tuple(name for name, leaf in OPTIONS.items() if leaf.is_mapping)


# --- helpers -----------------------------------------------------------------------------------------------------
def _options_text(options: Mapping[str, Any]) -> str:
    return "".join(f"-{k}={_scalar(v)}" for k, v in sorted(options.items()))


def _scalar(value: Any) -> int | float | str | bool:
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)):
        return ",".join(str(_scalar(v)) for v in value)
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _copy(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value
