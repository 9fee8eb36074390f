"""Standard pre-norm residual (He et al., arXiv 1512.03385; ViT, arXiv 2010.11929)."""

from __future__ import annotations

import torch

from .base import BlockArgs, ResidualSite


class Standard(ResidualSite):
    """Plain residual: ``x ← x + F(Norm(x))``, so ``Δ = f``. No parameters; the baseline every variant is
    compared with (spec §1). Under a parametrisation that scales the branches (``BlockArgs.branch_scale``, e.g.
    CompleteP's m_L^{−α}), ``Δ = m·f``."""

    name = "standard"
    paper = "He et al. 2016, arXiv 1512.03385"

    def __init__(self, dim: int, *, args: BlockArgs) -> None:
        super().__init__(dim, args=args)
        self.branch_scale = float(args.branch_scale)

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return f if self.branch_scale == 1.0 else self.branch_scale * f
