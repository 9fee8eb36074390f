"""Hyper-Connections (Zhu et al., "Hyper-Connections", ICLR 2025, arXiv 2409.19606) and the machinery of every
multi-stream residual: the stream of n copies that is expanded before the first block and summed after the last
(``MultiStream``), the block whose two sites read from and write to the n streams (``HyperBlock``) and the base
class of such a site (``MultiStreamSite``). ``mhc.py`` (DeepSeek's manifold-constrained form) reuses all three and
only says how its mixing coefficients are computed.
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..blocks import add_two_site_skeleton
from .base import BlockArgs, ResidualSite, one_dtype
from .stream_kernels import EAGER, Kernels, kernels

#: the engine's "will this node run in the backward under way" (private; None on a torch without it)
_WILL_EXECUTE = getattr(torch._C, "_will_engine_execute_node", None)


class StreamGrad:
    """One buffer for ∂L/∂H of a site's streams H, which three operations of the site read: the mixing's
    projection, the read h = readᵀ H and the write res · H + write ⊗ f. Autograd would give each its own
    (T, n, D) gradient and add the three (two more passes over the n-fold stream and three fresh buffers); instead
    the write's and the read's backward ``take`` the buffer, pass it to their kernel, which adds its term (in
    place in the eager kernels), ``add`` the result back and return no gradient for H, and the projection's
    backward, which autograd runs after both (the coefficients it computes are inputs of both), ``take``s the
    buffer, adds its own term in place and returns the sum for H.

    Only a mixing whose coefficients come out of one autograd Function that reads H and ``take``s this buffer may
    carry one (``Mixing.grad``; mHC's ``StreamProjection``): any other leaves ``grad`` None and every operation
    returns its own gradient. Eager mode only: a compiled model (``torch.compile``) cannot trace this side channel
    between backward calls, so mHC builds none while compiling."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self._node: weakref.ref | None = None

    @property
    def node(self) -> Any:
        """The autograd node of the projection that takes the buffer (set after its forward; None once the graph is
        gone). Held weakly: that node's context holds this object, and on torch 2.14 a node's Python object keeps
        its C++ node alive, so a strong reference back made a cycle the garbage collector cannot see through —
        every backward graph of mHC stayed alive (~50 MB a step at the bench's size, each new step's memory then
        fresh pages from the kernel)."""
        return None if self._node is None else self._node()

    @node.setter
    def node(self, value: Any) -> None:
        self._node = None if value is None else weakref.ref(value)

    def active(self) -> bool:
        """Whether the projection that takes this buffer runs in the backward pass under way: not for a backward
        that stops short of it (``torch.autograd.grad`` with ``inputs=`` that need only the coefficients'
        parameters, or coefficients computed without grad), where the buffer would be left with a stale term.
        Asks the engine (``torch._C._will_engine_execute_node``, what ``torch.utils.checkpoint`` uses); a torch
        without it gets no buffer (each operation returns its own gradient, as autograd would)."""
        return self.node is not None and _WILL_EXECUTE is not None and _WILL_EXECUTE(self.node)

    def add(self, fresh: torch.Tensor) -> None:
        """Add a term no one else holds (it may become the buffer itself)."""
        if self.total is None:
            self.total = fresh
        else:
            self.total.add_(fresh)

    def take(self) -> torch.Tensor | None:
        """The sum so far (None if nothing was added), leaving the buffer empty for another backward pass."""
        total, self.total = self.total, None
        return total


class Mixing(NamedTuple):
    """The coefficients of one multi-stream site for one input, in the form ``h = readᵀ H``,
    ``H' = res · H + write ⊗ T(h)`` (H: the n streams of a token, rows = streams).

    Shapes: ``read``, ``write`` (n,) or (..., n); ``res`` (n, n) or (..., n, n), row i = output stream i (mHC's
    H_res; Hyper-Connections' A_rᵀ). ``grad``: where the read and the write put their gradient for H
    (``StreamGrad``), or None."""

    read: torch.Tensor
    res: torch.Tensor
    write: torch.Tensor
    grad: StreamGrad | None = None


class StreamRead(torch.autograd.Function):
    """h = readᵀ H for every token: H (T, n, D), read (T, n) -> (T, D), with the backward written out: ∂H = read ⊗ ∂h,
    ∂read = Σ_D H ⊙ ∂h. ``kernels``: which implementation of the two passes (``stream_kernels``). Autograd through
    ``torch.matmul`` of per-token n-wide matrices took bmm's per-entry path in backward (a copy and a select per
    token: most of Hyper-Connections' and mHC's overhead on a CPU). With a ``StreamGrad`` (``grad_sum``) ∂H goes
    into it and H gets no gradient of its own."""

    @staticmethod
    @one_dtype
    def forward(ctx: Any, x: torch.Tensor, read: torch.Tensor, grad_sum: StreamGrad | None = None,
                kernels: Kernels = EAGER) -> torch.Tensor:
        x, read = x.contiguous(), read.contiguous()
        ctx.save_for_backward(x, read)
        ctx.grad_sum, ctx.kernels = grad_sum, kernels
        return kernels.read_forward(x, read)

    @staticmethod
    @torch.autograd.function.once_differentiable
    @one_dtype
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor, None, None]:
        x, read = ctx.saved_tensors
        into = into_stream_grad(ctx)
        total = None if into is None else into.take()
        grad_x, grad_read = ctx.kernels.read_backward(x, read, grad.contiguous(), total, ctx.needs_input_grad[0])
        if into is not None:
            into.add(grad_x)
            grad_x = None
        return grad_x, grad_read, None, None


class StreamWrite(torch.autograd.Function):
    """Δ = M·H + write ⊗ f for every token: H (T, n, D), M (T, n, n), write (T, n), f (T, D) -> (T, n, D), with
    the backward written out (see ``StreamRead``): ∂H = Mᵀ·G, ∂M = G·Hᵀ, ∂write = Σ_D G ⊙ f, ∂f = Σ_n write ⊙ G.
    With a ``StreamGrad`` (``grad_sum``) ∂H goes into it."""

    @staticmethod
    @one_dtype
    def forward(ctx: Any, x: torch.Tensor, mix: torch.Tensor, write: torch.Tensor, f: torch.Tensor,
                grad_sum: StreamGrad | None = None, kernels: Kernels = EAGER) -> torch.Tensor:
        x, mix, write, f = x.contiguous(), mix.contiguous(), write.contiguous(), f.contiguous()
        ctx.save_for_backward(x, mix, write, f)
        ctx.grad_sum, ctx.kernels = grad_sum, kernels
        return kernels.write_forward(x, mix, write, f)

    @staticmethod
    @torch.autograd.function.once_differentiable
    @one_dtype
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, mix, write, f = ctx.saved_tensors
        into = into_stream_grad(ctx)
        total = None if into is None else into.take()
        grad_x, *rest = ctx.kernels.write_backward(x, mix, write, f, grad.contiguous(), total, ctx.needs_input_grad[0])
        if into is not None:
            into.add(grad_x)
            grad_x = None
        return grad_x, *rest, None, None


def into_stream_grad(ctx: Any) -> StreamGrad | None:
    """The ``StreamGrad`` a read's or write's backward adds ∂H to (None: it returns ∂H itself)."""
    grad_sum = ctx.grad_sum
    if ctx.needs_input_grad[0] and grad_sum is not None and grad_sum.active():
        return grad_sum
    return None


class MultiStreamSite(ResidualSite):
    """A residual site on a stream of n copies ``H ∈ R^{n×D}`` per token. Each site (attention or MLP, a "layer"
    T of the papers) reads ``h = readᵀ H``, runs the pre-norm sublayer ``f = F(Norm h)`` and writes
    ``H' = res · H + write ⊗ f``; subclasses say how ``mixing(H)`` computes (read, res, write).

    The site's update is ``Δ = H' − H`` (so DropPath with p = 1 leaves H unchanged, the project's convention).
    ``sublayer`` (0: attention, 1: MLP) and the block index give the site's layer index ``k = 2·layer + sublayer``.

    Diagnostics view the n streams through their mean (``stream_view``): at init every stream equals the standard
    ViT's stream, and the head reads ``Norm(Σ_i H_i)``, the same as ``Norm(mean_i H_i)`` up to the norm's ε.
    ``decompose`` returns the branch term ``write ⊗ f`` and, per source stream j, the skip factor
    ``Σ_i res_ij`` (column sums), so that in the stream view ``Δ = branch + (skip − 1) ⊙ H`` holds exactly.

    ``stream_kernels`` ("eager" or "compiled", set by ``VisionTransformer.set_stream_kernels``) says which
    implementation of the per-token passes runs (``stream_kernels.py``): the same function either way.
    """

    n: int  # the number of streams (set by the subclass from its option ``n``)
    stream_kernels: str = "eager"

    def __init__(self, dim: int, sublayer: int = 0, *, args: BlockArgs) -> None:
        super().__init__(dim, args=args)
        self.index = 2 * args.layer + sublayer  # the paper's layer k (attention and MLP are separate layers)

    # --- what a subclass provides -------------------------------------------------------------------------------
    def mixing(self, x: torch.Tensor) -> Mixing:
        """(read, res, write) for the streams ``x`` (..., n, D)."""
        raise NotImplementedError

    # --- the formula --------------------------------------------------------------------------------------------
    def read(self, x: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        """h = readᵀ H: (..., n, D) -> (..., D)."""
        tokens = x.shape[:-2]
        read = mixing.read.expand(*tokens, self.n)  # a static site's (n,) for every token: its gradient sums them
        return StreamRead.apply(x.reshape(-1, self.n, x.shape[-1]), read.reshape(-1, self.n),
                                mixing.grad, self.kernels()).view(*tokens, -1)

    def write(self, x: torch.Tensor, f: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        """H' = res · H + write ⊗ f, in one pass (``HyperBlock``'s step: the new streams without forming Δ)."""
        return self._stream_write(x, f, mixing.res, mixing.write, mixing.grad)

    def update(self, x: torch.Tensor, f: torch.Tensor, mixing: Mixing) -> torch.Tensor:
        """Δ = H' − H = (res − I) · H + write ⊗ f: the identity comes off the small n×n matrices, not off H."""
        eye = torch.eye(self.n, dtype=mixing.res.dtype, device=mixing.res.device)
        return self._stream_write(x, f, mixing.res - eye, mixing.write, mixing.grad)

    def _stream_write(self, x: torch.Tensor, f: torch.Tensor, mix: torch.Tensor, write: torch.Tensor,
                      grad_sum: StreamGrad | None) -> torch.Tensor:
        """M · H + write ⊗ f for every token (``StreamWrite``); a static site's (n, n) and (n,) serve every token."""
        tokens, n = x.shape[:-2], self.n
        mix = mix.expand(*tokens, n, n).reshape(-1, n, n)
        write = write.expand(*tokens, n).reshape(-1, n)
        return StreamWrite.apply(x.reshape(-1, n, x.shape[-1]), mix, write, f.reshape(-1, f.shape[-1]),
                                 grad_sum, self.kernels()).view(x.shape)

    def kernels(self) -> Kernels:
        return kernels(self.stream_kernels)

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None, *,
                mixing: Mixing | None = None) -> torch.Tensor:
        """Δ = H' − H for the streams x (..., n, D) and the branch output f (..., D). ``mixing``: the coefficients
        the block already computed from x to read h (recomputed when absent: they depend on x only)."""
        # x may be a hook's replacement of the streams the coefficients came from: it gets its own gradient
        mixing = self.mixing(x) if mixing is None else mixing._replace(grad=None)
        return self.update(x, f, mixing)

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mixing = self.mixing(x)
        branch = mixing.write.unsqueeze(-1) * f.unsqueeze(-2)
        skip = mixing.res.sum(dim=-2).unsqueeze(-1)  # column sums: how much of source stream j the skip keeps
        return branch, skip.expand(*x.shape[:-1], 1)

    def stream_view(self, t: torch.Tensor) -> torch.Tensor:
        """The mean over the n streams: what the diagnostics call the stream (see the class docstring)."""
        return t.mean(dim=-2)

    def stream_mixing(self, x: torch.Tensor | None = None) -> torch.Tensor:
        """The n×n stream-mixing matrix ``res`` (row i = output stream i), averaged over the batch and tokens of
        ``x`` for the input-dependent forms (without x: at a zero input); the factor this site contributes to the
        composite gain."""
        res = self.mixing(self.streams_or_zero(x)).res.detach()
        return res.reshape(-1, *res.shape[-2:]).mean(dim=0)

    def streams_or_zero(self, x: torch.Tensor | None) -> torch.Tensor:
        """``x``, or a zero input (n, D) on the site's device and dtype: the coefficients from the biases alone."""
        if x is not None:
            return x
        p = next(self.parameters())
        return torch.zeros(self.n, self.dim, device=p.device, dtype=p.dtype)

    # --- construction hooks -------------------------------------------------------------------------------------
    @classmethod
    def build_sites(cls, args: BlockArgs, **options: Any) -> tuple[nn.Module, nn.Module]:
        return cls(args.dim, 0, args=args, **options), cls(args.dim, 1, args=args, **options)

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        return HyperBlock(args, sites=cls.build_sites(args, **options))

    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        return MultiStream(options["n"])

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        check_positive_int("n", options["n"], "the expansion rate: number of residual streams")


def check_positive_int(name: str, value: Any, what: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer ({what})")


class HyperBlock(nn.Module):
    """A pre-norm ViT block on the n-stream residual: at each of its two sites (``ls1`` attention, ``ls2`` MLP)

        (read, res, write) = site.mixing(H),   h = readᵀ H,   f = F(Norm h),   H ← res·H + write ⊗ DropPath(f)

    with timm's sublayer names (norm1, attn, norm2, mlp), so a timm checkpoint's weights load. A forward hook on a
    site sees inputs (H, u, f) and returns Δ (the coefficients are passed as a keyword)."""

    def __init__(self, args: BlockArgs, sites: tuple[MultiStreamSite, MultiStreamSite]) -> None:
        super().__init__()
        self.ls1, self.ls2 = sites
        add_two_site_skeleton(self, args, pre_norm=True)

    def sites(self) -> dict[str, nn.Module]:
        return {"attn": self.ls1, "mlp": self.ls2}

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        x = self._step(self.ls1, self.norm1, self.attn, self.drop_path1, x)
        return self._step(self.ls2, self.norm2, self.mlp, self.drop_path2, x)

    @staticmethod
    def _step(site: MultiStreamSite, norm: nn.Module, branch: nn.Module, drop_path: nn.Module,
              x: torch.Tensor) -> torch.Tensor:
        """H' = res·H + write ⊗ DropPath(f). DropPath drops the layer's output only, as the paper's Algorithm 3
        does (dropout(h) before the depth connection): the stream mixing always applies (dropping all of Δ would
        rescale the mixing of kept samples to I + (res − I)/(1 − p), no longer doubly stochastic for mHC).

        H' is written in one pass (``site.write``). A site with forward hooks (the diagnostics) is called as a
        module instead, so that its hooks see (H, u, f) -> Δ like every residual site's; H + Δ is the same H' up
        to rounding. Forming Δ and adding H back costs two passes over the n-fold stream (~6% of mHC's step)."""
        mixing = site.mixing(x)
        u = norm(site.read(x, mixing))
        f = drop_path(branch(u))
        if site._forward_hooks or site._forward_pre_hooks:
            return x + site(x, u, f, mixing=mixing)
        return site.write(x, f, mixing)


class MultiStream(nn.Module):
    """The n-stream residual: the block input is copied into n streams, the blocks update them, and the streams
    are summed after the last block (before the final norm), as in both papers."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        # materialised once: the first site's projection, read and write would each copy an expanded view
        h = x.unsqueeze(-2).expand(*x.shape[:-1], self.n, x.shape[-1]).contiguous()
        for blk in blocks:
            h = blk(h)
        return h.sum(dim=-2)


class HyperConnections(MultiStreamSite):
    """Hyper-Connections (Zhu et al., ICLR 2025, arXiv 2409.19606). The residual stream becomes n copies
    ``H ∈ R^{n×D}`` per token; each layer T (attention or MLP, pre-norm: T(h) = F(Norm h)) reads and writes

        h = A_mᵀ H,      H' = A_rᵀ H + Bᵀ T(h),      A_m ∈ R^{n×1}, A_r ∈ R^{n×n}, B ∈ R^{1×n}

    (width connections A_m, A_r; depth connection B). **Static** (SHC, ``dynamic=False``): A_m, A_r, B are learned
    parameters. **Dynamic** (DHC, ``dynamic=True``, the default: the paper's main form, e.g. OLMo-DHC×4), with
    H̄ = Norm(H) row-wise (the backbone's norm layer; the paper uses LayerNorm):

        A_m(H) = A_m + s_α · tanh(H̄ W_m),   A_r(H) = A_r + s_α · tanh(H̄ W_r),   B(H) = B + s_β · tanh(H̄ W_β)ᵀ

    with W_m, W_β ∈ R^{D×1}, W_r ∈ R^{D×n} (zero at init) and learned scalars s_α, s_β (0.01 at init), per token.
    Init (the paper's): ``A_m = e_{k mod n}`` for layer k (k = 2·block + sublayer), ``A_r = I``, ``B = 1``: every
    stream stays a copy of the standard pre-norm residual stream, and the sum of the n streams before the final
    norm is n× it, so the model equals the standard ViT up to the final norm's ε (exactly for n = 1).
    ``n``: the expansion rate, default 2: the paper's ViT experiments (Appendix E.2: "using an expansion rate of
    n = 2", ViT-B/16 and ViT-L/16 on ImageNet); n = 4 is its language-model rate (OLMo/OLMoE-DHC×4, and mHC's).
    Weight decay: none on the static A_m, A_r, B and the scales s_α, s_β (dynamic HC in a ViT diverged to NaN when
    they were decayed: the paper's first author's advice in github.com/lucidrains/hyper-connections/issues/4); the W matrices
    are decayed like any matrix.
    """

    name = "hyper_connections"
    paper = "Zhu et al. 2025, arXiv 2409.19606"

    def __init__(self, dim: int, sublayer: int = 0, *, args: BlockArgs, n: int = 2, dynamic: bool = True) -> None:
        super().__init__(dim, sublayer, args=args)
        self.n, self.dynamic = n, dynamic
        self.a_m = nn.Parameter(torch.zeros(n, 1))
        self.a_r = nn.Parameter(torch.zeros(n, n))
        self.b = nn.Parameter(torch.zeros(1, n))
        if dynamic:
            self.dyn_norm = args.norm_layer(dim)
            self.w_m = nn.Parameter(torch.zeros(dim, 1))
            self.w_r = nn.Parameter(torch.zeros(dim, n))
            self.w_b = nn.Parameter(torch.zeros(dim, 1))
            self.s_alpha = nn.Parameter(torch.zeros(1))
            self.s_beta = nn.Parameter(torch.zeros(1))
        self.init_weights()

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        super().check_options(options, dim, depth)
        if not isinstance(options["dynamic"], bool):
            raise ValueError(f"dynamic={options['dynamic']!r} is not valid; valid choices: True (DHC), False (SHC)")

    def init_weights(self) -> None:
        with torch.no_grad():
            self.a_m.zero_()[self.index % self.n, 0] = 1.0
            self.a_r.copy_(torch.eye(self.n))
            self.b.fill_(1.0)
            if self.dynamic:
                for w in (self.w_m, self.w_r, self.w_b):
                    w.zero_()
                self.s_alpha.fill_(0.01)
                self.s_beta.fill_(0.01)

    def no_weight_decay(self) -> set[str]:
        return {"a_m", "a_r", "b"} | ({"s_alpha", "s_beta"} if self.dynamic else set())

    def coefficients(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The paper's (A_m, A_r, B) for the streams x (..., n, D): (n,), (n, n), (n,) for SHC; per token for DHC."""
        a_m, a_r, b = self.a_m[:, 0], self.a_r, self.b[0]
        if not self.dynamic:
            return a_m, a_r, b
        # as F.linear's (n + 2, D) weight: x @ W with a (D, n + 2) W is ~3x slower on a CPU (a skinny GEMM)
        weight = torch.cat([self.w_m, self.w_r, self.w_b], dim=1).t().contiguous()
        t = torch.tanh(F.linear(self.dyn_norm(x), weight))
        return (a_m + self.s_alpha * t[..., 0], a_r + self.s_alpha * t[..., 1:1 + self.n],
                b + self.s_beta * t[..., -1])

    def mixing(self, x: torch.Tensor) -> Mixing:
        a_m, a_r, b = self.coefficients(x)
        # contiguous: a transposed view of per-token matrices sends bmm to a per-token copy
        return Mixing(read=a_m, res=a_r.transpose(-1, -2).contiguous(), write=b)

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Means (over tokens, for DHC with a stream x; without x at a zero input) of the read weights A_m, the
        write weights B and the diagonal / off-diagonal of A_r; s_α, s_β for DHC."""
        with torch.no_grad():
            a_m, a_r, b = self.coefficients(self.streams_or_zero(x))
            stats = mixing_stats(a_m, a_r, b)
            if self.dynamic:
                stats |= {"s_alpha": self.s_alpha.detach()[0], "s_beta": self.s_beta.detach()[0]}
        return stats


def mixing_stats(read: torch.Tensor, res: torch.Tensor, write: torch.Tensor) -> dict[str, torch.Tensor]:
    """``pre_mean`` (mean read weight), ``post_mean`` (mean write weight), ``res_diag_mean`` and
    ``res_offdiag_mean`` of the stream-mixing matrix (the diagonal is the same for A_r and A_rᵀ)."""
    n = res.shape[-1]
    diag = res.diagonal(dim1=-2, dim2=-1).mean()
    off = (res.sum(dim=(-2, -1)).mean() - diag * n) / max(n * (n - 1), 1)
    return {"pre_mean": read.mean(), "post_mean": write.mean(), "res_diag_mean": diag, "res_offdiag_mean": off}
