"""Attention Residuals (Kimi Team, "Attention Residuals", technical report, arXiv 2603.15031, 2026)."""

from __future__ import annotations

from typing import Any

import torch
from timm.layers import RmsNorm
from torch import nn

from ..blocks import add_two_site_skeleton
from .base import BlockArgs, ResidualSite, inverse_rms, one_dtype
from .depth import DepthWeights, depth_row, final_args, norm_eps, weighted_sum
from .standard import Standard


class AttnRes(ResidualSite, DepthWeights):
    """Attention Residuals: the input of every **layer** — each attention and each MLP sublayer, as in the paper
    (L = 2·depth layers; its Table 2 counts "L_b = L/2 Transformer blocks") — is a softmax-weighted sum of the
    earlier layers' **outputs**, not a running residual stream:

        h_l = Σ_{i<l} α_{i→l} v_i,   α_{i→l} = softmax_i( w_lᵀ RMSNorm(v_i) ),
        v_0 = the embeddings,  v_i = f_i(h_i) = the output of layer i (Attn(LN h_i) or MLP(LN h_i)),

    with one learned pseudo-query w_l ∈ R^D and one RMSNorm (the keys') per layer, and one more pair for the final
    aggregation h_{L+1} over v_0 … v_L that the final norm and the head read (the paper's "final output layer").
    Every w_l = 0 at init, as the paper requires: uniform weights, h_l = the mean of its sources.

    ``num_blocks`` = N selects **Block AttnRes**: the L layers form N blocks of S = L/N consecutive layers; a block's
    summary b_n is the sum of its layers' outputs (b_0 = the embeddings), and layer i of block n attends over
    [b_0, …, b_{n−1}] plus, from its second layer on, the partial sum b_n^{i−1} of its own block (Eq. 6, Fig. 2);
    the final aggregation reads [b_0, …, b_N]. N = L would be the full form, which is only ``None`` (the default):
    ``num_blocks=L`` is rejected, so two labels are never the same model.

    An instance is one aggregation (``forward(sources) → h``): ``attn_res`` and ``mlp_res`` of each block,
    ``stream.out`` before the head. Level at init: not standard — each input is the *mean* of the sources, i.e. the
    standard stream divided by the number of sources; because every consumer is a scale-invariant norm (the
    sublayers' pre-norms, the final norm), the model equals the standard ViT up to the norms' ε.
    """

    name = "attn_res"
    paper = "Kimi Team 2026, arXiv 2603.15031"
    depth_columns = "source (0 = embeddings; full form: layer output j, block form: block summary j)"

    def __init__(self, dim: int, *, args: BlockArgs, num_blocks: int | None = None) -> None:
        super().__init__(dim, args=args)
        self.query = nn.Parameter(torch.zeros(dim))  # the pseudo-query w_l
        self.key_norm = RmsNorm(dim, eps=norm_eps(args.norm_layer))

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        n, layers = options["num_blocks"], 2 * depth
        valid = ", ".join(str(d) for d in range(1, layers) if layers % d == 0)
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1 or layers % n):
            raise ValueError(f"num_blocks={n!r} must divide the 2·depth = {layers} layers (attention and MLP); "
                             f"valid choices: None (full AttnRes), {valid}")
        if n == layers:  # one layer per block is the full form: two labels would be the same model
            raise ValueError(f"num_blocks={n} (one layer per block) is full AttnRes at depth {depth}: give "
                             f"num_blocks=None; Block AttnRes: {valid}")

    @classmethod
    def block_size(cls, depth: int, num_blocks: int | None) -> int:
        """S, the layers per block: 1 for the full form (every layer output its own source)."""
        return 1 if num_blocks is None else 2 * depth // num_blocks

    @classmethod
    def extent(cls, depth: int, num_blocks: int | None) -> tuple[int, int]:
        """(rows, columns) of the depth-weight matrix: the L layers and the final aggregation × the N + 1 sources."""
        layers = 2 * depth
        return layers + 1, layers // cls.block_size(depth, num_blocks) + 1

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        extent = cls.extent(args.depth, options["num_blocks"])
        sites = []
        for j, sub in enumerate(("attn", "mlp")):
            site = cls(args.dim, args=args, **options)
            site.set_depth(2 * args.layer + j, extent, f"{sub} {args.layer}")
            sites.append(site)
        return AttnResBlock(args, *sites)

    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        out = cls(dim, args=final_args(dim, depth, norm_layer), **options)
        out.set_depth(2 * depth, cls.extent(depth, options["num_blocks"]), "out")
        return AttnResStream(cls.block_size(depth, options["num_blocks"]), out)

    def init_weights(self) -> None:
        nn.init.zeros_(self.query)

    def weights(self, sources: list[torch.Tensor], inv_rms: torch.Tensor | None = None) -> torch.Tensor:
        """α over the sources [v_0, …] (each (B, N, D)): softmax_t(w_lᵀ RMSNorm(v_t)), shape (B, N, t).
        RMSNorm(v)·w = (v·(g ⊙ w)) / rms(v) (g: the norm's weight), so no source is normalised: one
        matrix-vector product each, scaled by ``inv_rms`` (B, N, t) = 1 / rms(v_t), which the caller passes when it
        has it (``BlockSources`` computes each source's once)."""
        return depth_softmax(sources, *self.scoring(sources, inv_rms))[1]

    def scoring(self, sources: list[torch.Tensor], inv_rms: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(the scaled query g ⊙ w in the sources' dtype, the sources' 1 / rms (B, N, t), computed when not given)."""
        if inv_rms is None:
            inv_rms = torch.stack([self.inv_rms(v) for v in sources], dim=-1)
        return (self.key_norm.weight * self.query).to(sources[0].dtype), inv_rms

    def inv_rms(self, v: torch.Tensor) -> torch.Tensor:
        """1 / rms(v) over the last dimension (the key norm's ε): (..., D) -> (...)."""
        return inverse_rms(v, self.key_norm.eps)

    def forward(self, sources: list[torch.Tensor], inv_rms: torch.Tensor | None = None) -> torch.Tensor:
        """h = Σ_t α_t v_t over the sources [v_0, …] (each (B, N, D)); ``inv_rms``: their 1 / rms (B, N, t)."""
        return DepthAttention.apply(*self.scoring(sources, inv_rms), *sources)

    def depth_weights(self, sources: list[torch.Tensor], inv_rms: torch.Tensor | None = None) -> torch.Tensor:
        """This aggregation's row of the depth-weight matrix: α averaged over the batch and tokens."""
        return depth_row(self.weights(sources, inv_rms).mean(dim=(0, 1)), self.depth_extent[1])


def depth_softmax(sources: list[torch.Tensor], query: torch.Tensor,
                  inv_rms: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores v_t · q, α = softmax_t(scores ⊙ inv_rms)), each (B, N, t): one matrix-vector product per source."""
    scores = torch.stack([torch.matmul(v, query) for v in sources], dim=-1)
    return scores, torch.softmax(scores * inv_rms, dim=-1)


class DepthAttention(torch.autograd.Function):
    """``AttnRes.forward`` with its backward written out: h = Σ_t α_t v_t, α = softmax_t((v_t · q) · s_t), for the
    sources v_t (B, N, D), the scaled query q (D,) and the sources' 1 / rms s (B, N, t).

    Backward, with a_t = v_t · ∂h and the softmax's ∂y = α ⊙ (a − Σ α a): ∂v_t = α_t ∂h + (∂y_t s_t) q in one
    multiply and one fused multiply-add per source (autograd took a multiply, an outer product and an accumulation,
    plus a multiply and a sum for a_t), ∂s = ∂y ⊙ (v · q), ∂q = Σ_t v_tᵀ (∂y_t s_t)."""

    @staticmethod
    @one_dtype
    def forward(ctx: Any, query: torch.Tensor, inv_rms: torch.Tensor, *sources: torch.Tensor) -> torch.Tensor:
        scores, alpha = depth_softmax(sources, query, inv_rms)
        ctx.save_for_backward(query, inv_rms, scores, alpha, *sources)
        return weighted_sum(sources, alpha.unsqueeze(-1).unbind(dim=-2))

    @staticmethod
    @torch.autograd.function.once_differentiable
    @one_dtype
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        query, inv_rms, scores, alpha, *sources = ctx.saved_tensors
        a = torch.stack([torch.linalg.vecdot(v, grad) for v in sources], dim=-1)
        dy = alpha * (a - (a * alpha).sum(dim=-1, keepdim=True))
        dscores = dy * inv_rms
        d_sources = [torch.addcmul(grad * w, g, query) for w, g in
                     zip(alpha.unsqueeze(-1).unbind(dim=-2), dscores.unsqueeze(-1).unbind(dim=-2), strict=True)]
        d_query = sum(torch.matmul(g.reshape(1, -1), v.reshape(-1, v.shape[-1]))[0]
                      for g, v in zip(dscores.unbind(dim=-1), sources, strict=True))
        return d_query, dy * scores, *d_sources


class BlockSources:
    """The sources of (Block) AttnRes during one forward: the completed block summaries [b_0 = x_0, b_1, …] and
    the current block's partial sum b_n^i of its layers' outputs. With block size S = 1 every layer output is its
    own summary (the full form: the sources are x_0 and every earlier layer output).

    Each completed summary's 1 / rms (the keys' RMSNorm scale, ``eps``) is computed once, when it completes; the
    partial sum's when it is read."""

    def __init__(self, x0: torch.Tensor, block_size: int, eps: float = 1e-6) -> None:
        self.eps = eps
        self.blocks: list[torch.Tensor] = [x0]
        self.block_inv_rms: list[torch.Tensor] = [inverse_rms(x0, eps)]
        self.partial: torch.Tensor | None = None
        self.block_size = block_size
        self.layers = 0  # layer outputs added so far

    def sources(self) -> list[torch.Tensor]:
        """V for the next layer (Eq. 6): at the first layer of a block the previous block's sum becomes its summary
        b_{n−1}, so V = [b_0, …, b_{n−1}]; later layers of the block also see the partial sum b_n^{i−1}."""
        if self.layers % self.block_size == 0 and self.partial is not None:
            self.blocks.append(self.partial)
            self.block_inv_rms.append(inverse_rms(self.partial, self.eps))
            self.partial = None
        return [*self.blocks] if self.partial is None else [*self.blocks, self.partial]  # a new list

    def inv_rms(self) -> torch.Tensor:
        """1 / rms of each of ``sources()`` (call it after ``sources()``), stacked: (B, N, t)."""
        partial = [] if self.partial is None else [inverse_rms(self.partial, self.eps)]
        return torch.stack([*self.block_inv_rms, *partial], dim=-1)

    def aggregate(self, site: AttnRes) -> torch.Tensor:
        """``site``'s aggregation of the current sources."""
        sources = self.sources()
        return site(sources, self.inv_rms())

    def add(self, f: torch.Tensor) -> None:
        """A layer's output f_l joins the current block's partial sum."""
        self.partial = f if self.partial is None else self.partial + f
        self.layers += 1


class AttnResBlock(nn.Module):
    """A pre-norm ViT block whose two layers read AttnRes aggregations instead of the stream:

        h = attn_res(V);  f_attn = Attn(norm1 h);  V ← V + f_attn;   h = mlp_res(V);  f_mlp = MLP(norm2 h);  V ← …

    ``norm1``, ``attn``, ``norm2``, ``mlp`` keep timm's names (a timm checkpoint loads). DropPath drops a layer's
    output f before it becomes a source. ``ls1``/``ls2`` are standard residual sites (Δ = f): they carry no
    parameters and are called as ``site(h, norm(h), f)`` so that the diagnostics' site hooks see x = h (the
    layer's aggregated input) and the branch f.
    """

    def __init__(self, args: BlockArgs, attn_res: AttnRes, mlp_res: AttnRes) -> None:
        super().__init__()
        self.attn_res, self.mlp_res = attn_res, mlp_res
        self.ls1, self.ls2 = Standard(args.dim, args=args), Standard(args.dim, args=args)
        add_two_site_skeleton(self, args, pre_norm=True)

    def sites(self) -> dict[str, nn.Module]:
        return {"attn": self.ls1, "mlp": self.ls2}

    def forward(self, state: BlockSources) -> BlockSources:
        h = state.aggregate(self.attn_res)
        u = self.norm1(h)
        state.add(self.drop_path1(self.ls1(h, u, self.attn(u))))
        h = state.aggregate(self.mlp_res)
        u = self.norm2(h)
        state.add(self.drop_path2(self.ls2(h, u, self.mlp(u))))
        return state


class AttnResStream(nn.Module):
    """Chains ``AttnResBlock``s over the sources of one forward; the head reads ``out`` (the final aggregation over
    [b_0, …, b_N], or over every layer output in the full form)."""

    def __init__(self, block_size: int, out: AttnRes) -> None:
        super().__init__()
        self.block_size = block_size
        self.out = out

    def forward(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        state = BlockSources(x, self.block_size, self.out.key_norm.eps)
        for blk in blocks:
            state = blk(state)
        return state.aggregate(self.out)
