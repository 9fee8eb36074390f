"""GPAS: Gradient-Preserving Activation Scaling (Chen et al., "GPAS: Accelerating Convergence of LLM Pretraining via
Gradient-Preserving Activation Scaling", arXiv 2506.22049, NeurIPS 2025)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import InnerDropBlock
from .base import BlockArgs, ResidualSite, SiteTerms, check_choice

GATES = ("block", "sublayer")


class GPAS(ResidualSite):
    """Pre-LN with the stream scaled down after every residual add, behind a stop-gradient:

        h = x + F(LN x),   x ← h − SiLU(g)·sg(h),   Δ = f − SiLU(g)·sg(x + f)

    so the value is (1 − SiLU(g))·h while ∂x_new/∂h is the identity (the gradient through the skip is kept; only
    g learns from the scaling). g is a learned scalar, 0 at init: SiLU(0) = 0, so the model **is** the standard
    pre-LN ViT at init (R-exact), and ∂SiLU/∂g = 1/2 there, so g learns from the first step.

    ``gate``: ``"block"`` (default) — one g per block, shared by its attention and MLP sites, as the reference
    code (dandingsky/GPAS ``modeling_llama.py``: one ``GPASBlock`` per decoder layer, called after both residual
    adds); ``"sublayer"`` — one g per site, the per-sublayer reading of the paper's text ("a learnable scalar after
    each sub-layer"). ``init_value``: g at init (the reference's ``gate_init_value``, 0). g is a scalar: never
    weight-decayed (the reference trains it with Adam and no decay).

    DropPath (the reference has none) drops the branch f before the site (``blocks.InnerDropBlock``), as for every
    design that acts after the add: h = x + DropPath(f), x ← h − SiLU(g)·sg(h), so a dropped site still scales the
    stream and a kept one is scaled by exactly 1 − SiLU(g) (dropping Δ would rescale a kept sample's scaling by
    1/(1 − p)). ``decompose``: x_new = (1 − s)·(x + f), s = SiLU(g), so the branch term is (1 − s)·f and
    the skip scale 1 − s.
    """

    name = "gpas"
    paper = "Chen et al. 2025 (GPAS), arXiv 2506.22049"

    def __init__(self, dim: int, *, args: BlockArgs, gate: str = "block", init_value: float = 0.0) -> None:
        super().__init__(dim, args=args)
        self.init_value = float(init_value)
        self.gate = nn.Parameter(torch.full((1,), self.init_value))

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        check_choice("gate", options["gate"], GATES)
        value = options["init_value"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"init_value={value!r} is not valid for gpas; valid: a float (g at init; reference 0)")

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        return InnerDropBlock(args, sites=cls.build_sites(args, **options))

    @classmethod
    def build_sites(cls, args: BlockArgs, **options: Any) -> tuple[nn.Module, nn.Module]:
        first = cls(args.dim, args=args, **options)
        if options["gate"] == "block":
            return first, SharedGate(first)
        return first, cls(args.dim, args=args, **options)

    def init_weights(self) -> None:
        nn.init.constant_(self.gate, self.init_value)

    def scale(self) -> torch.Tensor:
        """s = SiLU(g): the fraction of the stream the site removes (in value only)."""
        return F.silu(self.gate)

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return gpas_update(x, f, self.scale())

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keep = 1.0 - self.scale()
        return keep * f, keep

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"gate": self.gate.detach()[0], "scale": self.scale().detach()[0]}

    def extra_repr(self) -> str:
        return f"init_value={self.init_value:g}"


def gpas_update(x: torch.Tensor, f: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Δ = f − s·sg(x + f): the update whose sum with x is h − s·sg(h), h = x + f."""
    return f - s * (x + f).detach()


class SharedGate(nn.Module):
    """GPAS's MLP site under ``gate="block"``: the same update with the g owned by the block's attention site (stored
    once, under ``ls1.gate``)."""

    def __init__(self, owner: GPAS) -> None:
        super().__init__()
        self._owner = (owner,)  # a tuple hides it from Module registration: g appears once in the state dict
        self.pre_norm = True

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return gpas_update(x, f, self._owner[0].scale())

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._owner[0].decompose(x, u, f)

    def diagnostic_terms(self, args: tuple, output: torch.Tensor) -> SiteTerms:
        """g is reported once, by the owner (the block's attention site)."""
        x, u, f = args[0], args[1], args[2]
        branch, skip = self.decompose(x, u, f)
        return SiteTerms(x, branch, output, skip, {})
