"""SkipInit (De & Smith, "Batch Normalization Biases Residual Blocks Towards the Identity Function in Deep
Networks", arXiv 2002.10444, NeurIPS 2020)."""

from __future__ import annotations

import torch
from torch import nn

from .base import BlockArgs, ResidualSite


class SkipInit(ResidualSite):
    """A learnable scalar at the end of each residual branch: ``x ← x + α·F(Norm(x))``, α = 0 at init, one α
    per sublayer. Every block is exactly the identity at init (spec §4, I-exact).

    ``init_value``: α₀ (the paper's "or a small constant ≲ 1/√d" option). ``norm=False`` is the paper's
    normalisation-free form (no ``norm1``/``norm2``).
    """

    name = "skipinit"
    paper = "De & Smith 2020, arXiv 2002.10444"

    def __init__(self, dim: int, *, args: BlockArgs, init_value: float = 0.0, norm: bool = True) -> None:
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

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"alpha": self.alpha.detach()[0]}
