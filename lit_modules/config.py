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


@dataclass(frozen=True)
class ViTConfig:
    """One backbone. Fields mirror timm's ``VisionTransformer`` arguments; ``residual`` names a variant of
    ``lit_modules.RESIDUALS`` and ``residual_options`` its own options; ``attention`` / ``attention_options``,
    ``qk_norm``, ``attention_gate``, ``class_attention_blocks``, ``norm_layer`` / ``norm_eps`` / ``norm_options`` and
    ``value_residual`` are the backbone options orthogonal to it (see ``lit_modules.vit.VisionTransformer``);
    ``parametrization`` / ``parametrization_options`` say how scales and learning rates follow the model's size
    (``lit_modules.parametrization``).
    ``fused_attn=None`` keeps timm's default. ``qk_norm`` also takes timm's boolean (True: ``"layernorm"``)."""

    residual: str = "standard"
    residual_options: Mapping[str, Any] = field(default_factory=dict)
    img_size: int = 32
    patch_size: int = 4
    in_chans: int = 3
    num_classes: int = 10
    embed_dim: int = 192
    depth: int = 12
    num_heads: int = 3
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    qk_norm: str = "none"
    class_token: bool = True
    global_pool: str = "token"
    drop_rate: float = 0.0
    pos_drop_rate: float = 0.0
    proj_drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    norm_layer: str = "layernorm"
    norm_eps: float = 1e-6
    norm_options: Mapping[str, Any] = field(default_factory=dict)
    attention: str = "self"
    attention_options: Mapping[str, Any] = field(default_factory=dict)
    class_attention_blocks: int = 0
    value_residual: str = "none"
    attention_gate: str = "none"
    parametrization: str = "standard"
    parametrization_options: Mapping[str, Any] = field(default_factory=dict)
    fused_attn: bool | None = None

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
        skips the fields the dataset decides (``RunConfig`` checks its model fields before the dataset is known)."""
        sizes = ("depth", "embed_dim", "num_heads") + (("img_size", "patch_size", "in_chans") if geometry else ())
        for name in sizes:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if geometry and self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {self.num_classes}")
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


#: The backbone's field names, in declaration order.
FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ViTConfig))
#: The fields the dataset decides (:meth:`ablations.config.RunConfig.model_config` resolves them from it).
GEOMETRY: tuple[str, ...] = ("img_size", "in_chans", "num_classes", "patch_size")
GLOBAL_POOLS: tuple[str, ...] = ("token", "avg")
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

    optimizer: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_epochs: float = 2.0
    min_lr: float = 0.0
    label_smoothing: float = 0.1

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


OPTIM_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(OptimConfig))


def _copy(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value
