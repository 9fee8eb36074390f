"""Standard pre-norm residual (He et al., arXiv 1512.03385; ViT, arXiv 2010.11929)."""

from __future__ import annotations

import torch

from .base import ResidualSite


class Standard(ResidualSite):
    """Plain residual: ``x ← x + F(Norm(x))``, so ``Δ = f``. No parameters; the baseline every variant is
    compared with (spec §1)."""

    name = "standard"
    paper = "He et al. 2016, arXiv 1512.03385"

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return f
