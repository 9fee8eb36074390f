"""Orthogonal residual update (Oh, Cho, Kim, Choi & Yu, "Revisiting Residual Connections: Orthogonal Updates for
Stable and Efficient Deep Networks", arXiv 2505.11881, NeurIPS 2025)."""

from __future__ import annotations

from typing import Any

import torch

from .base import BlockArgs, ResidualSite


class Ortho(ResidualSite):
    """Only the part of each branch output orthogonal to the stream is added, per token:

        f = F(Norm(x)),   f_∥ = (⟨x, f⟩ / (‖x‖² + ε)) · x,   x ← x + (f − f_∥),   so  Δ = f_⊥ = f − f_∥

    at both sites of every block (the paper's "Orthogonal-F": the projection over the channel dimension of each
    token, as the reference ViT applies it after the attention and after the MLP). No parameters; ⟨x, Δ⟩ = 0 up
    to ε and rounding, so a site can rotate the stream and grow it (‖x + Δ‖² = ‖x‖² + ‖Δ‖²) but never shrink it
    or push it along itself.

    ``eps`` (ε, default 1e-6: the reference code's ``residual_eps``) is added to ‖x‖². Precision: the reference
    computes ‖x‖², adds ε (an fp32 tensor) and divides in fp32, then casts the coefficient back to the stream's
    dtype; here both reductions ⟨x, f⟩ and ‖x‖² are also accumulated in (at least) fp32 — identical in fp32
    training, more accurate under bf16. DropPath: the reference drops f before projecting; the projection is
    linear in f and DropPath scales a whole sample, so dropping Δ = f_⊥ (this project's convention) is the same.

    Diagnostics (``diagnostics(x, u, f)``): ``parallel_ratio`` = mean over tokens of ‖f_∥‖/‖f‖ (≈ |cos(x, f)|,
    the share of the branch's length the projection removes), ``removed_energy`` = mean ‖f_∥‖²/‖f‖² (the share
    of its squared norm), ``cos_mean`` = mean cos(x, f) (sign: reinforcing > 0, shrinking < 0 the stream).
    """

    name = "ortho"
    paper = "Oh et al. 2025, arXiv 2505.11881"

    def __init__(self, dim: int, *, args: BlockArgs, eps: float = 1e-6) -> None:
        super().__init__(dim, args=args)
        self.eps = float(eps)

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        eps = options["eps"]
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
            raise ValueError(f"eps={eps!r} is not valid for ortho; valid: a float > 0 (the paper's code: 1e-6)")

    def coefficient(self, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """⟨x, f⟩ / (‖x‖² + ε) per token, shape (..., 1), in the stream's dtype (reductions in ≥ fp32)."""
        acc = torch.promote_types(x.dtype, torch.float32)
        xa, fa = x.to(acc), f.to(acc)
        dot = (xa * fa).sum(dim=-1, keepdim=True)
        return (dot / (xa.square().sum(dim=-1, keepdim=True) + self.eps)).to(x.dtype)

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return f - self.coefficient(x, f) * x

    # decompose: the base class's (f_⊥, 1.0) — the branch term is the orthogonal component, the skip is x itself

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if x is None or f is None:
            return {}
        x, f = x.detach(), f.detach()
        acc = torch.promote_types(x.dtype, torch.float32)
        xa, fa = x.to(acc), f.to(acc)
        f_norm = fa.norm(dim=-1).clamp_min(1e-30)
        parallel = (self.coefficient(x, f).to(acc) * xa).norm(dim=-1) / f_norm
        cos = (xa * fa).sum(dim=-1) / (xa.norm(dim=-1).clamp_min(1e-30) * f_norm)
        return {"parallel_ratio": parallel.mean(), "removed_energy": parallel.square().mean(), "cos_mean": cos.mean()}
