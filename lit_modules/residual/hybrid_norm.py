"""HybridNorm (Zhuo et al., "HybridNorm: Towards Stable and Efficient Transformer Training via Hybrid
Normalization", arXiv 2503.04598)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from timm.layers import DropPath, Mlp
from torch import nn

from .base import BlockArgs, ResidualSite, check_choice, inverse_scale

FIRST_BLOCKS = ("hybrid", "pre_norm")


class HybridNorm(ResidualSite):
    """QKV-norm inside the attention, post-norm on the MLP:

        y = x + Attn_qkv(x)                    Attn_qkv: q, k, v = W x, each head's q, k and v normalised
        x ← N(y) + MLP(N(y))                   the MLP's residual starts from the normalised stream

    There is no norm before the attention (``norm1`` is the identity); each head's q, k and v go through the
    backbone's norm layer over the head dimension (``attn.q_norm``, ``attn.k_norm``, ``attn.v_norm``: gains of size
    d shared by the heads); ``norm2`` = N. The attention site's update is Δ = f; the MLP site's is
    **Δ = N(x) + f − x** (u = N(x), f = MLP(u)), and DropPath drops f inside it (a dropped MLP is x ← N(x), as the
    reference's dropout on the FFN output; the norm still applies). The final norm before the head is kept (the
    stream after the last MLP is u + f, not normalised; the reference keeps its final norm).

    ``first_block``: ``"hybrid"`` (default, HybridNorm) or ``"pre_norm"`` (HybridNorm*, the paper's variant: block
    0 is a pre-norm block, x ← x + Attn_qkv(N₁ x), x ← x + MLP(N₂ x), still with the QKV-norm).

    Reference: BryceZhuo/HybridNorm ``dense_model/olmo/model.py`` (``OLMoSequentialBlock`` with ``attn_norm:
    false``, ``ffn_norm: true``, ``ffn_residual_after_norm: true``, ``use_query_norm``/``use_key_norm``/
    ``use_value_norm``), ``configs/exps/1.2B-dense-HybriedNorm.yaml``; HybridNorm* is its
    ``norm_pos_special_config={0: {attn_norm: True, ffn_residual: False}}``. The norms there are RMSNorms (its
    ``layer_norm_type: rms``): ``norm_layer="rmsnorm"`` gives the paper's kind; the default follows the backbone's
    LayerNorm, as every variant here. The backbone's ``qk_norm`` is refused (this attention normalises q, k, v
    itself).

    ``decompose`` (MLP site): x_new = N(x) + f, so the skip scale is N's per-token 1/σ(x) and the branch term
    N(x) + f − x/σ (Δ = b + (skip − 1)·x exactly); the attention site's is the standard one.
    """

    name = "hybrid_norm"
    paper = "Zhuo et al. 2025 (HybridNorm), arXiv 2503.04598"

    def __init__(self, dim: int, *, args: BlockArgs, first_block: str = "hybrid") -> None:
        super().__init__(dim, args=args)
        self.post = False  # set on the MLP site of a HybridNorm block by build_sites
        self._norm: tuple[nn.Module, ...] = ()  # the block's norm2, bound by HybridBlock (not registered here)

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        check_choice("first_block", options["first_block"], FIRST_BLOCKS)

    @classmethod
    def build_sites(cls, args: BlockArgs, **options: Any) -> tuple[nn.Module, nn.Module]:
        attn, mlp = cls(args.dim, args=args, **options), cls(args.dim, args=args, **options)
        mlp.post = not is_pre_norm_block(args, options)
        return attn, mlp

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        return HybridBlock(args, cls.build_sites(args, **options), pre_norm=is_pre_norm_block(args, options))

    def bind_norm(self, norm: nn.Module) -> None:
        """The MLP's norm N (the block's ``norm2``), which the post-norm residual also starts from."""
        self._norm = (norm,)  # a tuple hides it from Module registration: the block owns it (timm's name)

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return u + f - x if self.post else f

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if not self.post:
            return f, 1.0
        skip = inverse_scale(self._norm[0], x)
        return u + f - skip * x, skip

    def extra_repr(self) -> str:
        return "post-norm residual" if self.post else "pre-norm residual"


def is_pre_norm_block(args: BlockArgs, options: dict[str, Any]) -> bool:
    """HybridNorm*'s first block is a pre-norm block (with the QKV-norm); every other block is HybridNorm's."""
    return options["first_block"] == "pre_norm" and args.layer == 0


class HybridBlock(nn.Module):
    """HybridNorm's block (timm's names): ``norm1`` (the identity, or HybridNorm*'s pre-norm in block 0), ``attn``
    with the QKV-norm, ``norm2`` = the MLP's norm, ``mlp``; sites ``ls1`` (attention, Δ = f) and ``ls2`` (MLP, the
    post-norm residual Δ = N(x) + f − x, or Δ = f in a pre-norm block). DropPath drops Δ at the attention site and
    f at a post-norm MLP site (the norm still applies)."""

    def __init__(self, args: BlockArgs, sites: tuple[HybridNorm, HybridNorm], pre_norm: bool) -> None:
        super().__init__()
        dim = args.dim
        self.ls1, self.ls2 = sites
        self.norm1 = args.norm_layer(dim) if pre_norm else nn.Identity()
        self.attn = dataclasses.replace(args, qk_norm=True).attention()  # q and k: the backbone's norm over d
        self.attn.v_norm = args.norm_layer(self.attn.head_dim)
        self.norm2 = args.norm_layer(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * args.mlp_ratio), act_layer=args.act_layer,
                       drop=args.proj_drop)
        self.drop_path1 = DropPath(args.drop_path) if args.drop_path > 0.0 else nn.Identity()
        self.drop_path2 = DropPath(args.drop_path) if args.drop_path > 0.0 else nn.Identity()
        self.ls2.bind_norm(self.norm2)

    def sites(self) -> dict[str, nn.Module]:
        return {"attn": self.ls1, "mlp": self.ls2}

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        u = self.norm1(x)
        x = x + self.drop_path1(self.ls1(x, u, self.attn(u), history))
        u = self.norm2(x)
        if self.ls2.post:  # DropPath on f, inside the post-norm residual
            return x + self.ls2(x, u, self.drop_path2(self.mlp(u)), history)
        return x + self.drop_path2(self.ls2(x, u, self.mlp(u), history))
