"""SkipDense: dense skip connections of every block's branch (the seed notes' formula; DenseNet-style density,
Huang et al., arXiv 1608.06993)."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..blocks import DenseBlock, ResidualStream
from .base import BlockArgs
from .standard import Standard


class SkipDense(Standard):
    """``x_{l+1} = x_l + Σ_{i=0}^{l} f_l(x_i)`` — block l's branch applied to every stream state so far, at block
    granularity: f_l(x) = Block_l(x) − x = A(LN₁x) + M(LN₂(x + A(LN₁x))), the whole pre-norm block without its
    skip (as LAuReL's ``WholeBlock``), so ``Δ = Σ_i f_l(x_i)``.

    The notes write ``y_l = x_l + Σ_{i<l} F_l(x_i)``; we read the sum as running over the states the block can see
    *including its own input* x_l (an interpretation: the literal sum leaves block 0 with no branch at all). So
    a depth-1 model is exactly the standard residual, and so is every block's term i = l. No parameters; block l
    runs its branch l + 1 times: forward/backward cost and activation memory are quadratic in depth
    (L(L+1)/2 block evaluations instead of L).
    """

    name = "skipdense"
    paper = "seed notes (no paper); dense connectivity as in Huang et al. 2017, arXiv 1608.06993"

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        return DenseBlock(args, site=cls(args.dim, args=args, **options))

    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        return ResidualStream(keep_history=True)
