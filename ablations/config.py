"""``RunConfig``: the single source of truth for one training run (model, data, optimiser, trainer).

Torch-free on purpose (the CLI's ``--help`` must not pay the ~4 s torch/lightning import): names are checked
against the torch-free name tables below (the registries' own names, read from ``lit_modules.names``,
``lit_modules.config`` and ``data.names``; a test keeps them equal to the real registries). Options that
need the model to check (a residual variant's own options, dataset folder contents) are checked when the run is
built and raise ValueError there.

Every field carries ``metadata={"group", "help", "kind"}``; the CLI builds its options from it, so a field added
here is a CLI option without further edits. ``kind`` is one of ``int``, ``float``, ``str``, ``bool``,
``optional_int``, ``optional_str``, ``optional_bool``, ``floats`` (a tuple of floats), ``options`` (a dict set by a
repeatable ``KEY=VALUE`` option) and ``devices`` (an int or ``auto``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from ablations.recipes import RECIPE_FIELDS, RECIPE_HELP, RECIPE_NAMES, recipe_values
from data.names import DATASET_NAMES
from lit_modules.config import FIELDS as MODEL_FIELDS
from lit_modules.config import GEOMETRY, GLOBAL_POOLS, OPTIM_FIELDS, PRESETS, OptimConfig, ViTConfig
from lit_modules.names import (
    ATTENTION_GATE_NAMES,
    ATTENTION_NAMES,
    NORM_LAYER_NAMES,
    PARAMETRIZATION_NAMES,
    QK_NORM_NAMES,
    RESIDUAL_NAMES,
    STREAM_KERNEL_NAMES,
    VALUE_RESIDUAL_NAMES,
)
from lit_modules.names import OPTIMIZER_NAMES as OPTIMIZERS

# --- the names a run's options take (torch-free: the backbone's and the datasets' are their registries' own, read
# from ``lit_modules.names``, ``lit_modules.config`` and ``data.names``) -----------------------------------------
#: The option of each variant that ``--init-value`` sets (its "init knob"); variants not listed have none.
INIT_VALUE_OPTIONS: dict[str, str] = {
    "layerscale": "init_value",  # float, 'auto' (CaiT's depth rule) or None (no LayerScale: standard)
    "rezero": "init_value",
    "skipinit": "init_value",
    "highway": "gate_bias",
}

#: Lightning precision strings accepted by ``RunConfig.precision``, and ``auto`` (:mod:`ablations.machine.modes`).
PRECISIONS: tuple[str, ...] = ("auto", "32-true", "64-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true")

#: Padding of the random crop (``RunConfig.crop_padding_mode``): zeros, or the image mirrored at its border.
PADDING_MODES: tuple[str, ...] = ("constant", "reflect")

ACCELERATORS: tuple[str, ...] = ("auto", "cpu", "gpu", "cuda")

GROUPS = ("model", "data", "optim", "trainer")
#: The model group's defaults: the backbone's ``study`` preset (``lit_modules.config``, the fields' one declaration).
STUDY = PRESETS["study"]
#: Default of a field that the run's recipe sets (:mod:`ablations.recipes`) unless it is given.
FROM_RECIPE = object()


def _f(default: Any, group: str, kind: str, help: str, **kw: Any) -> Any:
    meta = {"group": group, "kind": kind, "help": help}
    if default is FROM_RECIPE:  # None until __post_init__ fills it from the run's recipe
        meta["recipe"], default = True, None
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta, **kw)
    return field(default=default, metadata=meta, **kw)


@dataclass(frozen=True)
class RunConfig:
    """One run. Immutable; ``replace(**changes)`` returns a validated copy. Invalid values raise ValueError
    with a one-line message (``unknown residual 'foo'; valid choices: ...``)."""

    # --- model -------------------------------------------------------------------------------------------------
    residual: str = _f(STUDY.residual, "model", "str", "residual variant: " + ", ".join(RESIDUAL_NAMES))
    residual_options: dict[str, Any] = _f(
        {}, "model", "options", "the variant's own options, e.g. init_value=1e-5 (layerscale), form=rw (laurel)")
    depth: int = _f(STUDY.depth, "model", "int", "number of transformer blocks")
    embed_dim: int = _f(STUDY.embed_dim, "model", "int", "token width")
    num_heads: int = _f(STUDY.num_heads, "model", "int", "attention heads (must divide embed_dim)")
    mlp_ratio: float = _f(STUDY.mlp_ratio, "model", "float", "MLP hidden width / embed_dim")
    patch_size: int | None = _f(None, "model", "optional_int", "patch side in pixels (None: the dataset's default)")
    drop_path_rate: float = _f(STUDY.drop_path_rate, "model", "float", "stochastic depth rate of the last block (linear rule)")
    global_pool: str = _f(STUDY.global_pool, "model", "str", "head pooling: " + ", ".join(GLOBAL_POOLS))
    fused_attn: bool | None = _f(STUDY.fused_attn, "model", "optional_bool",
                                 "fused SDPA attention (None: with precision auto, the measured fastest kernel; "
                                 "otherwise timm's default, fused)")
    attention: str = _f(STUDY.attention, "model", "str", "attention of the blocks: " + ", ".join(ATTENTION_NAMES))
    attention_options: dict[str, Any] = _f(
        {}, "model", "options", "the attention's own options, e.g. head_norm=layer, theta_init=randn (re_attention)")
    qk_norm: str = _f(STUDY.qk_norm, "model", "str",
                      "QK-norm of every self-attention: " + ", ".join(QK_NORM_NAMES)
                      + " (rmsnorm: ViT-5's RMSNorm over each head, fp32; layernorm: timm's)")
    attention_gate: str = _f(STUDY.attention_gate, "model", "str",
                             "output gate of every self-attention (Gated Attention): " + ", ".join(ATTENTION_GATE_NAMES)
                             + " (elementwise: one sigmoid gate per head channel; headwise: one per head)")
    parametrization: str = _f(STUDY.parametrization, "model", "str",
                              "how init, multipliers and learning rates follow width and depth: "
                              + ", ".join(PARAMETRIZATION_NAMES) + " (completep: arXiv 2505.01618)")
    parametrization_options: dict[str, Any] = _f(
        {}, "model", "options", "the parametrization's own options, e.g. init=megatron (standard: the output "
        "projections at std 0.02/sqrt(2L)), base_depth=2, base_width=256 (completep)")
    class_attention_blocks: int = _f(STUDY.class_attention_blocks, "model", "int",
                                     "CaiT class-attention blocks after the self-attention blocks (0: plain ViT)")
    norm_layer: str = _f(STUDY.norm_layer, "model", "str", "norm layer: " + ", ".join(NORM_LAYER_NAMES))
    norm_eps: float = _f(STUDY.norm_eps, "model", "float", "epsilon of every norm layer (inside the square root)")
    norm_options: dict[str, Any] = _f(
        {}, "model", "options", "the norm layer's own options, e.g. alpha_init=0.25 (dyt, derf), groups=4 (seednorm)")
    value_residual: str = _f(STUDY.value_residual, "model", "str",
                             "ResFormer value residual (layers > 0 mix in layer 0's values): "
                             + ", ".join(VALUE_RESIDUAL_NAMES) + " (fixed: V = (V_1 + V_n)/2)")
    # --- data --------------------------------------------------------------------------------------------------
    dataset: str = _f("digits", "data", "str", "dataset: " + ", ".join(DATASET_NAMES))
    data_dir: str | None = _f(None, "data", "optional_str",
                              "data folder (needed by mnist, cifar10/100, svhn, imagefolder; fashion_mnist looks "
                              "here first, then in Debian's dataset-fashion-mnist folder)")
    batch_size: int = _f(128, "data", "int", "batch size per device")
    val_fraction: float = _f(0.2, "data", "float",
                             "val share of a pool (or of an official train split), drawn with the run's seed")
    test_fraction: float = _f(0.2, "data", "float",
                              "held-out test share of a pool, the same images for every seed (datasets with an "
                              "official test split use it); 0: no test split, val as before the test split")
    augment: bool = _f(True, "data", "bool",
                       "training augmentation: the dataset's own crop/flip plus the recipe's (off: none, no Mixup)")
    recipe: str = _f("basic", "data", "str", "training recipe, the default of every field marked 'recipe': "
                     + "; ".join(f"{k}: {v}" for k, v in RECIPE_HELP.items()))
    crop_padding_mode: str = _f(FROM_RECIPE, "data", "str",
                                "recipe: padding of the random crop: " + ", ".join(PADDING_MODES))
    rand_augment_ops: int = _f(FROM_RECIPE, "data", "int", "recipe: RandAugment ops per image (0: off)")
    rand_augment_magnitude: int = _f(FROM_RECIPE, "data", "int", "recipe: RandAugment magnitude (of 31 bins)")
    color_jitter: tuple[float, ...] = _f(FROM_RECIPE, "data", "floats",
                                         "recipe: colour jitter brightness contrast saturation hue (0: off; "
                                         "one value v: v v v 0)")
    random_erasing: float = _f(FROM_RECIPE, "data", "float", "recipe: random-erasing probability per image")
    mixup_alpha: float = _f(FROM_RECIPE, "data", "float", "recipe: Mixup Beta(alpha, alpha) (0: off)")
    cutmix_alpha: float = _f(FROM_RECIPE, "data", "float", "recipe: CutMix Beta(alpha, alpha) (0: off)")
    mixup_prob: float = _f(FROM_RECIPE, "data", "float", "recipe: probability of mixing a batch at all")
    mixup_switch_prob: float = _f(FROM_RECIPE, "data", "float",
                                  "recipe: probability of CutMix instead of Mixup when both are on")
    dataset_options: dict[str, Any] = _f(
        {}, "data", "options", "extra dataset arguments, e.g. num_samples=512 (synthetic)")
    num_workers: int = _f(0, "data", "int", "DataLoader workers (in-memory datasets ignore it)")
    # --- optimiser -------------------------------------------------------------------------------------------
    optimizer: str = _f(FROM_RECIPE, "optim", "str", "recipe: " + ", ".join(OPTIMIZERS)
                        + " (adamw: decoupled weight decay; adam: L2 weight decay added to the gradient)")
    lr: float = _f(FROM_RECIPE, "optim", "float", "recipe: peak learning rate")
    weight_decay: float = _f(FROM_RECIPE, "optim", "float",
                             "recipe: weight decay (not on biases, norms, embeddings, scalars)")
    warmup_epochs: float = _f(FROM_RECIPE, "optim", "float", "recipe: linear warmup length in epochs (fractions allowed)")
    min_lr: float = _f(FROM_RECIPE, "optim", "float", "recipe: learning rate at the end of the cosine decay")
    label_smoothing: float = _f(FROM_RECIPE, "optim", "float", "recipe: cross-entropy label smoothing")
    betas: tuple[float, ...] = _f(FROM_RECIPE, "optim", "floats", "recipe: Adam(W) betas (two floats)")
    # --- trainer ---------------------------------------------------------------------------------------------
    max_epochs: int = _f(30, "trainer", "int", "training epochs")
    seed: int = _f(0, "trainer", "int", "seed of the model init, the data split, shuffling and augmentation")
    threads: int | None = _f(None, "trainer", "optional_int", "torch.set_num_threads (None: all cores)")
    precision: str = _f("auto", "trainer", "str",
                        "Lightning precision: " + ", ".join(PRECISIONS) + " (auto: the fastest measured for the "
                        "device, together with the attention kernel unless fused_attn is given)")
    accuracy_thresholds: tuple[float, ...] = _f(
        (0.5, 0.8, 0.9, 0.95), "trainer", "floats", "absolute val accuracies for epochs_to_acc_<t>")
    diagnostics_every: int = _f(0, "trainer", "int", "residual diagnostics every N epochs (0: off)")
    diagnostics_batch_size: int = _f(64, "trainer", "int", "images in the fixed diagnostics batch")
    diagnostics_sim_k: int = _f(3, "trainer", "int",
                                "DeepViT similarity against the K following blocks (the paper's K was not retrieved)")
    accelerator: str = _f("auto", "trainer", "str", "auto (cuda if available, else cpu), cpu, gpu")
    devices: int | str = _f(1, "trainer", "devices", "devices per node (an int or auto)")
    strategy: str = _f("auto", "trainer", "str", "Lightning strategy (auto, ddp, ddp_spawn, ...)")
    compile: bool = _f(False, "trainer", "bool", "compile the backbone in place (model.compile(); slow start on CPU)")
    stream_kernels: str = _f("auto", "trainer", "str",
                             "Hyper-Connections' and mHC's per-token passes: " + ", ".join(STREAM_KERNEL_NAMES)
                             + " (auto: compiled on a CPU where torch.compile builds kernels, eager on a GPU or"
                             " with --compile; the same function)")

    # --- validation --------------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise through object.__setattr__
        _choice("recipe", self.recipe, RECIPE_NAMES)
        for name, value in recipe_values(self.recipe).items():  # fields not given take the recipe's value
            if getattr(self, name) is None:
                set_(self, name, value)
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), f.metadata["kind"]
            set_(self, f.name, coerce_field(f.name, kind, value))
        self._validate()

    def _validate(self) -> None:
        _choice("residual", self.residual, RESIDUAL_NAMES)
        _choice("attention", self.attention, ATTENTION_NAMES)
        _choice("norm_layer", self.norm_layer, NORM_LAYER_NAMES)
        _choice("value_residual", self.value_residual, VALUE_RESIDUAL_NAMES)
        _choice("qk_norm", self.qk_norm, QK_NORM_NAMES)
        _choice("attention_gate", self.attention_gate, ATTENTION_GATE_NAMES)
        _choice("parametrization", self.parametrization, PARAMETRIZATION_NAMES)
        _choice("dataset", self.dataset, DATASET_NAMES)
        _choice("precision", self.precision, PRECISIONS)
        _choice("stream_kernels", self.stream_kernels, STREAM_KERNEL_NAMES)
        _choice("accelerator", self.accelerator, ACCELERATORS)
        _choice("crop_padding_mode", self.crop_padding_mode, PADDING_MODES)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        # the backbone's own checks (lit_modules.config: one place), without the geometry the dataset decides
        ViTConfig(**self._model_fields()).check(geometry=False)
        if len(self.color_jitter) == 1:
            object.__setattr__(self, "color_jitter", (*self.color_jitter * 3, 0.0))
        if len(self.color_jitter) not in (0, 4) or any(c < 0 for c in self.color_jitter):
            raise ValueError(f"color_jitter must be empty, one or four non-negative numbers, got {list(self.color_jitter)}")
        if self.color_jitter and self.color_jitter[3] > 0.5:
            raise ValueError(f"color_jitter's hue must be in [0, 0.5], got {self.color_jitter[3]:g}")
        if not any(self.color_jitter):
            object.__setattr__(self, "color_jitter", ())
        for name in ("rand_augment_ops", "rand_augment_magnitude"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.rand_augment_magnitude > 30:
            raise ValueError(f"rand_augment_magnitude must be in [0, 30] (31 bins), got {self.rand_augment_magnitude}")
        for name in ("random_erasing", "mixup_prob", "mixup_switch_prob"):
            _in_range(name, getattr(self, name), 0.0, 1.0)
        for name in ("mixup_alpha", "cutmix_alpha"):
            _in_range(name, getattr(self, name), 0.0, math.inf)
        for name in ("batch_size", "max_epochs", "diagnostics_batch_size", "diagnostics_sim_k"):
            _positive(name, getattr(self, name))
        for name in ("seed", "diagnostics_every", "num_workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("patch_size", "threads"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        _in_range("val_fraction", self.val_fraction, 0.0, 1.0, low_open=True, high_open=True)
        _in_range("test_fraction", self.test_fraction, 0.0, 1.0, high_open=True)
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError(f"val_fraction + test_fraction must be below 1, got {self.val_fraction:g} + "
                             f"{self.test_fraction:g}")
        _in_range("lr", self.lr, 0.0, math.inf, low_open=True)
        _in_range("weight_decay", self.weight_decay, 0.0, math.inf)
        _in_range("warmup_epochs", self.warmup_epochs, 0.0, math.inf)
        _in_range("min_lr", self.min_lr, 0.0, self.lr)
        _in_range("label_smoothing", self.label_smoothing, 0.0, 1.0, high_open=True)
        if len(self.betas) != 2:
            raise ValueError(f"betas must be two floats, got {list(self.betas)}")
        for b in self.betas:
            _in_range("betas", b, 0.0, 1.0, high_open=True)
        if not self.accuracy_thresholds:
            raise ValueError("accuracy_thresholds must not be empty")
        for t in self.accuracy_thresholds:
            _in_range("accuracy_thresholds", t, 0.0, 1.0, low_open=True)
        if self.devices != "auto":
            _positive("devices", self.devices)
        if not self.strategy:
            raise ValueError("strategy must be a non-empty string")
        for name in option_fields():
            for key in getattr(self, name):
                if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                    raise ValueError(f"{name} key {key!r} is not a valid option name")

    # --- conversions -------------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        """Build from a plain dict (e.g. a YAML study entry or ``to_dict()``); unknown keys raise ValueError."""
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"unknown config key {unknown[0]!r}; valid keys: {', '.join(names)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain Python values (dicts copied, tuples kept); ``from_dict`` inverts it."""
        return {f.name: _copy(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def replace(self, **changes: Any) -> RunConfig:
        """A validated copy with some fields changed. A new ``recipe`` also resets the recipe's fields that are
        not among ``changes`` to the new recipe's values."""
        if "recipe" in changes:
            changes = {name: None for name in RECIPE_FIELDS} | changes
        return dataclasses.replace(self, **changes)

    def recipe_values(self) -> dict[str, Any]:
        """This run's values of the recipe fields (:data:`ablations.recipes.RECIPE_FIELDS`)."""
        return {name: getattr(self, name) for name in RECIPE_FIELDS}

    def model_config(self, shape: dict[str, Any]) -> ViTConfig:
        """The backbone this run trains, its geometry resolved from the dataset's ``shape`` (``img_size``,
        ``in_chans``, ``num_classes`` and the default ``patch_size``: ``data.dataset_shape`` or a DataModule's
        attributes); the run's ``patch_size`` wins over the dataset's. Every consumer (training, FLOP counts, the
        report's costs) builds the model from this one object."""
        fields = self._model_fields()
        geometry = {name: shape[name] for name in GEOMETRY}
        geometry["patch_size"] = self.patch_size or shape["patch_size"]
        return ViTConfig(**(fields | geometry))

    def _model_fields(self) -> dict[str, Any]:
        """This run's values of the backbone's fields that RunConfig has (the others keep ViTConfig's defaults)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in MODEL_FIELDS}

    def optim_config(self) -> OptimConfig:
        """This run's optimiser and schedule (the optimiser group, recipe values resolved)."""
        return OptimConfig(**{name: getattr(self, name) for name in OPTIM_FIELDS})

    @property
    def mixes(self) -> bool:
        """Whether training batches are mixed (Mixup or CutMix on, and augmentation on)."""
        return self.augment and self.mixup_prob > 0 and (self.mixup_alpha > 0 or self.cutmix_alpha > 0)

    def to_hparams(self) -> dict[str, int | float | str | bool]:
        """Flat scalars for Lightning/TensorBoard HParams: options flattened as ``residual.<key>``,
        ``attention.<key>`` and ``dataset.<key>``, tuples/lists as comma-joined strings, None as the string
        ``'None'``."""
        flat: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata["kind"] == "options":
                prefix = f.name[: -len("_options")]
                flat.update({f"{prefix}.{k}": _scalar(v) for k, v in sorted(value.items())})
            else:
                flat[f.name] = _scalar(value)
        return flat

    def run_name(self) -> str:
        """A short file-name-safe description, e.g. ``layerscale-init_value=auto_d8_w64_digits_s0``; a
        non-default attention, class-attention head, norm layer or value residual is appended to the residual's
        part (``standard+re_attention-head_norm=layer+ca2+rmsnorm+vr_fixed_d8_...``)."""
        opts = "".join(f"-{k}={_scalar(v)}" for k, v in sorted(self.residual_options.items()))
        if self.attention != RunConfig.attention or self.attention_options:
            opts += f"+{self.attention}" + "".join(f"-{k}={_scalar(v)}" for k, v in sorted(self.attention_options.items()))
        if self.class_attention_blocks:
            opts += f"+ca{self.class_attention_blocks}"
        if self.norm_layer != RunConfig.norm_layer or self.norm_options:
            opts += f"+{self.norm_layer}" + "".join(f"-{k}={_scalar(v)}" for k, v in sorted(self.norm_options.items()))
        if self.value_residual != RunConfig.value_residual:
            opts += f"+vr_{self.value_residual}"
        if self.qk_norm != RunConfig.qk_norm:
            opts += f"+qk_{self.qk_norm}"
        if self.attention_gate != RunConfig.attention_gate:
            opts += f"+gate_{self.attention_gate}"
        if self.parametrization != RunConfig.parametrization or self.parametrization_options:
            opts += f"+{self.parametrization}" + "".join(
                f"-{k}={_scalar(v)}" for k, v in sorted(self.parametrization_options.items()))
        name = f"{self.residual}{opts}_d{self.depth}_w{self.embed_dim}_{self.dataset}_s{self.seed}"
        return re.sub(r"[^A-Za-z0-9._=+-]", "", name.replace(" ", ""))

    def __hash__(self) -> int:  # dict fields: hash the canonical repr instead
        return hash(repr(sorted(self.to_hparams().items())))


# --- helpers -----------------------------------------------------------------------------------------------------
def config_fields() -> list[dataclasses.Field]:
    """RunConfig's fields in declaration order (grouped model, data, optim, trainer)."""
    return list(dataclasses.fields(RunConfig))


def option_fields() -> tuple[str, ...]:
    """Names of the fields that hold a dict of options (``residual_options``, ``attention_options``, ...)."""
    return tuple(f.name for f in dataclasses.fields(RunConfig) if f.metadata["kind"] == "options")


def _scalar(value: Any) -> int | float | str | bool:
    if value is None:
        return "None"
    if isinstance(value, (tuple, list)):
        return ",".join(str(_scalar(v)) for v in value)
    if isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _copy(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else value


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def coerce_field(name: str, kind: str, value: Any) -> Any:
    """Type-check one field and normalise it (int -> float for float fields, lists -> tuples, dict copies)."""
    bad = ValueError(f"{name} must be {_KIND_TEXT[kind]}, got {value!r}")
    if kind == "int" and not _is_int(value):
        raise bad
    if kind == "optional_int" and value is not None and not _is_int(value):
        raise bad
    if kind == "float":
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise bad from None
        if not _is_number(value):
            raise bad
        value = float(value)
    if kind in ("str",) and not isinstance(value, str):
        raise bad
    if kind == "optional_str" and value is not None and not isinstance(value, str):
        raise bad
    if kind == "bool" and not isinstance(value, bool):
        raise bad
    if kind == "optional_bool" and value is not None and not isinstance(value, bool):
        raise bad
    if kind == "floats":
        if not isinstance(value, (tuple, list)) or not all(_is_number(v) for v in value):
            raise bad
        value = tuple(float(v) for v in value)
    if kind == "options":
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise bad
        value = dict(value)
    if kind == "devices" and value != "auto" and not _is_int(value):
        raise bad
    return value


_KIND_TEXT = {
    "int": "an integer", "optional_int": "an integer or None", "float": "a number", "str": "a string",
    "optional_str": "a string or None", "bool": "true or false", "optional_bool": "true, false or None",
    "floats": "a list of numbers", "options": "a mapping of option names to values", "devices": "an integer or 'auto'",
}


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(choices)}")


def _positive(name: str, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")


def _in_range(name: str, value: float, low: float, high: float, low_open: bool = False,
              high_open: bool = False) -> None:
    ok = not math.isnan(value) and (value > low if low_open else value >= low) and (
        value < high if high_open else value <= high)
    if not ok and high == math.inf:
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value:g}")
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise ValueError(f"{name} must be in {lo}{low:g}, {high:g}{hi}, got {value:g}")
