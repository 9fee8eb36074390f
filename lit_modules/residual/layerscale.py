"""LayerScale (Touvron et al., "Going deeper with Image Transformers", CaiT, arXiv 2103.17239)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .base import BlockArgs, ResidualSite


def cait_init_value(depth: int) -> float:
    """CaiT's depth rule for ε: 0.1 up to depth 18, 1e-5 up to 24, 1e-6 deeper (spec §2)."""
    return 0.1 if depth <= 18 else 1e-5 if depth <= 24 else 1e-6


class LayerScale(ResidualSite):
    """Per-channel scale of each branch: ``x ← x + diag(γ)·F(Norm(x))``, so ``Δ = γ ⊙ f`` with γ ∈ R^D.

    ``init_value``: a float (0.0 is honoured: a zero-initialised γ, not timm's silent "no LayerScale"),
    ``"auto"`` for CaiT's depth rule, or ``None`` to disable the scale (then Δ = f, the standard residual).
    γ is named ``gamma`` as in timm, so timm checkpoints with ``init_values`` load (``blocks.i.ls1.gamma``).
    """

    name = "layerscale"
    paper = "Touvron et al. 2021 (CaiT), arXiv 2103.17239"

    def __init__(self, dim: int, *, args: BlockArgs, init_value: float | str | None = "auto") -> None:
        super().__init__(dim, args=args)
        self.init_value = cait_init_value(args.depth) if init_value == "auto" else init_value
        self.gamma = None if self.init_value is None else nn.Parameter(torch.full((dim,), float(self.init_value)))

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        value = options["init_value"]
        if not (value is None or value == "auto" or (isinstance(value, (int, float)) and not isinstance(value, bool))):
            raise ValueError(f"init_value={value!r} is not valid for layerscale; valid: a float, 'auto' or None")

    def init_weights(self) -> None:
        if self.gamma is not None:
            nn.init.constant_(self.gamma, float(self.init_value))

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return f if self.gamma is None else f * self.gamma

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if self.gamma is None:
            return {}
        g = self.gamma.detach()
        return {"gamma_mean": g.mean(), "gamma_std": g.std(), "gamma_abs_mean": g.abs().mean()}
