"""Deep Delta Learning (Zhang et al., "Deep Delta Learning", arXiv 2601.00417)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .base import BlockArgs, ResidualSite, check_choice

VALUES = ("sigmoid", "constant")
K_EPS = 1e-5  # the reference's ``ddl_k_eps``: k = f / √(‖f‖² + K_EPS²)
V_SCALE = 4.0  # the reference's ``ddl_v_sigmoid_scale``: v = 4σ(w_v·x + b_v)
V_CONSTANT = 2.0  # the reference's ``ddl_v_dim1_constant_value`` (its earlier form)


def logit(p: float) -> float:
    """log(p / (1 − p)), p clamped to [1e-6, 1 − 1e-6] as the reference's ``_logit``."""
    p = min(max(float(p), 1e-6), 1.0 - 1e-6)
    return math.log(p) - math.log(1.0 - p)


def wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in at least fp32 (the reference computes β and kᵀx in fp32 under bf16); float64 stays float64."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class DeepDelta(ResidualSite):
    """The Delta residual (scalar value, d_v = 1): the shortcut becomes a rank-1 update of the identity, and the
    branch only chooses its direction,

        k = F(u) / ‖F(u)‖,   β = 2σ(w_β·u + b_β) ∈ [0, 2],   v = 4σ(w_v·x + b_v) ∈ [0, 4]
        x ← (I − β k kᵀ) x + β v k,    Δ = β (v − kᵀx) k

    per token (u = Norm(x), the sublayer's input; v reads the raw stream x). Along k the skip's eigenvalue is
    1 − β: the identity at β = 0, the projection that erases x's component along k at β = 1, the reflection at
    β = 2; then β·v writes the new value along k. As the reference (yifanzhang-pro/deep-delta-learning,
    ``model/DDL-vdim1-gpt-mha-rope.py``, ``DeepDeltaResidualVdim1``): ‖F(u)‖ is regularised, k = f/√(‖f‖² + 10⁻¹⁰)
    (its RMSNorm with ε = k_eps²/D, k_eps = 1e-5, divided by √D), and kᵀx is summed in fp32.

    Parameters (per site): ``beta`` and ``value``, each a ``Linear(D, 1)``. Init (the reference's): weights
    N(0, (0.5/√D)²) (its ``init_gpt_weights``), b_β = logit(β₀/2) so β = β₀ at a zero input (β₀ = ``beta_init``,
    1 by default: the projection), b_v left at PyTorch's ``Linear`` default U(−1/√D, 1/√D) (the reference's init
    does not touch 1-D parameters). The reference's model also draws its other hidden weights with std 0.5/√D and
    its output projections with 0.5/√(D·L): a recipe of its whole GPT (its baseline shares it), not of the Delta
    residual — this backbone keeps timm's init for the shared weights, so a seed pairs DeepDelta with ``standard``.

    Options: ``value``: ``"sigmoid"`` (default, v = 4σ(w_v·x + b_v), the current reference) or ``"constant"``
    (v = 2, the reference's earlier form, ``ddl_v_dim1_constant``: no ``value`` layer); ``beta_init``: β₀ ∈ [0, 2].

    Level at init: neither the identity nor the standard ViT (β ≈ 1 projects x off k). Weight decay: the two
    (1, D) weights are decayed as projection weights (as Highway's gate weight), the biases are not; the reference
    ships no trainer. DropPath drops the whole Δ (the skip becomes the identity). ``decompose`` keeps the default
    (the whole Δ is the branch term, skip 1: the rank-1 skip is not a scalar); the diagnostics report β, v and the
    skip's eigenvalue along k, 1 − β.
    """

    name = "deep_delta"
    paper = "Zhang et al. 2026 (Deep Delta Learning), arXiv 2601.00417"

    def __init__(self, dim: int, *, args: BlockArgs, value: str = "sigmoid", beta_init: float = 1.0) -> None:
        super().__init__(dim, args=args)
        self.beta_init = float(beta_init)
        self.beta = nn.Linear(dim, 1)
        self.value = nn.Linear(dim, 1) if value == "sigmoid" else None

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        check_choice("value", options["value"], VALUES)
        b = options["beta_init"]
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0.0 <= b <= 2.0:
            raise ValueError(f"beta_init={b!r} is not valid for deep_delta; valid: a float in [0, 2] (beta at init; "
                             f"reference 1)")

    @torch.no_grad()
    def init_weights(self) -> None:
        std = 0.5 / math.sqrt(self.dim)
        self.beta.weight.normal_(0.0, std)
        self.beta.bias.fill_(logit(self.beta_init / 2.0))
        if self.value is not None:
            self.value.weight.normal_(0.0, std)
            bound = 1.0 / math.sqrt(self.dim)
            self.value.bias.uniform_(-bound, bound)

    def no_weight_decay(self) -> set[str]:
        return set()  # the biases are 1-D (timm's rule); the (1, D) weights are decayed as projections

    def terms(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | float, torch.Tensor]:
        """(k, β, v, kᵀx) per token: k (..., D) unit-norm direction, β, v and kᵀx (..., 1)."""
        k = f * torch.rsqrt(wide(f).square().sum(dim=-1, keepdim=True) + K_EPS ** 2).to(f.dtype)
        beta = 2.0 * torch.sigmoid(wide(self.beta(u)))
        proj = (k * x).sum(dim=-1, keepdim=True, dtype=torch.promote_types(x.dtype, torch.float32))
        v = V_CONSTANT if self.value is None else V_SCALE * torch.sigmoid(wide(self.value(x)))
        return k, beta, v, proj

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        k, beta, v, proj = self.terms(x, u, f)
        return (beta * (v - proj)).to(x.dtype) * k

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if x is None or u is None or f is None:
            return {}
        with torch.no_grad():
            _, beta, v, proj = self.terms(x, u, f)
        return {"beta_mean": beta.mean(), "value_mean": torch.as_tensor(v).mean(),
                "skip_eigen_k_mean": (1.0 - beta).mean(), "proj_abs_mean": proj.abs().mean()}

    def extra_repr(self) -> str:
        return f"value={'sigmoid' if self.value is not None else 'constant'}, beta_init={self.beta_init:g}"
