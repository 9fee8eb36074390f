"""mHC-lite (Yang & Gao, "mHC-lite: You Don't Need 20 Sinkhorn-Knopp Iterations", arXiv 2601.05732): mHC's doubly
stochastic stream mixing as an exact convex combination of permutation matrices. The stream and block machinery is
Hyper-Connections' (``hyper_connections.py``); ``kromhc.py`` reuses this class with a Kronecker-factored mixing."""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import nn

from .base import BlockArgs, check_choice
from .hyper_connections import Mixing, MultiStream, MultiStreamSite, StreamGrad, mixing_stats
from .mhc import StreamProjection

STREAM_OUTS = ("norm_each", "sum")
HOMES = ("random", "cyclic")
MAX_STREAMS = 6  # n! permutation matrices: 720 at n = 6
RES_OFF = -8.0  # the reference's static logit of every permutation but the identity
PRE_ON, PRE_OFF = 1.0, -1.0  # the reference's static logits of the read (H_pre) and write (H_post) weights


def permutation_matrices(n: int) -> torch.Tensor:
    """The n! permutation matrices (n!, n, n) in ``itertools.permutations`` order (the identity first):
    P_r[i, j] = 1 iff j = π_r(i), as the reference's ``eye[index]``."""
    index = torch.tensor(list(itertools.permutations(range(n))), dtype=torch.long)
    return torch.eye(n, dtype=torch.float64)[index]


class MHCLite(MultiStreamSite):
    """mHC-lite: Hyper-Connections on n streams (x_l ∈ R^{n×D} per token) whose stream mixing is a convex
    combination of the n! permutation matrices — doubly stochastic exactly, without Sinkhorn iterations. Each layer
    (attention or MLP, pre-norm) computes, from x̃ = RMSNorm(vec x_l) (gain 1 + γ, γ ∈ R^{nD} zero at init),

        H_pre = σ(α_pre · x̃φ_pre + b_pre) ∈ R^n,        H_post = 2σ(α_post · x̃φ_post + b_post) ∈ R^n
        a = softmax(α_res · x̃φ_res + b_res) ∈ Δ^{n!},   A = Σ_r a_r P_r,   x_{l+1} = Aᵀ x_l + H_post ⊗ F(H_pre x_l)

    (the reference's ``einsum(alpha, residuals, '... s t, ... s d -> ... t d')``: output stream t = Σ_s A[s, t] x_s,
    so ``Mixing.res`` = Aᵀ). φ_pre, φ_post ∈ R^{nD×n}, φ_res ∈ R^{nD×n!} (zero at init), three scalar gates α
    (``alpha_init``, 0.01). Init of the static logits (the reference's): b_pre = b_post = +1 on the layer's home
    stream and −1 elsewhere (H_pre = σ(±1) = 0.73 / 0.27, H_post = 2σ(±1) = 1.46 / 0.54), b_res = 0 for the
    identity and −8 for every other permutation (A = I up to e⁻⁸ leakage). The streams therefore start equal but
    differ after the first layer (the home stream gets 1.46·F, the others 0.54·F): the model is not the standard ViT
    at init. ``home``: ``"random"`` (default) — each layer's home stream drawn uniformly at init, one draw for both
    b_pre and b_post (the reference's ``randrange(n)``: its ``model.py`` passes no ``layer_index``), here from the
    model's init seed, so a seed gives the same homes; ``"cyclic"`` — stream k mod n (k = 2·block + sublayer),
    Hyper-Connections' rule when a layer index is given.

    Reference: FFTYYY/mhc-lite ``hyper_conn/mhc_lite.py`` (``MHCLite``), its ``model.py`` for the stream ends:
    the embedding is copied into n streams, and after the last block **each stream is normalised and the n are
    summed** (``stream_out="norm_each"``, the default; ``"sum"`` sums first and lets the backbone's final norm
    normalise the sum, as ``hyper_connections``/``mhc`` do). Options: ``n`` (4, the paper's; 2 … 6: n! matrices;
    the reference's n = 1 is the plain residual, ``standard`` here), ``alpha_init``, ``stream_out``, ``home``.
    Weight decay: the static logits, γ and the α are never decayed (HC's trap), φ is (the reference's 2-D-only rule
    gives the same split).
    """

    name = "mhc_lite"
    paper = "Yang & Gao 2026 (mHC-lite), arXiv 2601.05732"

    def __init__(self, dim: int, sublayer: int = 0, *, args: BlockArgs, n: int = 4, alpha_init: float = 0.01,
                 stream_out: str = "norm_each", home: str = "random") -> None:
        super().__init__(dim, sublayer, args=args)
        self.n, self.alpha_init, self.home = n, float(alpha_init), home
        r = self.res_size()
        self.gamma = nn.Parameter(torch.zeros(n * dim))
        self.phi_pre = nn.Parameter(torch.zeros(n * dim, n))
        self.phi_res = nn.Parameter(torch.zeros(n * dim, r))
        self.phi_post = nn.Parameter(torch.zeros(n * dim, n))
        self.b_pre = nn.Parameter(torch.zeros(n))
        self.b_res = nn.Parameter(torch.zeros(r))
        self.b_post = nn.Parameter(torch.zeros(n))
        self.alpha_pre = nn.Parameter(torch.zeros(1))
        self.alpha_res = nn.Parameter(torch.zeros(1))
        self.alpha_post = nn.Parameter(torch.zeros(1))
        for key, value in self.mixing_constants().items():  # constants of the mixing, rebuilt with the model
            self.register_buffer(key, value, persistent=False)
        self.init_weights()

    # --- what KromHC changes ---------------------------------------------------------------------------------------
    def res_size(self) -> int:
        """Number of residual-mixing logits: n! (one per permutation)."""
        return math.factorial(self.n)

    def mixing_constants(self) -> dict[str, torch.Tensor]:
        """Buffers the mixing needs: the transposed permutation matrices P_rᵀ (n!, n, n)."""
        return {"perms_t": permutation_matrices(self.n).transpose(-1, -2).contiguous().to(torch.get_default_dtype())}

    @classmethod
    def check_streams(cls, n: int) -> None:
        if n == 1:
            raise ValueError(f"n=1 is not valid for {cls.name}: one stream is the plain residual in the reference "
                             f"(residual standard); valid: 2..{MAX_STREAMS}")
        if n > MAX_STREAMS:
            raise ValueError(f"n={n} is not valid for {cls.name}: it mixes the n! permutation matrices; "
                             f"valid: 2..{MAX_STREAMS}")

    def res_logits_init(self) -> torch.Tensor:
        """b_res at init: 0 for the identity permutation (the first), −8 for the others."""
        b = torch.full((self.res_size(),), RES_OFF)
        b[0] = 0.0
        return b

    def residual_matrix(self, logits: torch.Tensor) -> torch.Tensor:
        """``Mixing.res`` (row = output stream) from the residual logits (..., R): Aᵀ = Σ_r softmax(·)_r P_rᵀ."""
        coeffs = torch.softmax(logits, dim=-1)
        return torch.einsum("...r,rij->...ij", coeffs, self.perms_t.to(coeffs.dtype))

    # --- shared ----------------------------------------------------------------------------------------------------
    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        super().check_options(options, dim, depth)
        cls.check_streams(options["n"])
        check_choice("stream_out", options["stream_out"], STREAM_OUTS)
        check_choice("home", options["home"], HOMES)
        alpha = options["alpha_init"]
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise ValueError(f"alpha_init={alpha!r} must be a finite float (the gates α at init; reference 0.01)")

    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        if options["stream_out"] == "sum":
            return MultiStream(options["n"])
        return NormEachStream(options["n"], norm_layer(dim))

    @classmethod
    def uses_final_norm(cls, **options: Any) -> bool:
        return options["stream_out"] == "sum"  # norm_each: the streams are already normalised before their sum

    def init_weights(self) -> None:
        home = int(torch.randint(self.n, (), device="cpu")) if self.home == "random" else self.index % self.n
        with torch.no_grad():
            for p in (self.gamma, self.phi_pre, self.phi_res, self.phi_post):
                p.zero_()
            for b in (self.b_pre, self.b_post):
                b.fill_(PRE_OFF)[home] = PRE_ON
            self.b_res.copy_(self.res_logits_init())
            for alpha in (self.alpha_pre, self.alpha_res, self.alpha_post):
                alpha.fill_(self.alpha_init)

    def no_weight_decay(self) -> set[str]:
        return {"gamma", "b_pre", "b_res", "b_post", "alpha_pre", "alpha_res", "alpha_post"}

    def logits(self, x: torch.Tensor, grad_sum: StreamGrad | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The (pre, res, post) logits for the streams x (..., n, D): x̃ = √(nD)·vec(x)/‖vec(x)‖ ⊙ (1 + γ) (the
        reference's ``F.normalize(x)·√(nD)·(γ + 1)``), then α·x̃φ + b for each."""
        v, n = x.flatten(-2), self.n
        weight = torch.cat([self.phi_pre, self.phi_res, self.phi_post], dim=1) * (1.0 + self.gamma).unsqueeze(-1)
        eps = 1e-24 / v.shape[-1]  # √(nD)·v/√(‖v‖² + 10⁻²⁴): F.normalize's clamp of ‖v‖ at 10⁻¹², smoothly
        proj = StreamProjection.apply(v, weight.t().contiguous(), eps, grad_sum)
        if grad_sum is not None:
            grad_sum.node = proj.grad_fn
        r = self.res_size()
        pre = self.alpha_pre * proj[..., :n] + self.b_pre
        res = self.alpha_res * proj[..., n:n + r] + self.b_res
        post = self.alpha_post * proj[..., n + r:] + self.b_post
        return pre, res, post

    def mixing(self, x: torch.Tensor) -> Mixing:
        grad_sum = None if torch.compiler.is_compiling() else StreamGrad()  # eager only (see StreamGrad)
        pre, res, post = self.logits(x, grad_sum)
        return Mixing(read=torch.sigmoid(pre), res=self.residual_matrix(res), write=2.0 * torch.sigmoid(post),
                      grad=grad_sum)

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Token means of H_pre, H_post and the diagonal / off-diagonal of the mixing; the three gates α."""
        with torch.no_grad():
            mixing = self.mixing(self.streams_or_zero(x))
            stats = mixing_stats(mixing.read, mixing.res, mixing.write)
            for key in ("alpha_pre", "alpha_res", "alpha_post"):
                stats[key] = getattr(self, key).detach()[0]
        return stats


class NormEachStream(MultiStream):
    """The n-stream residual whose end normalises each stream and sums them (the mHC-lite / KromHC reference's
    ``ln_f`` on the (batch·streams) layout, then the sum): Σ_i Norm(H_i), one norm shared by the streams
    (``stream.norm``). The backbone's final norm is dropped (``uses_final_norm``)."""

    def __init__(self, n: int, norm: nn.Module) -> None:
        super().__init__(n)
        self.norm = norm

    def forward(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        h = x.unsqueeze(-2).expand(*x.shape[:-1], self.n, x.shape[-1]).contiguous()
        for blk in blocks:
            h = blk(h)
        return self.norm(h).sum(dim=-2)
