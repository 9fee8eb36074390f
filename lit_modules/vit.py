"""One ViT backbone whose residual connection is chosen by name.

Built from timm's layers (PatchEmbed, Attention, Mlp, DropPath, LayerNorm, trunc_normal_, init_weights_vit_timm)
and using timm's parameter names, so a ``timm.models.vision_transformer.VisionTransformer`` of the same config
loads into the ``standard`` (and, with ``init_values``, the ``layerscale``) variant with ``strict=True`` and gives
the same logits. The residual variant lives in ``lit_modules.residual``; the backbone only asks it to build
blocks and the stream that chains them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from timm.layers import Attention, DropPath, LayerNorm, Mlp, PatchEmbed, calculate_drop_path_rates, trunc_normal_
from timm.layers.pool1d import global_pool_nlc
from timm.models._manipulate import named_apply
from timm.models.vision_transformer import init_weights_vit_timm
from timm.optim import param_groups_weight_decay
from torch import nn

from .residual import RESIDUALS, BlockArgs


class Block(nn.Module):
    """Pre-norm transformer block with two residual sites, ``ls1`` (attention) and ``ls2`` (MLP).

    The sites sit where timm's ``LayerScale`` sits, so the standard and LayerScale variants keep timm's names.
    """

    def __init__(self, args: BlockArgs, sites: tuple[nn.Module, nn.Module]) -> None:
        super().__init__()
        self.ls1, self.ls2 = sites
        _add_sublayers(self, args, pre_norm=self.ls1.pre_norm)
        self.drop_path1 = DropPath(args.drop_path) if args.drop_path > 0.0 else nn.Identity()
        self.drop_path2 = DropPath(args.drop_path) if args.drop_path > 0.0 else nn.Identity()

    def sites(self) -> dict[str, nn.Module]:
        """Residual sites by sublayer; a forward hook on one sees inputs (x, u, f, history) and output Δ."""
        return {"attn": self.ls1, "mlp": self.ls2}

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        u = self.norm1(x)
        x = x + self.drop_path1(self.ls1(x, u, self.attn(u), history))
        u = self.norm2(x)
        x = x + self.drop_path2(self.ls2(x, u, self.mlp(u), history))
        return x


class WholeBlock(nn.Module):
    """A block with one residual site around the whole pre-norm block (LAuReL at block granularity).

    ``f(x) = Block(x) − x = A(LN₁x) + M(LN₂(x + A(LN₁x)))``; the site turns f into the update Δ.
    """

    def __init__(self, args: BlockArgs, site: nn.Module) -> None:
        super().__init__()
        self.res = site
        _add_sublayers(self, args, pre_norm=site.pre_norm)
        self.drop_path = DropPath(args.drop_path) if args.drop_path > 0.0 else nn.Identity()

    def sites(self) -> dict[str, nn.Module]:
        return {"block": self.res}

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        a = self.attn(self.norm1(x))
        f = a + self.mlp(self.norm2(x + a))
        return x + self.drop_path(self.res(x, x, f, history))


def _add_sublayers(block: nn.Module, args: BlockArgs, pre_norm: bool) -> None:
    """The two timm sublayers of a pre-norm block, under timm's names (norm1, attn, norm2, mlp)."""
    dim = args.dim
    block.norm1 = args.norm_layer(dim) if pre_norm else nn.Identity()
    block.attn = Attention(dim, num_heads=args.num_heads, qkv_bias=args.qkv_bias, qk_norm=args.qk_norm,
                           attn_drop=args.attn_drop, proj_drop=args.proj_drop, norm_layer=args.norm_layer)
    block.norm2 = args.norm_layer(dim) if pre_norm else nn.Identity()
    block.mlp = Mlp(in_features=dim, hidden_features=int(dim * args.mlp_ratio), act_layer=args.act_layer,
                    drop=args.proj_drop)


class ResidualStream(nn.Module):
    """The usual residual stream: blocks applied in sequence.

    ``keep_history`` gives the blocks a fresh list per forward in which sites that use previous activations
    (LAuReL-PA) record the stream states they see; other variants pay nothing for it.
    """

    def __init__(self, keep_history: bool = False) -> None:
        super().__init__()
        self.keep_history = keep_history

    def forward(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        history = [] if self.keep_history else None
        for blk in blocks:
            x = blk(x, history)
        return x


@dataclass
class LoadReport:
    """What ``VisionTransformer.load_pretrained`` did: keys it filled from the checkpoint, keys left at init."""

    loaded: list[str]
    new: list[str]
    derived: dict[str, str] = field(default_factory=dict)  # our key -> checkpoint key it was copied from

    def __str__(self) -> str:
        return (f"loaded {len(self.loaded)} tensors; {len(self.new)} new (left at init): "
                f"{', '.join(self.new) or 'none'}; {len(self.derived)} copied from an existing key")


class VisionTransformer(nn.Module):
    """Vision Transformer (Dosovitskiy et al., arXiv 2010.11929) with a swappable residual connection.

    Args mirror timm's ``VisionTransformer``; ``residual`` names a variant of ``lit_modules.RESIDUALS`` and
    ``residual_options`` its own typed options (e.g. ``{"init_value": "auto"}`` for LayerScale).
    """

    def __init__(
        self,
        residual: str = "standard",
        residual_options: Mapping[str, Any] | None = None,
        *,
        img_size: int = 32,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 10,
        embed_dim: int = 192,
        depth: int = 12,
        num_heads: int = 3,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        class_token: bool = True,
        global_pool: str = "token",
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        norm_eps: float = 1e-6,
        fused_attn: bool | None = None,
    ) -> None:
        super().__init__()
        variant = _lookup_residual(residual)
        _check_config(img_size=img_size, patch_size=patch_size, embed_dim=embed_dim, depth=depth,
                      num_heads=num_heads, global_pool=global_pool, class_token=class_token,
                      drop_path_rate=drop_path_rate, in_chans=in_chans, num_classes=num_classes)
        options = variant.validate_options(dict(residual_options or {}))
        variant.check_options(options, dim=embed_dim, depth=depth)
        self.residual = residual
        self.residual_options = options
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_prefix_tokens = 1 if class_token else 0
        self.embed_dim = self.num_features = embed_dim
        norm_layer = partial(LayerNorm, eps=norm_eps)

        self.patch_embed = PatchEmbed(img_size=img_size, patch_size=patch_size, in_chans=in_chans,
                                      embed_dim=embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + self.num_prefix_tokens,
                                                  embed_dim))
        self.pos_drop = nn.Dropout(p=pos_drop_rate)

        dpr = calculate_drop_path_rates(drop_path_rate, depth)  # timm's linear stochastic-depth rule
        block_args = [
            BlockArgs(dim=embed_dim, num_heads=num_heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_norm=qk_norm,
                      proj_drop=proj_drop_rate, attn_drop=attn_drop_rate, drop_path=dpr[i], norm_layer=norm_layer,
                      act_layer=nn.GELU, layer=i, depth=depth, num_prefix_tokens=self.num_prefix_tokens)
            for i in range(depth)
        ]
        self.blocks = nn.ModuleList(variant.build_block(a, **options) for a in block_args)
        self.stream = variant.build_stream(embed_dim, depth, norm_layer, **options)
        use_fc_norm = global_pool == "avg"  # timm: average pooling normalises after pooling
        self.norm = norm_layer(embed_dim) if not use_fc_norm else nn.Identity()
        self.fc_norm = norm_layer(embed_dim) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()

        self.init_weights()
        if fused_attn is not None:
            self.set_fused_attn(fused_attn)

    # --- init, optimisation ------------------------------------------------------------------------------------
    def init_weights(self) -> None:
        """timm's default ViT init; each residual site then initialises its own parameters."""
        trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        named_apply(init_weights_vit_timm, self)

    def no_weight_decay(self) -> set[str]:
        """Full names of parameters excluded from weight decay: embeddings plus every variant's own scalars,
        per-channel scales, gate biases and DCA's b (2-D, so timm's ndim rule alone would decay it)."""
        names = {"pos_embed", "cls_token"}
        for prefix, module in self.named_modules():
            if module is not self and hasattr(module, "no_weight_decay"):
                names |= {f"{prefix}.{n}" for n in module.no_weight_decay()}
        return names

    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW parameter groups (timm's rule: 1-D tensors and biases undecayed) plus ``no_weight_decay()``."""
        return param_groups_weight_decay(self, weight_decay, no_weight_decay_list=self.no_weight_decay())

    def residual_sites(self) -> list[tuple[int, str, nn.Module]]:
        """(layer, sublayer, module) for every residual site, in forward order. For Block/WholeBlock sites a
        forward hook sees inputs ``(x, u, f, history)`` and returns the update Δ; for DCA blocks the module is
        the block itself, whose hook sees ``(stack,)`` (B, N, t, D) and returns the block output f_t."""
        return [(i, name, site) for i, blk in enumerate(self.blocks) for name, site in blk.sites().items()]

    def set_fused_attn(self, enabled: bool) -> None:
        """Fused SDPA (fast, training) or the explicit-softmax path (returns attention maps to hooks)."""
        for m in self.modules():
            if isinstance(m, Attention):
                m.fused_attn = enabled

    # --- forward -------------------------------------------------------------------------------------------------
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.pos_drop(x + self.pos_embed)
        x = self.stream(x, self.blocks)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = global_pool_nlc(x, pool_type=self.global_pool, num_prefix_tokens=self.num_prefix_tokens)
        x = self.head_drop(self.fc_norm(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    # --- retrofitting a pretrained (timm) checkpoint ---------------------------------------------------------------
    def load_pretrained(self, checkpoint: Mapping[str, torch.Tensor] | str | Path) -> LoadReport:
        """Load a timm ViT state dict (or a local file holding one) of the same config.

        Every key of the checkpoint must exist here (otherwise ValueError naming the keys); parameters the
        variant adds are either copied from the key they extend (DCA's per-input norms from ``norm1``) or left
        at their init. Returns which keys were new.
        """
        state = _read_checkpoint(checkpoint)
        own = self.state_dict()
        unexpected = sorted(set(state) - set(own))
        if unexpected:
            raise ValueError(f"checkpoint keys not in residual '{self.residual}' model: {', '.join(unexpected[:8])}"
                             + (" ..." if len(unexpected) > 8 else ""))
        derived = {}
        for prefix, module in self.named_modules():
            for ours, theirs in getattr(module, "retrofit_aliases", {}).items():
                key, src = f"{prefix}.{ours}" if prefix else ours, f"{prefix}.{theirs}" if prefix else theirs
                if key not in state and src in state:
                    derived[key] = src
        merged = dict(state) | {k: state[v] for k, v in derived.items()}
        for key, value in merged.items():
            if own[key].shape != value.shape:
                raise ValueError(f"checkpoint tensor '{key}' has shape {tuple(value.shape)}, "
                                 f"model expects {tuple(own[key].shape)} (different config?)")
        self.load_state_dict(merged, strict=False)
        new = sorted(set(own) - set(merged))
        return LoadReport(loaded=sorted(state), new=new, derived=derived)


def _read_checkpoint(checkpoint: Mapping[str, torch.Tensor] | str | Path) -> Mapping[str, torch.Tensor]:
    if isinstance(checkpoint, (str, Path)):
        path = Path(checkpoint)
        if not path.is_file():
            raise ValueError(f"checkpoint file '{path}' does not exist")
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        for key in ("state_dict", "model"):  # Lightning / timm training checkpoints wrap the weights
            if isinstance(checkpoint, Mapping) and key in checkpoint and isinstance(checkpoint[key], Mapping):
                checkpoint = checkpoint[key]
    return checkpoint


def _lookup_residual(name: str):
    if name not in RESIDUALS:
        raise ValueError(f"unknown residual '{name}'; valid choices: {', '.join(RESIDUALS)}")
    return RESIDUALS[name]


def _check_config(*, img_size: int, patch_size: int, embed_dim: int, depth: int, num_heads: int,
                  global_pool: str, class_token: bool, drop_path_rate: float, in_chans: int,
                  num_classes: int) -> None:
    """One-line ValueErrors for impossible configurations, before any module is built."""
    for name, value in (("depth", depth), ("embed_dim", embed_dim), ("num_heads", num_heads),
                        ("img_size", img_size), ("patch_size", patch_size), ("in_chans", in_chans)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if num_classes < 0:
        raise ValueError(f"num_classes must be >= 0, got {num_classes}")
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}; "
                         f"valid num_heads: {', '.join(str(h) for h in range(1, embed_dim + 1) if embed_dim % h == 0)}")
    if img_size % patch_size:
        raise ValueError(f"img_size={img_size} is not divisible by patch_size={patch_size}")
    if global_pool not in ("token", "avg"):
        raise ValueError(f"global_pool={global_pool!r} is not valid; valid choices: token, avg")
    if global_pool == "token" and not class_token:
        raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without a class token")
    if not 0.0 <= drop_path_rate <= 1.0 or math.isnan(drop_path_rate):
        raise ValueError(f"drop_path_rate must be in [0, 1], got {drop_path_rate}")
