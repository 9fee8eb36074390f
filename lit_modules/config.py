"""The backbone's configuration and the optimiser's, declared once (nanoGPT's ``GPTConfig``); torch-free.

:class:`ViTConfig` is the only declaration of the backbone's fields and their defaults. ``VisionTransformer(cfg)``
builds it, ``ViTClassifier(cfg)`` trains it, ``ablations.costs.measure(cfg)`` counts it, and a run's ``RunConfig``
resolves it once against its dataset (:meth:`ablations.config.RunConfig.model_config`). Its defaults are timm's
ViT-Tiny (width 192, 12 blocks, 3 heads, MLP ratio 4) at CIFAR's geometry (32 px, patch 4, 3 channels, 10 classes);
:data:`PRESETS` names the other sizes, as timm's entry points do, including the 2-core study size the CLIs default to.

:class:`OptimConfig` is the same for the optimiser and its schedule; its defaults are the ``basic`` training
recipe's (:mod:`ablations.recipes` reads them from here), so the default learning rate is written once.

Validation of the backbone's geometry lives in :meth:`ViTConfig.check` (one-line ValueErrors); the registries'
names (residual, attention, norm layer, value residual) are checked by whoever builds the model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .names import (
    ATTENTION_GATE_NAMES,
    ATTENTION_NAMES,
    NORM_LAYER_NAMES,
    OPTIMIZER_NAMES,
    PARAMETRIZATION_NAMES,
    QK_NORM_NAMES,
    RESIDUAL_NAMES,
    VALUE_RESIDUAL_NAMES,
)

GLOBAL_POOLS: tuple[str, ...] = ("token", "avg")


def option(default: Any, help: str, choices: tuple[str, ...] = (), note: str = "") -> Any:
    """A field a run sets (an option of ``ablations.config.RunConfig`` and its command line): its default, the help
    line (``choices`` appended, then ``note``) and the names it takes (checked by the run's config)."""
    meta = {"help": help + (": " + ", ".join(choices) if choices else "") + note, "choices": choices}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ViTConfig:
    """One backbone. Fields mirror timm's ``VisionTransformer`` arguments; ``residual`` names a variant of
    ``lit_modules.RESIDUALS`` and ``residual_options`` its own options; ``attention`` / ``attention_options``,
    ``qk_norm``, ``attention_gate``, ``class_attention_blocks``, ``norm_layer`` / ``norm_eps`` / ``norm_options`` and
    ``value_residual`` are the backbone options orthogonal to it (see ``lit_modules.vit.VisionTransformer``);
    ``parametrization`` / ``parametrization_options`` say how scales and learning rates follow the model's size
    (``lit_modules.parametrization``).
    ``fused_attn=None`` keeps timm's default. ``qk_norm`` also takes timm's boolean (True: ``"layernorm"``)."""

    residual: str = option("standard", "residual variant", RESIDUAL_NAMES)
    residual_options: Mapping[str, Any] = option(
        {}, "the variant's own options, e.g. init_value=1e-5 (layerscale), form=rw (laurel)")
    img_size: int | None = 32  # the geometry (None: the dataset's, until resolved: ablations.config.RunConfig)
    patch_size: int | None = option(4, "patch side in pixels (None: the dataset's default)")
    in_chans: int | None = 3
    num_classes: int | None = 10
    embed_dim: int = option(192, "token width")
    depth: int = option(12, "number of transformer blocks")
    num_heads: int = option(3, "attention heads (must divide embed_dim)")
    mlp_ratio: float = option(4.0, "MLP hidden width / embed_dim")
    qkv_bias: bool = True
    qk_norm: str = option("none", "QK-norm of every self-attention", QK_NORM_NAMES,
                          " (rmsnorm: ViT-5's RMSNorm over each head, fp32; layernorm: timm's)")
    class_token: bool = True
    global_pool: str = option("token", "head pooling", GLOBAL_POOLS)
    drop_rate: float = 0.0
    pos_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = option(0.0, "stochastic depth rate of the last block (linear rule)")
    norm_layer: str = option("layernorm", "norm layer", NORM_LAYER_NAMES)
    norm_eps: float = option(1e-6, "epsilon of every norm layer (inside the square root)")
    norm_options: Mapping[str, Any] = option(
        {}, "the norm layer's own options, e.g. alpha_init=0.25 (dyt, derf), groups=4 (seednorm)")
    attention: str = option("self", "attention of the blocks", ATTENTION_NAMES)
    attention_options: Mapping[str, Any] = option(
        {}, "the attention's own options, e.g. head_norm=layer, theta_init=randn (re_attention)")
    class_attention_blocks: int = option(
        0, "CaiT class-attention blocks after the self-attention blocks (0: plain ViT)")
    value_residual: str = option("none", "ResFormer value residual (layers > 0 mix in layer 0's values)",
                                 VALUE_RESIDUAL_NAMES, " (fixed: V = (V_1 + V_n)/2)")
    attention_gate: str = option("none", "output gate of every self-attention (Gated Attention)", ATTENTION_GATE_NAMES,
                                 " (elementwise: one sigmoid gate per head channel; headwise: one per head)")
    parametrization: str = option("standard", "how init, multipliers and learning rates follow width and depth",
                                  PARAMETRIZATION_NAMES, " (completep: arXiv 2505.01618)")
    parametrization_options: Mapping[str, Any] = option(
        {}, "the parametrization's own options, e.g. init=megatron (standard: the output projections at std "
        "0.02/sqrt(2L)), base_depth=2, base_width=256 (completep)")
    fused_attn: bool | None = option(None, "fused SDPA attention (None: timm's default, fused; a run with precision "
                                           "auto takes the measured fastest kernel)")

    @classmethod
    def build(cls, base: ViTConfig | str | None = None, residual_options: Mapping[str, Any] | None = None,
              **fields: Any) -> ViTConfig:
        """The config of ``VisionTransformer(...)``'s arguments: ``base`` a config (``fields`` change it) or a
        residual name (the defaults, with ``residual_options`` and ``fields``). TypeError naming the valid fields
        for an unknown one."""
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise TypeError(f"unknown backbone argument {unknown[0]!r}; valid arguments: {', '.join(FIELDS)}")
        if isinstance(base, ViTConfig):
            if residual_options is not None:
                fields["residual_options"] = residual_options
            return base.replace(**fields)
        if base is not None:
            fields["residual"] = base
        if residual_options is not None:
            fields["residual_options"] = residual_options
        return cls(**fields)

    def __post_init__(self) -> None:
        for name in ("residual_options", "attention_options", "parametrization_options", "norm_options"):  # copied
            object.__setattr__(self, name, dict(getattr(self, name) or {}))
        if isinstance(self.qk_norm, bool):  # timm's boolean: False = none, True = its LayerNorm over each head
            object.__setattr__(self, "qk_norm", "layernorm" if self.qk_norm else "none")

    def replace(self, **changes: Any) -> ViTConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Every field as a plain value (options copied); ``ViTConfig(**d)`` inverts it."""
        return {f.name: _copy(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def size(self) -> dict[str, Any]:
        """The geometry and size fields (:data:`SIZE_FIELDS`), as keyword arguments timm's ``VisionTransformer``
        also takes: what the benchmarks time and the probes measure."""
        return {name: getattr(self, name) for name in SIZE_FIELDS}

    def check(self, geometry: bool = True) -> None:
        """One-line ValueErrors for impossible configurations, before any module is built. ``geometry=False``
        skips the fields the dataset decides (a run's model before its dataset is known: its ``patch_size`` may be
        None, the dataset's)."""
        self._check_sizes(geometry)
        if self.embed_dim % self.num_heads:
            small = [h for h in range(1, math.isqrt(self.embed_dim) + 1) if self.embed_dim % h == 0]
            valid = ", ".join(map(str, sorted({*small, *(self.embed_dim // h for h in small)})))
            raise ValueError(f"embed_dim={self.embed_dim} is not divisible by num_heads={self.num_heads}; "
                             f"valid num_heads: {valid}")
        if geometry and self.img_size % self.patch_size:
            raise ValueError(f"img_size={self.img_size} is not divisible by patch_size={self.patch_size}")
        if not self.mlp_ratio > 0:
            raise ValueError(f"mlp_ratio must be > 0, got {self.mlp_ratio:g}")
        if self.global_pool not in GLOBAL_POOLS:
            raise ValueError(f"unknown global_pool {self.global_pool!r}; valid choices: {', '.join(GLOBAL_POOLS)}")
        if self.global_pool == "token" and not self.class_token:
            raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without a class token")
        if not 0.0 <= self.drop_path_rate <= 1.0 or math.isnan(self.drop_path_rate):
            raise ValueError(f"drop_path_rate must be in [0, 1], got {self.drop_path_rate:g}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps:g}")
        blocks = self.class_attention_blocks
        if not isinstance(blocks, int) or isinstance(blocks, bool) or blocks < 0:
            raise ValueError(f"class_attention_blocks must be an integer >= 0, got {blocks!r}")
        if blocks and (not self.class_token or self.global_pool != "token"):
            raise ValueError("class_attention_blocks > 0 needs class_token=True and global_pool='token' "
                             "(the class-attention blocks update only the class token, which the head reads)")

    def _check_sizes(self, geometry: bool) -> None:
        sizes = ("depth", "embed_dim", "num_heads") + (("img_size", "patch_size", "in_chans") if geometry else ())
        if not geometry and self.patch_size is not None:
            sizes += ("patch_size",)
        for name in sizes:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if geometry and not (isinstance(self.num_classes, int) and self.num_classes >= 0):
            raise ValueError(f"num_classes must be >= 0, got {self.num_classes}")


#: The backbone's field names, in declaration order.
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ViTConfig))
#: The fields the dataset decides (:meth:`ablations.config.RunConfig.model_config` resolves them from it).
GEOMETRY: tuple[str, ...] = ("img_size", "in_chans", "num_classes", "patch_size")
#: The geometry and size fields (:meth:`ViTConfig.size`).
SIZE_FIELDS: tuple[str, ...] = (*GEOMETRY, "embed_dim", "depth", "num_heads", "mlp_ratio")

#: Named sizes (timm's ``vit_tiny_patch16_224`` etc. at this config's 32 px geometry), and ``study``: the 2-core
#: CPU size every study and CLI run defaults to (``RunConfig``'s model defaults are this preset's).
PRESETS: dict[str, ViTConfig] = {
    "vit_tiny": ViTConfig(embed_dim=192, depth=12, num_heads=3, mlp_ratio=4.0),
    "vit_small": ViTConfig(embed_dim=384, depth=12, num_heads=6, mlp_ratio=4.0),
    "vit_base": ViTConfig(embed_dim=768, depth=12, num_heads=12, mlp_ratio=4.0),
    "study": ViTConfig(embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0),
}


def preset(name: str, **changes: Any) -> ViTConfig:
    """The named size with ``changes``; ValueError naming the presets for an unknown name."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; valid choices: {', '.join(PRESETS)}")
    return PRESETS[name].replace(**changes)


@dataclass(frozen=True)
class OptimConfig:
    """The optimiser and its schedule (``ViTClassifier``): ``optimizer`` ``adamw`` (decoupled weight decay) or
    ``adam`` (L2 decay added to the gradient), the peak ``lr``, ``weight_decay`` (not on biases, norms, embeddings
    and the variants' scalars), Adam's ``betas``, a linear warm-up of ``warmup_epochs`` then cosine decay to
    ``min_lr``, and cross-entropy ``label_smoothing``. The defaults are the ``basic`` recipe's."""

    optimizer: str = option("adamw", "the optimiser", OPTIMIZER_NAMES,
                            " (adamw: decoupled weight decay; adam: L2 weight decay added to the gradient)")
    lr: float = option(1e-3, "peak learning rate")
    weight_decay: float = option(0.05, "weight decay (not on biases, norms, embeddings, scalars)")
    betas: tuple[float, float] = option((0.9, 0.999), "Adam(W) betas (two floats)")
    warmup_epochs: float = option(2.0, "linear warmup length in epochs (fractions allowed)")
    min_lr: float = option(0.0, "learning rate at the end of the cosine decay")
    label_smoothing: float = option(0.1, "cross-entropy label smoothing")

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def check(self) -> None:
        """One-line ValueErrors for an optimiser that cannot train: an unknown one, a rate that is not positive or
        not finite, a floor above the peak, negative decay or warm-up, smoothing or betas outside [0, 1)."""
        if self.optimizer not in OPTIMIZER_NAMES:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; valid choices: {', '.join(OPTIMIZER_NAMES)}")
        in_range("lr", self.lr, 0.0, math.inf, low_open=True)
        in_range("weight_decay", self.weight_decay, 0.0, math.inf)
        in_range("warmup_epochs", self.warmup_epochs, 0.0, math.inf)
        in_range("min_lr", self.min_lr, 0.0, self.lr)
        in_range("label_smoothing", self.label_smoothing, 0.0, 1.0, high_open=True)
        if len(self.betas) != 2:
            raise ValueError(f"betas must be two floats, got {list(self.betas)}")
        for b in self.betas:
            in_range("betas", b, 0.0, 1.0, high_open=True)


def positive(name: str, value: int) -> None:
    """A one-line ValueError unless ``value`` is above 0."""
    if not value > 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")


def in_range(name: str, value: float, low: float, high: float, low_open: bool = False,
             high_open: bool = False) -> None:
    """A one-line ValueError unless ``value`` lies between ``low`` and ``high`` (open ends excluded; NaN never)."""
    ok = not math.isnan(value) and (value > low if low_open else value >= low) and (
        value < high if high_open else value <= high)
    if not ok and high == math.inf:
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low:g}, got {value:g}")
    if not ok:
        lo, hi = "(" if low_open else "[", ")" if high_open else "]"
        raise ValueError(f"{name} must be in {lo}{low:g}, {high:g}{hi}, got {value:g}")


OPTIM_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(OptimConfig))


def _copy(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value
