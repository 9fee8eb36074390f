"""LayerNorm Scaling (Sun et al., "The Curse of Depth in Large Language Models", arXiv 2502.05795)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..blocks import ScaledNormBlock
from .base import BlockArgs, ResidualSite


def ln_scale(layer: int) -> float:
    """The paper's 1/√ℓ for the block at 0-based index ``layer`` (ℓ = layer + 1, so the first block is unscaled)."""
    return 1.0 / math.sqrt(layer + 1)


class LNScaling(ResidualSite):
    """LayerNorm Scaling (LNS): the pre-LN block with every normalised input scaled by the inverse square root of
    its depth,

        x ← x + F(LN(x) / √ℓ),   Δ = f,   ℓ = the block's 1-based index (both sublayers of block ℓ use the same ℓ)

    as the reference code (lmsdss/LayerNorm-Scaling, ``modeling_llama.py``: ``1 / sqrt(layer_index + 1)`` after
    both the attention and the MLP input norms). The block is ``blocks.ScaledNormBlock`` (timm's names: a timm
    checkpoint loads; the first block equals the standard one). No parameters; the final norm is kept. The
    reference README warns against combining LNS with a depth-scaled init (OLMo's); timm's plain init is kept.
    """

    name = "ln_scaling"
    paper = "Sun et al. 2025 (The Curse of Depth), arXiv 2502.05795"

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return f

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        return ScaledNormBlock(args, sites=cls.build_sites(args, **options), scale=ln_scale(args.layer))
