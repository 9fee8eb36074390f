"""Normalisation-free replacements of LayerNorm, chosen by ``VisionTransformer(norm_layer=...)``.

Each is an element-wise map with a learned per-channel affine, used in place of *every* LayerNorm of the model
(pre-norms, final norm, qk-norm, the variants' own norms), as the papers' ``convert_ln_to_*`` helpers do. Both
take the backbone's ``eps`` argument so that every norm layer is called the same way (``cls(dim, eps=...)``);
neither has an ε, so it is accepted and ignored.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class DynamicTanh(nn.Module):
    """Dynamic Tanh (Zhu, Chen, He, LeCun & Liu, "Transformers without Normalization", arXiv 2503.10622):

        DyT(x) = γ ⊙ tanh(α·x) + β,   α a learned scalar (α₀ = 0.5, the paper's non-LLM setting), γ = 1, β = 0

    per token and channel, no statistics. ``alpha_init`` is the paper's α₀ (its LLM runs tune it per layer kind).
    """

    def __init__(self, dim: int, eps: float = 0.0, alpha_init: float = 0.5, **factory: Any) -> None:
        super().__init__()
        self.alpha_init = float(alpha_init)
        self.alpha = nn.Parameter(torch.full((1,), self.alpha_init))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.alpha * x) * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, alpha_init={self.alpha_init}"


class DynamicErf(nn.Module):
    """Derf (Chen, Lu, Zhu, Sun & Liu, "Stronger Normalization-Free Transformers", arXiv 2512.10938):

        Derf(x) = γ ⊙ erf(α·x + s) + β,   α, s learned scalars (α₀ = 0.5, s₀ = 0), γ = 1, β = 0

    as zlab-princeton/Derf's ``Dynamic_erf`` (its ViT runs keep both inits at their defaults).
    """

    def __init__(self, dim: int, eps: float = 0.0, alpha_init: float = 0.5, shift_init: float = 0.0,
                 **factory: Any) -> None:
        super().__init__()
        self.alpha_init, self.shift_init = float(alpha_init), float(shift_init)
        self.alpha = nn.Parameter(torch.full((1,), self.alpha_init))
        self.shift = nn.Parameter(torch.full((1,), self.shift_init))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.erf(self.alpha * x + self.shift) * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, alpha_init={self.alpha_init}, shift_init={self.shift_init}"
