"""Two learned weights (α on the branch, β on the skip), optionally normalised — shared by LAuReL-RW, the
LAuReL seed form and the DCA seed form, which differ only in how the two weights are parametrised."""

from __future__ import annotations

import math

import torch
from torch import nn

MIX_NORMS = ("none", "softmax", "sigmoid", "coupled")


class MixWeights(nn.Module):
    """(α, β) from learned logits:

    - ``none``: α, β themselves (LAuReL-RW as printed; α = β = 1 is the standard residual);
    - ``softmax``: (α, β) = softmax(a, b) (the "softmax-weighted two-way combination");
    - ``sigmoid``: α = σ(a), β = σ(b), independent;
    - ``coupled``: one logit, α = σ(a), β = 1 − α (the sigmoid gate g·F + (1 − g)·x).

    ``alpha``/``beta`` give the values at init; the logits are derived from them.
    """

    def __init__(self, norm: str, alpha: float, beta: float) -> None:
        super().__init__()
        self.norm = norm
        self.init = (float(alpha), float(beta))
        self.logits = nn.Parameter(torch.zeros(1 if norm == "coupled" else 2))
        self.init_weights()

    @staticmethod
    def check(norm: str, alpha: float, beta: float) -> None:
        """ValueError when the requested init values cannot be expressed under the normalisation."""
        if norm == "softmax" and (alpha <= 0 or beta <= 0 or abs(alpha + beta - 1) > 1e-9):
            raise ValueError(f"softmax weights need alpha, beta > 0 with alpha + beta = 1, got {alpha}, {beta}")
        if norm == "sigmoid" and not (0 < alpha < 1 and 0 < beta < 1):
            raise ValueError(f"sigmoid weights need 0 < alpha, beta < 1, got {alpha}, {beta}")
        if norm == "coupled" and not (0 < alpha < 1 and abs(alpha + beta - 1) < 1e-9):
            raise ValueError(f"a coupled gate needs 0 < alpha < 1 and beta = 1 - alpha, got {alpha}, {beta}")

    def init_weights(self) -> None:
        a, b = self.init
        logit = lambda p: math.log(p / (1 - p))  # noqa: E731
        if self.norm == "none":
            values = [a, b]
        elif self.norm == "softmax":
            values = [math.log(a), math.log(b)]
        elif self.norm == "sigmoid":
            values = [logit(a), logit(b)]
        else:
            values = [logit(a)]
        with torch.no_grad():
            self.logits.copy_(torch.tensor(values))

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.logits
        if self.norm == "softmax":
            w = torch.softmax(w, dim=0)
        elif self.norm == "sigmoid":
            w = torch.sigmoid(w)
        elif self.norm == "coupled":
            g = torch.sigmoid(w[0])
            return g, 1.0 - g
        return w[0], w[1]
