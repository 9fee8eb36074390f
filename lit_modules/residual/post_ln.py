"""Post-LN (Vaswani et al., "Attention Is All You Need", arXiv 1706.03762; the baseline of DeepNet, arXiv 2203.00555)."""

from __future__ import annotations

from typing import Any

from torch import nn

from .base import BlockArgs
from .deepnorm import DeepNorm


class PostLN(DeepNorm):
    """The original Transformer's post-norm residual, ``x ← LN(x + F(x))`` after every sublayer:

        Δ = LN(x + G(x)) − x,   G = attention or MLP applied to the stream itself (no pre-norm)

    i.e. DeepNorm with α = 1 and timm's init kept (no β scaling): the block is ``blocks.PostNormBlock`` (the norm
    after each sum, timm's names ``norm1``/``norm2``), DropPath drops G inside the norm as DeepNorm does, and
    ``decompose``/``diagnostics`` are DeepNorm's with α = 1.

    ``final_norm``: False (default) — the encoder's last sublayer already ends in a LayerNorm, and the original
    Transformer encoder has no extra norm before its output; True keeps timm's final norm (an adaptation). Given
    with a class-attention head it is rejected (that head always keeps the final norm).
    """

    name = "post_ln"
    paper = "Vaswani et al. 2017, arXiv 1706.03762"

    def __init__(self, dim: int, *, args: BlockArgs, final_norm: bool = False) -> None:
        super().__init__(dim, args=args, alpha=1.0, beta=1.0, init="timm_scaled", final_norm=final_norm)

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        cls.check_final_norm(options)

    def init_sublayer(self, sublayer: nn.Module) -> None:
        """timm's init is kept (post-LN has no init rule of its own)."""

    def extra_repr(self) -> str:
        return "alpha=1"
