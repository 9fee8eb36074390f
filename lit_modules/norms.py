"""Replacements of LayerNorm chosen by ``VisionTransformer(norm_layer=...)``: two normalisation-free maps (DyT,
Derf) and SeeDNorm, an RMSNorm with an input-dependent gain.

DyT and Derf are element-wise maps with a learned per-channel affine, used in place of *every* LayerNorm of the
model (pre-norms, final norm, the variants' own norms), as the papers' ``convert_ln_to_*`` helpers do. All take the
backbone's ``eps`` argument so that every norm layer is called the same way (``cls(dim, eps=...)``); DyT and Derf
have no ε, so they accept and ignore it. A class that gains an option after runs recorded their form declares it in
a class attribute ``added_options = {option: value before it existed}`` (as the residual sites do:
``lit_modules.vit.upgraded_form``).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
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


class SeeDNorm(nn.Module):
    """SeeDNorm (Cai, Zhu, Liu & Min, "SeeDNorm: Self-Rescaled Dynamic Normalization", arXiv 2510.22777, ICLR 2026):
    RMSNorm whose per-channel gain is modulated by the input itself,

        SeeDNorm(x) = [γ + α ⊙ tanh(x·β)] ⊙ x / RMS(x),   RMS(x) = √(mean x² + ε)

    with γ, α, β ∈ R^D learned (γ = 1, α = 1, β = 0 at init: exactly RMSNorm with gain γ). ``x·β`` is a scalar per
    token in the single-head form; in the paper's multi-head form (its vision setting) x and β are split into
    ``groups`` contiguous groups of D/groups channels and each group g gets its own scalar x_g·β_g, which scales
    α's channels of that group. ``groups``: None (default) — 16 (the paper's best for ViT-B; a single group diverged
    there), reduced to the largest divisor of 16 that divides D when D is not a multiple of 16 (``self.groups``);
    an integer that divides D sets it (ValueError naming the divisors otherwise). RMS(x) is taken over
    all D channels. No official code was found: the formula and inits are the paper's; its vision recipe's dropout on
    the dynamic term and its 1/D variance scaling are not built. Weight decay: α and β are decayed, as the paper
    trains them (``decayed_vectors``: the exception to timm's rule that leaves 1-D parameters alone); γ is not.
    """

    def __init__(self, dim: int, eps: float = 1e-6, groups: int | None = None, **factory: Any) -> None:
        super().__init__()
        self.eps = float(eps)
        if groups is not None and dim % groups:
            divisors = ", ".join(str(g) for g in range(1, dim + 1) if dim % g == 0)
            raise ValueError(f"groups={groups} is not valid for norm_layer 'seednorm' at width {dim}; valid: a divisor "
                             f"of {dim} ({divisors})")
        self.groups = math.gcd(16, dim) if groups is None else int(groups)
        self.weight = nn.Parameter(torch.ones(dim))  # γ
        self.alpha = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.groups
        shape = (*x.shape[:-1], g, x.shape[-1] // g)
        s = (x.view(shape) * self.beta.view(g, -1)).sum(dim=-1, keepdim=True)  # x_g·β_g: (..., g, 1)
        gain = self.weight + (self.alpha.view(g, -1) * torch.tanh(s)).flatten(-2)
        return gain * (x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + self.eps))

    def decayed_vectors(self) -> set[str]:
        return {"alpha", "beta"}

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, groups={self.groups}, eps={self.eps:g}"


def check_norm_options(name: str, cls: type, options: Mapping[str, Any]) -> dict[str, Any]:
    """The norm layer's own options (``norm_options``: the keyword arguments of this module's classes beyond ``dim``
    and ``eps``, e.g. DyT's ``alpha_init``), checked: a one-line ValueError names an unknown option with the valid
    ones, or a value of the wrong kind. timm's LayerNorm and RmsNorm take none. Returns the options with their
    defaults filled in."""
    own = cls.__module__ == __name__
    signature = {n: p for n, p in inspect.signature(cls).parameters.items()
                 if own and n not in ("dim", "eps") and p.default is not inspect.Parameter.empty}
    params = {n: str(p.annotation) for n, p in signature.items()}
    for key, value in options.items():
        if key not in params:
            raise ValueError(f"option '{key}' is not valid for norm_layer '{name}'; valid options: "
                             + (", ".join(sorted(params)) or "none"))
        whole = params[key].startswith("int")  # the annotation: int (an integer) or float
        if (isinstance(value, bool) or not isinstance(value, int if whole else (int, float))
                or not math.isfinite(value) or (whole and value < 1)):
            raise ValueError(f"{key}={value!r} is not valid for norm_layer '{name}'; valid: "
                             + ("an integer >= 1" if whole else "a finite number"))
    return {n: options.get(n, p.default) for n, p in signature.items()}
