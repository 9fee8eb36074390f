"""Keel (Chen & Wei, "Post-LayerNorm Is Back: Stable, ExpressivE, and Deep", arXiv 2601.19895)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..blocks import InnerDropBlock
from .base import BlockArgs, OptionalFinalNorm, ResidualSite, check_auto_or_positive


def keel_alpha(depth: int) -> float:
    """α = L, the number of residual sublayers (2 per block), the paper's setting (vit-pytorch's default too)."""
    return 2.0 * depth


class Keel(OptionalFinalNorm, ResidualSite):
    """Keel: a post-LN residual whose skip is up-weighted (a Highway-style path) and whose branch keeps an input
    norm,

        x ← LN_out(α·x + F(LN_in x)),   Δ = LN_out(α·x + f) − x,   f = F(u), u = LN_in x,   α = L = 2·depth

    except the very first sublayer of the network (block 0's attention), which is a plain pre-LN residual
    x ← x + F(LN_in x) (Δ = f): it has no ``LN_out``, as in the reference ViT (vit-pytorch
    ``vit_with_keel_post_ln.py``, ``post_norms`` has one norm per sublayer but the first). ``LN_in`` is the block's
    ``norm1``/``norm2`` (timm's names: a timm checkpoint's norms load into it); ``LN_out`` is this site's own
    ``post_norm``. The block is ``blocks.InnerDropBlock``: DropPath drops f inside ``LN_out`` (a dropped site is
    LN_out(α·x)), as DeepNorm's post-norm does. No final norm before the head by default: the last sublayer ends
    in ``LN_out`` (the reference ViT has none).

    Options: ``alpha``: ``"auto"`` (default, L = 2·depth) or a float > 0. ``final_norm``: False (default) / True
    (timm's final norm kept, an adaptation); rejected with a class-attention head, which always keeps it.
    The reference uses bias-free LayerNorms; the backbone's norm layer (timm's LayerNorm, with bias) is used here.

    ``decompose``: with z = α·x + f and σ the output norm's per-token scale of z, the skip scale is c = α·g/σ for a
    unit-gain norm (reported as α/σ) and the branch term b = Δ − (c − 1)·x, as DeepNorm's.
    """

    name = "keel"
    paper = "Chen & Wei 2026 (Keel), arXiv 2601.19895"

    def __init__(self, dim: int, *, args: BlockArgs, alpha: float | str = "auto", final_norm: bool = False) -> None:
        super().__init__(dim, args=args)
        self.alpha = keel_alpha(args.depth) if alpha == "auto" else float(alpha)
        self.first = args.layer == 0  # set per site by build_sites: only block 0's attention site is plain
        self.post_norm: nn.Module | None = args.norm_layer(dim)

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        check_auto_or_positive("alpha", options["alpha"], cls.name)
        cls.check_final_norm(options)

    @classmethod
    def build_sites(cls, args: BlockArgs, **options: Any) -> tuple[nn.Module, nn.Module]:
        attn, mlp = cls(args.dim, args=args, **options), cls(args.dim, args=args, **options)
        mlp.first = False
        if attn.first:
            attn.post_norm = None  # the network's first sublayer: plain pre-LN residual (no output norm)
        return attn, mlp

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        return InnerDropBlock(args, sites=cls.build_sites(args, **options))

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        if self.post_norm is None:
            return f
        return self.post_norm(self.alpha * x + f) - x

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, Any]:
        if self.post_norm is None:
            return f, 1.0
        z = self.alpha * x + f
        centred = z - z.mean(dim=-1, keepdim=True) if isinstance(self.post_norm, nn.LayerNorm) else z
        eps = getattr(self.post_norm, "eps", 0.0) or 0.0
        skip = self.alpha * torch.rsqrt(centred.square().mean(dim=-1, keepdim=True) + eps)
        return self.post_norm(z) - skip * x, skip

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if x is None or f is None:
            return {}
        ratio = f.detach().norm(dim=-1) / (self.alpha * x.detach().norm(dim=-1)).clamp_min(1e-30)
        return {"branch_skip_ratio": ratio.mean()}

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.4g}, first={self.post_norm is None}"
