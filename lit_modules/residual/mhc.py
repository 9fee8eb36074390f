"""mHC: Manifold-Constrained Hyper-Connections (Xie et al., DeepSeek-AI, arXiv 2512.24880). The stream and block
machinery is Hyper-Connections' (``hyper_connections.py``); this module only computes the constrained mixing."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .base import BlockArgs, check_choice, one_dtype
from .hyper_connections import Mixing, MultiStreamSite, StreamGrad, check_positive_int, mixing_stats

RES_INITS = ("paddlefleet_pr1849", "identity", "hc")
RMS_EPS = 1e-6  # ε of the parameter-free RMSNorm of the flattened streams
IDENTITY_TOLERANCE = 1e-5  # res_init="identity": the off-diagonal mass of each row of H_res at init
SINKHORN_FLOOR = -80.0  # logits below their row's maximum by more count as this far (exp stays a normal float32)


def sinkhorn_knopp(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """The paper's Sinkhorn-Knopp projection of ``exp(logits)`` (..., n, n): ``iters`` alternating row and column
    normalisations, rows first (so the columns of the result sum to 1 exactly, the rows to within the method's
    convergence). See ``SinkhornKnopp`` for how."""
    return SinkhornKnopp.apply(logits, iters)


class SinkhornKnopp(torch.autograd.Function):
    """``sinkhorn_knopp`` with a hand-written backward.

    Tokens last, (n, n, ...): each normalisation is two vector operations over all tokens, not a reduction over
    n = 4 values per token (5x faster on a CPU than the (..., n, n) layout). In the exp domain after subtracting
    each row's maximum (Sinkhorn's first row normalisation removes any row scaling, so the iterates are the same
    and that shift has no gradient); a logit more than ``SINKHORN_FLOOR`` below its row's maximum counts as that
    far (exp(−80) is still a normal float32), so that no column can underflow to zero. Backward: for y = x / s,
    s = Σ x along the normalised dim, ∂L/∂x = (∂L/∂y − Σ ∂L/∂y ⊙ y) / s — four operations per normalisation
    where autograd's division and sum took twice as many and most of mHC's backward time; in place on one
    buffer (0.75x the time of allocating each iterate's gradient).
    """

    @staticmethod
    @one_dtype
    def forward(ctx: Any, logits: torch.Tensor, iters: int) -> torch.Tensor:
        z = logits.movedim((-2, -1), (0, 1))
        z = z - z.amax(dim=1, keepdim=True)
        kept = z > SINKHORN_FLOOR
        m = torch.exp(z.clamp(min=SINKHORN_FLOOR)).contiguous()
        saved = [m]
        for _ in range(iters):
            for dim in (1, 0):  # rows, then columns
                total = m.sum(dim=dim, keepdim=True)
                m = m / total
                saved += [m, total]
        ctx.save_for_backward(kept, *saved)
        return m.movedim((0, 1), (-2, -1)).contiguous()  # back to (..., n, n) in memory too: bmm's fast layout

    @staticmethod
    @torch.autograd.function.once_differentiable
    @one_dtype
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        kept, first, *steps = ctx.saved_tensors
        g = grad.movedim((-2, -1), (0, 1)).clone(memory_format=torch.contiguous_format)  # ours: updated in place
        for i in range(len(steps) // 2 - 1, -1, -1):
            m, total = steps[2 * i], steps[2 * i + 1]
            dim = 1 if i % 2 == 0 else 0
            g.sub_((g * m).sum(dim=dim, keepdim=True)).div_(total)
        return g.mul_(first).mul_(kept).movedim((0, 1), (-2, -1)), None


class StreamProjection(torch.autograd.Function):
    """The projection of the flattened streams onto the coefficient logits, x̃φ = (x⃗φ) / rms(x⃗): v (..., nD),
    weight (K, nD) -> (..., K), with the backward written out. The norm scales the (…, K) projection, not the
    (…, nD) input (one ``F.linear`` for the three φ; ``x @ φ`` with a skinny φ is slower on a CPU).

    Backward, with p = vWᵀ, r = (Σv²/nD + ε)^(-1/2), out = p·r: ∂p = g·r, ∂W = ∂pᵀv and
    ∂v = ∂p W + 2·∂s·v with ∂s = −(r³ / 2nD)·Σ_K g ⊙ p. ∂v is added in place to the ``StreamGrad`` of the site's
    read and write (autograd runs this after both: their coefficients come from it), so the stream's gradient is
    one buffer and not three that autograd adds up."""

    @staticmethod
    @one_dtype
    def forward(ctx: Any, v: torch.Tensor, weight: torch.Tensor, eps: float,
                grad_sum: StreamGrad | None) -> torch.Tensor:
        p = F.linear(v, weight)
        # Σv² as a norm, squared: one pass over v (vecdot(v, v) multiplies into a temporary first)
        r = torch.rsqrt(torch.linalg.vector_norm(v, dim=-1).square() / v.shape[-1] + eps)
        ctx.save_for_backward(v, weight, p, r)
        ctx.grad_sum = grad_sum
        return p * r.unsqueeze(-1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    @one_dtype
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        v, weight, p, r = ctx.saved_tensors
        gp = (grad * r.unsqueeze(-1)).reshape(-1, weight.shape[0])
        grad_v = grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = gp.t() @ v.reshape(-1, weight.shape[1])
        if ctx.needs_input_grad[0]:
            gs2 = (grad * p).sum(dim=-1) * r.pow(3) * (-1.0 / v.shape[-1])  # 2·∂s
            total = ctx.grad_sum.take() if ctx.grad_sum is not None else None
            if total is None:
                grad_v = (gp @ weight).view(v.shape)
            else:
                grad_v = total.view(v.shape)
                grad_v.view(-1, weight.shape[1]).addmm_(gp, weight)
            grad_v.addcmul_(v, gs2.unsqueeze(-1))
        return grad_v, grad_w, None, None


def identity_logit(n: int, tolerance: float = IDENTITY_TOLERANCE) -> float:
    """The diagonal logit L of ``b_res = L·I`` whose Sinkhorn projection is I to within ``tolerance``: exp(L·I)
    has equal row and column sums (Sinkhorn leaves it as it is, divided by e^L + n − 1), and with
    L = ln((n − 1)/tolerance) the off-diagonal mass of a row, (n − 1)/(e^L + n − 1), is below ``tolerance``."""
    return math.log(max(n - 1, 1) / tolerance)


class MHC(MultiStreamSite):
    """mHC (Xie et al., DeepSeek-AI, arXiv 2512.24880): Hyper-Connections whose stream mixing is constrained to
    the doubly stochastic matrices (the Birkhoff polytope). With x_l ∈ R^{n×D} the n streams of a token and
    x⃗_l = vec(x_l) ∈ R^{1×nD}, each layer (attention or MLP, pre-norm) computes

        x_{l+1} = H_res x_l + H_postᵀ F(H_pre x_l)
        x̃ = RMSNorm(x⃗_l)   (parameter-free: the paper folds its weight into φ)
        H̃_pre = α_pre · x̃ φ_pre + b_pre,   H̃_post = α_post · x̃ φ_post + b_post,   H̃_res = α_res · mat(x̃ φ_res) + b_res
        H_pre = σ(H̃_pre),   H_post = 2σ(H̃_post),   H_res = SinkhornKnopp(exp(H̃_res), t_max = sinkhorn_iters)

    φ_pre, φ_post ∈ R^{nD×n}, φ_res ∈ R^{nD×n²} (zero at init: a project choice, as HC's W = 0, so the dynamic part
    is off at init), b_pre, b_post ∈ R^{1×n}, b_res ∈ R^{n×n}, and three scalar gates α (``alpha_init``, 0.01 as in
    the paper). Defaults n = 4 and 20 Sinkhorn iterations are the paper's.

    **Init of the biases.** The paper gives none: its only init value is α = 0.01 (Appendix A.1, Table 5, which
    lists n = 4, α = 0.01 and t_max = 20 and nothing on b or φ). ``res_init`` chooses b_res (b_pre and b_post are the
    same for all three; their values share the default's source): ``b_pre = +3`` on the layer's
    home stream k mod n and −3 elsewhere (H_pre ≈ (0.95, 0.05, …), HC's A_m = e_k softened), ``b_post = 0``
    (H_post = 1, HC's B = 1 exactly) and

    - ``"paddlefleet_pr1849"`` (default): ``b_res = 6I − 3``, so H_res has diagonal e⁶/(e⁶ + n − 1) ≈ 0.9926 at
      n = 4 — the static values of PaddlePaddle/PaddleFleet's pull request 1849 ("the paper's A.6 static values"),
      which the paper's text does not contain (named for that source);
    - ``"identity"``: ``b_res = L·I`` with L = ln((n − 1)/10⁻⁵), so H_res = I to within 10⁻⁵; the projection is
      then saturated: ∂H_res/∂H̃_res ~ 10⁻⁵, so b_res and φ_res barely learn (a deliberate trade);
    - ``"hc"``: ``b_res = I`` (HC's A_r = I copied into the logits, as a public port does): **not** the identity
      after Sinkhorn — the diagonal is e/(e + n − 1) ≈ 0.475 at n = 4: every layer averages the streams.

    Every doubly stochastic H_res maps n equal streams to themselves, and the streams start equal with H_post = 1,
    so at init all three equal the standard ViT up to the norms' ε (h = Σ H_pre x = 1.095·x before the pre-norm);
    ``res_init`` decides how strongly the streams mix once they differ. No weight decay on b and α (HC's trap);
    the φ matrices are decayed.
    """

    name = "mhc"
    paper = "Xie et al. 2025, arXiv 2512.24880"

    def __init__(self, dim: int, sublayer: int = 0, *, args: BlockArgs, n: int = 4, sinkhorn_iters: int = 20,
                 alpha_init: float = 0.01, res_init: str = "paddlefleet_pr1849") -> None:
        super().__init__(dim, sublayer, args=args)
        self.n, self.sinkhorn_iters = n, sinkhorn_iters
        self.alpha_init, self.res_init = float(alpha_init), res_init
        self.phi_pre = nn.Parameter(torch.zeros(n * dim, n))
        self.phi_post = nn.Parameter(torch.zeros(n * dim, n))
        self.phi_res = nn.Parameter(torch.zeros(n * dim, n * n))
        self.b_pre = nn.Parameter(torch.zeros(1, n))
        self.b_post = nn.Parameter(torch.zeros(1, n))
        self.b_res = nn.Parameter(torch.zeros(n, n))
        self.alpha_pre = nn.Parameter(torch.zeros(1))
        self.alpha_post = nn.Parameter(torch.zeros(1))
        self.alpha_res = nn.Parameter(torch.zeros(1))
        self.init_weights()

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        super().check_options(options, dim, depth)
        check_positive_int("sinkhorn_iters", options["sinkhorn_iters"], "Sinkhorn-Knopp iterations t_max")
        if options["res_init"] == "paper":
            raise ValueError("res_init='paper' names no init: the mHC paper "
                             "(arXiv 2512.24880) gives no bias init ('paddlefleet_pr1849', b_res = 6I - 3, is the default's source); "
                             "valid choices: " + ", ".join(RES_INITS))
        check_choice("res_init", options["res_init"], RES_INITS)
        alpha = options["alpha_init"]
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
            raise ValueError(f"alpha_init={alpha!r} must be a finite float (the gates α at init; paper: 0.01)")

    def init_weights(self) -> None:
        n = self.n
        with torch.no_grad():
            for phi in (self.phi_pre, self.phi_post, self.phi_res):
                phi.zero_()
            self.b_pre.fill_(-3.0)[0, self.index % n] = 3.0
            self.b_post.zero_()
            eye = torch.eye(n, dtype=self.b_res.dtype)
            self.b_res.copy_({"paddlefleet_pr1849": 6.0 * eye - 3.0, "identity": identity_logit(n) * eye, "hc": eye}[self.res_init])
            for alpha in (self.alpha_pre, self.alpha_post, self.alpha_res):
                alpha.fill_(self.alpha_init)

    def no_weight_decay(self) -> set[str]:
        return {"b_pre", "b_post", "b_res", "alpha_pre", "alpha_post", "alpha_res"}

    def logits(self, x: torch.Tensor, grad_sum: StreamGrad | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(H̃_pre, H̃_post, H̃_res) for the streams x (..., n, D): (..., n), (..., n), (..., n, n). ``grad_sum``:
        the ``StreamGrad`` of the read and write that use these coefficients (None: each returns its own)."""
        v, n = x.flatten(-2), self.n
        weight = torch.cat([self.phi_pre, self.phi_post, self.phi_res], dim=1).t().contiguous()
        proj = StreamProjection.apply(v, weight, RMS_EPS, grad_sum)
        if grad_sum is not None:
            grad_sum.node = proj.grad_fn
        pre = self.alpha_pre * proj[..., :n] + self.b_pre[0]
        post = self.alpha_post * proj[..., n:2 * n] + self.b_post[0]
        res = self.alpha_res * proj[..., 2 * n:].unflatten(-1, (n, n)) + self.b_res
        return pre, post, res

    def mixing(self, x: torch.Tensor) -> Mixing:
        grad_sum = None if torch.compiler.is_compiling() else StreamGrad()  # eager only (see StreamGrad)
        pre, post, res = self.logits(x, grad_sum)
        return Mixing(read=torch.sigmoid(pre), res=sinkhorn_knopp(res, self.sinkhorn_iters),
                      write=2.0 * torch.sigmoid(post), grad=grad_sum)

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Means (over tokens, given a stream x; without x at a zero input, i.e. from the biases alone) of H_pre,
        H_post and the diagonal / off-diagonal of H_res; the three gates α."""
        with torch.no_grad():
            mixing = self.mixing(self.streams_or_zero(x))
            stats = mixing_stats(mixing.read, mixing.res, mixing.write)
            for key in ("alpha_pre", "alpha_post", "alpha_res"):
                stats[key] = getattr(self, key).detach()[0]
        return stats
