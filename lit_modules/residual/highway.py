"""Highway networks (Srivastava, Greff & Schmidhuber, arXiv 1505.00387 / NeurIPS 2015), adapted per sublayer."""

from __future__ import annotations

from typing import Any

import torch
from timm.layers import trunc_normal_
from torch import nn

from .base import BlockArgs, ResidualSite, check_choice


def guideline_bias(gated_layers: int) -> float:
    """The Highway paper's gate-bias guideline (−1, −2, −3 at depth ≈ 10, 20, 30), clipped to that range."""
    return -float(min(3, max(1, round(gated_layers / 10))))


class Highway(ResidualSite):
    """Coupled, input-dependent transform gate (spec §5):

        t = σ(W_T u + b_T),   x ← t ⊙ F(u) + (1 − t) ⊙ x,   i.e.  Δ = t ⊙ (F(u) − x),   u = Norm(x)

    per token and channel. ``gate_bias`` (b_T) starts negative so the block is biased towards carrying x.
    ``"auto"`` (default) is the paper's guideline — "−1, −2 and −3 for highway networks of depth approximately
    10, 20 and 30" — applied to the number of gated layers n = 2·depth (two sublayers per block):
    b_T = −clip(round(n / 10), 1, 3). A float sets it directly (e.g. −4 keeps 24 sublayers nearer the identity, an
    option no paper prescribes). ``gate_weight_init``: ``trunc_normal`` (std 0.02, input-dependent from step 0) or
    ``zeros`` (t = σ(b_T) constant at init). Never exactly the identity: the skip is scaled by 1 − σ(b_T) at each
    sublayer.
    """

    name = "highway"
    paper = "Srivastava et al. 2015, arXiv 1505.00387"

    def __init__(self, dim: int, *, args: BlockArgs, gate_bias: float | str = "auto",
                 gate_weight_init: str = "trunc_normal") -> None:
        super().__init__(dim, args=args)
        self.gate_bias = guideline_bias(2 * args.depth) if gate_bias == "auto" else float(gate_bias)
        self.gate_weight_init = gate_weight_init
        self.gate = nn.Linear(dim, dim)

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        check_choice("gate_weight_init", options["gate_weight_init"], ("trunc_normal", "zeros"))
        bias = options["gate_bias"]
        if bias != "auto" and not (isinstance(bias, (int, float)) and not isinstance(bias, bool)):
            raise ValueError(f"gate_bias={bias!r} is not valid for highway; valid: a float or 'auto'")

    def init_weights(self) -> None:
        if self.gate_weight_init == "zeros":
            nn.init.zeros_(self.gate.weight)
        else:
            trunc_normal_(self.gate.weight, std=0.02)
        nn.init.constant_(self.gate.bias, self.gate_bias)

    def no_weight_decay(self) -> set[str]:
        return {"gate.bias"}

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        t = torch.sigmoid(self.gate(u))
        return t * (f - x)

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.sigmoid(self.gate(u))
        return t * f, 1.0 - t

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        stats = {"gate_bias_mean": self.gate.bias.detach().mean()}
        if u is not None:
            stats["gate_mean"] = torch.sigmoid(self.gate(u)).mean().detach()
        return stats
