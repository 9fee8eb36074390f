"""SkipInit (De & Smith, "Batch Normalization Biases Residual Blocks Towards the Identity Function in Deep
Networks", arXiv 2002.10444, NeurIPS 2020)."""

from __future__ import annotations

import torch
from torch import nn

from .base import BlockArgs, ResidualSite


class SkipInit(ResidualSite):
    """A learnable scalar at the end of each residual branch, in the paper's normalisation-free network:
    ``x ← x + α·F(x)``, α = 0 at init, one α per sublayer. Every block is exactly the identity at init (I-exact).

    ``init_value``: α₀ (the paper's "or a small constant ≲ 1/√d" option). ``norm=True`` keeps the pre-norm
    LayerNorms, ``x ← x + α·F(Norm(x))``: not SkipInit's form but CaiT's "LayerNorm + zero-init scalar" control.
    The final LayerNorm before the head is kept in both (a project choice).
    """

    name = "skipinit"
    paper = "De & Smith 2020, arXiv 2002.10444"

    def __init__(self, dim: int, *, args: BlockArgs, init_value: float = 0.0, norm: bool = False) -> None:
        super().__init__(dim, args=args)
        self.init_value = float(init_value)
        self.norm = norm
        self.alpha = nn.Parameter(torch.full((1,), self.init_value))

    @property
    def pre_norm(self) -> bool:
        return self.norm

    def init_weights(self) -> None:
        nn.init.constant_(self.alpha, self.init_value)

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return self.alpha * f

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"alpha": self.alpha.detach()[0]}
