"""KromHC (Zhou, Gu, Iacovides & Mandic, "KromHC: Manifold-Constrained Hyper-Connections with Kronecker-Product
Residual Matrices", arXiv 2601.21579): mHC-lite's machinery (``mhc_lite.py``) with the stream mixing a Kronecker
product of 2×2 doubly stochastic factors."""

from __future__ import annotations

import torch

from .mhc_lite import RES_OFF, MHCLite


class KromHC(MHCLite):
    """KromHC: as ``mhc_lite`` (n streams, H_pre = σ(·), H_post = 2σ(·), the same RMSNorm, φ, α, static-logit init
    and stream ends), except the residual mixing. For n = 2^K streams it is the Kronecker product of K doubly
    stochastic 2×2 factors, each a convex combination of the two 2×2 permutations (identity and swap):

        p_k = softmax(α_res · x̃φ_res + b_res)_{k, identity}   (two logits per factor, 2K in all)
        U_k = [[p_k, 1 − p_k], [1 − p_k, p_k]],     A = U_1 ⊗ U_2 ⊗ ⋯ ⊗ U_K

    doubly stochastic exactly (a Kronecker product of doubly stochastic matrices is), with 2K logits where mHC-lite
    needs n! (n = 4: 4 instead of 24). Init (the reference's): b_res = (0, −8) per factor (U_k = I up to e⁻⁸).
    Reference: wz1119/KromHC ``hyper_conn/Kromhc.py`` (``KromHC._build_kronecker_hres``, the all-2×2 branch; the
    reference asserts n is a power of 2 and so does this class). Options as ``mhc_lite``; ``n`` must be 2, 4, 8, …
    """

    name = "kromhc"
    paper = "Zhou et al. 2026 (KromHC), arXiv 2601.21579"

    @property
    def factors(self) -> int:
        return self.n.bit_length() - 1

    def res_size(self) -> int:
        return 2 * self.factors

    def mixing_constants(self) -> dict[str, torch.Tensor]:
        return {}

    @classmethod
    def check_streams(cls, n: int) -> None:
        if n < 2 or n & (n - 1):
            raise ValueError(f"n={n} is not valid for kromhc: the mixing is a Kronecker product of 2x2 factors; "
                             f"valid: a power of 2 >= 2 (2, 4, 8, ...)")

    def res_logits_init(self) -> torch.Tensor:
        b = torch.full((self.factors, 2), RES_OFF)
        b[:, 0] = 0.0
        return b.flatten()

    def residual_matrix(self, logits: torch.Tensor) -> torch.Tensor:
        """Aᵀ for the logits (..., 2K): U_k from the softmax over each factor's pair, A = U_1 ⊗ ⋯ ⊗ U_K."""
        p = torch.softmax(logits.unflatten(-1, (self.factors, 2)), dim=-1)[..., 0]  # (..., K)
        q = 1.0 - p
        factors = torch.stack([torch.stack([p, q], dim=-1), torch.stack([q, p], dim=-1)], dim=-2)  # (..., K, 2, 2)
        result = factors[..., 0, :, :]
        for k in range(1, self.factors):
            u = factors[..., k, :, :]
            size = result.shape[-1] * 2
            result = (result[..., :, None, :, None] * u[..., None, :, None, :]).reshape(*result.shape[:-2], size, size)
        return result.transpose(-1, -2)
