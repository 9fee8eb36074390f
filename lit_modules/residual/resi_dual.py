"""ResiDual (Xie et al., "ResiDual: Transformer with Dual Residual Connections", arXiv 2304.14802)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..blocks import DualStream
from .base import BlockArgs
from .post_ln import PostLN


class ResiDual(PostLN):
    """ResiDual: a post-LN stream and a pre-LN-like dual stream that sums every branch output, fused at the end,

        x_a ← LN(x_a + F(x_a)),   x_d ← x_d + F(x_a)   (every sublayer; x_a = x_d = x_0, the embeddings, at the start)
        output = x_a + LN(x_d)

    The blocks are ``post_ln``'s (``blocks.PostNormBlock``: Δ = LN(x_a + f) − x_a, DropPath drops f inside the norm,
    and the dual stream receives the same dropped f, as the reference code adds its dropout-ed branch output);
    the sites add f into the dual stream, which ``blocks.DualStream`` keeps as ``history[0]`` and normalises
    with its own ``stream.norm`` at the end. The reference (microsoft/ResiDual, fairseq) has scales on both
    (``enc_res_input_norm_scale`` on the dual stream, ``enc_alpha`` on x_a), both 1 in its configs, and also starts
    x_d at the embeddings: neither differs from the paper, so no option is kept. No final norm before the head
    (the output already ends in LN(x_d) plus a normalised x_a).
    """

    name = "resi_dual"
    paper = "Xie et al. 2023 (ResiDual), arXiv 2304.14802"

    def __init__(self, dim: int, *, args: BlockArgs) -> None:
        super().__init__(dim, args=args, final_norm=False)

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        pass

    @classmethod
    def inapplicable_with_backbone(cls, options: dict[str, Any], backbone: dict[str, Any]) -> dict[str, str]:
        return {}

    @classmethod
    def uses_final_norm(cls, **options: Any) -> bool:
        return False

    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        return DualStream(dim, norm_layer)

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        if history:  # the dual stream x_d (None when a site is called outside the stream, e.g. by diagnostics)
            history[0] = history[0] + f
        return super().forward(x, u, f, history)
