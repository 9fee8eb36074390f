"""Deep Delta Learning (Zhang et al., "Deep Delta Learning", arXiv 2601.00417)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..blocks import InnerDropBlock
from .base import BlockArgs, ResidualSite, check_choice

VALUES = ("linear", "sigmoid", "constant")
K_EPS = 1e-5  # the reference's ``ddl_k_eps``: k = f / √(‖f‖² + K_EPS²)
V_SCALE = 4.0  # the reference code's ``ddl_v_sigmoid_scale``: v = 4σ(w_v·x + b_v)
V_CONSTANT = 2.0  # the reference code's ``ddl_v_dim1_constant_value`` (behind its opt-in ``ddl_v_dim1_constant``)


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

        k = F(u) / ‖F(u)‖,   β = 2σ(w_β·u + b_β) ∈ [0, 2],   v = w_v·u
        x ← (I − β k kᵀ) x + β v k,    Δ = β (v − kᵀx) k

    per token (u = RMSNorm/LN(x), the sublayer's input: the paper's normalised context c_l, read by the gate and
    the value). Along k the skip's eigenvalue is 1 − β: the identity at β = 0, the projection that erases x's
    component along k at β = 1, the reflection at β = 2; then β·v writes the new value along k. The value is the
    paper's (Appendix A.1, "the concrete parameterization used by the reported Transformer models": v_l = W_{v,l} c_l,
    a linear map of the normalised context, no bias — §4.1: the backbone's biases are off, only the gate keeps its
    bias). As the reference code (yifanzhang-pro/deep-delta-learning, ``model/DDL-vdim1-gpt-mha-rope.py``,
    ``DeepDeltaResidualVdim1``): ‖F(u)‖ is regularised, k = f/√(‖f‖² + 10⁻¹⁰) (its RMSNorm with ε = k_eps²/D,
    k_eps = 1e-5, divided by √D), and β and kᵀx are computed in fp32.

    Parameters (per site): ``beta``, a ``Linear(D, 1)``, and ``value``, a ``Linear(D, 1)`` without bias (with a bias
    under ``value="sigmoid"``; none under ``"constant"``). Init (the reference code's): weights N(0, (0.5/√D)²) (its
    ``init_gpt_weights``), b_β = logit(β₀/2) so β = β₀ at a zero input (β₀ = ``beta_init``, 1 by default: the
    projection), the sigmoid form's b_v at PyTorch's ``Linear`` default U(−1/√D, 1/√D) (the reference's init does
    not touch 1-D parameters). The reference's model also draws its other hidden weights with std 0.5/√D and its
    output projections with 0.5/√(D·L): a recipe of its whole GPT (its baseline shares it), not of the Delta
    residual — this backbone keeps timm's init for the shared weights, so a seed pairs DeepDelta with ``standard``.

    Options: ``value``: ``"linear"`` (default, the paper's v = w_v·u), ``"sigmoid"`` (v = 4σ(w_v·x + b_v) on the
    raw stream x, the reference repository's current d_v = 1 file, which differs from the paper's text here) or
    ``"constant"`` (v = 2, that file's opt-in ``ddl_v_dim1_constant``, off by default: no ``value`` layer); ``beta_init``:
    β₀ ∈ [0, 2].

    Level at init: neither the identity nor the standard ViT (β ≈ 1 projects x off k). Weight decay: the (1, D)
    weights are decayed as projection weights (nanoGPT's rule, the paper's §4.1 trainer: AdamW, decay 0.1 on 2-D
    weights), the biases are not. DropPath (the reference has none) drops the branch f before the site
    (``blocks.InnerDropBlock``): a dropped f gives k = 0, so the site is the identity, and a kept f rescaled by
    1/(1 − p) gives the same k, so the skip's eigenvalue stays 1 − β ∈ [−1, 1] (dropping Δ would rescale a kept
    sample's β). ``decompose`` keeps the default (the whole Δ is the branch term, skip 1: the rank-1 skip is not a
    scalar); the diagnostics report β, v and the skip's eigenvalue along k, 1 − β.
    """

    name = "deep_delta"
    paper = "Zhang et al. 2026 (Deep Delta Learning), arXiv 2601.00417"

    def __init__(self, dim: int, *, args: BlockArgs, value: str = "linear", beta_init: float = 1.0) -> None:
        super().__init__(dim, args=args)
        self.value_form = value
        self.beta_init = float(beta_init)
        self.beta = nn.Linear(dim, 1)
        self.value = None if value == "constant" else nn.Linear(dim, 1, bias=value == "sigmoid")

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        check_choice("value", options["value"], VALUES)
        b = options["beta_init"]
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0.0 <= b <= 2.0:
            raise ValueError(f"beta_init={b!r} is not valid for deep_delta; valid: a float in [0, 2] (beta at init; "
                             f"reference 1)")

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        return InnerDropBlock(args, sites=cls.build_sites(args, **options))

    @torch.no_grad()
    def init_weights(self) -> None:
        std = 0.5 / math.sqrt(self.dim)
        self.beta.weight.normal_(0.0, std)
        self.beta.bias.fill_(logit(self.beta_init / 2.0))
        if self.value is not None:
            self.value.weight.normal_(0.0, std)
        if self.value is not None and self.value.bias is not None:
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
        if self.value_form == "linear":
            v = wide(self.value(u))
        elif self.value_form == "sigmoid":
            v = V_SCALE * torch.sigmoid(wide(self.value(x)))
        else:
            v = V_CONSTANT
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
        return f"value={self.value_form}, beta_init={self.beta_init:g}"
