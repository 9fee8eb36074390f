"""ReZero (Bachlechner et al., "ReZero is All You Need", arXiv 2003.04887, UAI 2021)."""

from __future__ import annotations

import torch
from torch import nn

from .base import BlockArgs, SiteTerms
from .skipinit import SkipInit


class ReZero(SkipInit):
    """``x_{i+1} = x_i + α_i·F(x_i)``, α_i = 0 at init, **one α per block shared by the attention and MLP
    sublayers** (official code: one ``resweight`` per encoder layer). Identity at init (I-exact).

    The default is the paper's Transformer without LayerNorm (no ``norm1``/``norm2``; the final pre-head norm is
    kept, a project choice). ``norm=True`` keeps pre-norm: CaiT's "LayerNorm + zero-init scalar" control, not
    ReZero's form. The MLP site reads the attention site's α; the parameter is stored once, under ``ls1.alpha``.
    """

    name = "rezero"
    paper = "Bachlechner et al. 2021, arXiv 2003.04887"

    @classmethod
    def build_sites(cls, args: BlockArgs, **options) -> tuple[nn.Module, nn.Module]:
        first = cls(args.dim, args=args, **options)
        return first, _SharedAlpha(first)


class _SharedAlpha(nn.Module):
    """ReZero's second site: ``Δ = α·f`` with the α owned by the block's first site (not registered twice)."""

    def __init__(self, owner: ReZero) -> None:
        super().__init__()
        self._owner = (owner,)  # a tuple hides it from Module registration: α appears once in the state dict
        self.pre_norm = owner.pre_norm

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return self._owner[0].alpha * f

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, float]:
        return self.forward(x, u, f), 1.0

    def diagnostic_terms(self, args: tuple, output: torch.Tensor) -> SiteTerms:
        """The update is all branch; α is reported once, by the owner (the block's first site)."""
        return SiteTerms(args[0], output, output, 1.0, {})
