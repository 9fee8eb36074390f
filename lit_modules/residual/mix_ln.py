"""Mix-LN (Li, Yin & Liu, "Mix-LN: Unleashing the Power of Deeper Layers by Combining Pre-LN and Post-LN",
arXiv 2412.13795)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..blocks import Block, PostNormBlock
from .base import BlockArgs
from .post_ln import PostLN


def post_ln_blocks(alpha: float, depth: int) -> int:
    """The number of leading post-LN blocks, ⌊α·L⌋."""
    return math.floor(alpha * depth + 1e-9)


class MixLN(PostLN):
    """Mix-LN: post-LN in the first ⌊α·L⌋ blocks, pre-LN in the rest (L = ``depth`` blocks),

        block ℓ < ⌊αL⌋:   x ← LN(x + F(x)),      Δ = LN(x + f) − x   (``post_ln``'s site and block, DropPath inside)
        block ℓ ≥ ⌊αL⌋:   x ← x + F(LN(x)),      Δ = f                (the standard pre-LN block)

    ``alpha``: 0.25 (default, the paper's fraction for its LLaMA models; the reference code takes the count
    directly, ``POST_NUM``), a float in [0, 1]. With α·L < 1 every block is pre-LN (the standard ViT). The final norm
    is kept: the last blocks are pre-LN. Every block keeps timm's names (``norm1``/``norm2``), so a timm checkpoint
    loads. ``decompose``/``diagnostics``: ``post_ln``'s in the post-LN blocks, the standard residual's after.
    """

    name = "mix_ln"
    paper = "Li et al. 2025 (Mix-LN), arXiv 2412.13795"

    def __init__(self, dim: int, *, args: BlockArgs, alpha: float = 0.25) -> None:
        super().__init__(dim, args=args, final_norm=True)
        self.fraction = float(alpha)
        self.post = args.layer < post_ln_blocks(self.fraction, args.depth)

    @property
    def pre_norm(self) -> bool:
        return not self.post

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        value = options["alpha"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
            raise ValueError(f"alpha={value!r} is not valid for mix_ln; valid: a float in [0, 1]")

    @classmethod
    def inapplicable_with_backbone(cls, options: dict[str, Any], backbone: dict[str, Any]) -> dict[str, str]:
        return {}

    @classmethod
    def uses_final_norm(cls, **options: Any) -> bool:
        return True

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        sites = cls.build_sites(args, **options)
        return PostNormBlock(args, sites=sites) if sites[0].post else Block(args, sites=sites)

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return super().forward(x, u, f, history) if self.post else f

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return super().decompose(x, u, f) if self.post else (f, 1.0)

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return super().diagnostics(x, u, f) if self.post else {}

    def extra_repr(self) -> str:
        return f"alpha={self.fraction}, post={self.post}"
