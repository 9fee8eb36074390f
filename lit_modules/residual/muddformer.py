"""MUDDFormer: MUltiway Dynamic Dense connections (Xiao et al., "MUDDFormer: Breaking Residual Bottlenecks in
Transformers via Multiway Dynamic Dense Connections", arXiv 2502.12170, ICML 2025)."""

from __future__ import annotations

import math
from typing import Any

import torch
from timm.layers import DropPath, Mlp
from torch import nn

from .base import BlockArgs, inverse_rms
from .dca import cross_attention
from .depth import DepthWeights, depth_row, norm_eps, weighted_sum
from .standard import Standard

WAYS = ("q", "k", "v", "r")  # the four compositions of a multiway connection: query, key, value, residual
HIDDENS = ("round64", "exact")


class MUDDFormer(Standard):
    """Dynamic dense connections, separate for the attention's query, key and value inputs and for the residual.
    The stream keeps X_0 = the embeddings and every block output X_1 … X_l; after block l − 1 a small per-token MLP
    on the newest output gives C × (l + 1) weights, and the next block's inputs are C compositions of all of them:

        A = W₂ GELU(W₁ RMSNorm(X_l)) + B_l ∈ R^{C×(l+1)} per token,    S_c = Σ_{j ≤ l} A_{c,j} X_j,   c ∈ (q, k, v, r)
        h = S_r + Attn(N_q S_q, N_k S_k, N_v S_v),    X_{l+1} = h + MLP(N h)

    (C = 4 ways; after the last block C = 1 and the head reads N_f(S)). Block 0 is an ordinary pre-norm block on
    the embeddings. The RMSNorm inside the weight MLP has no gain (the reference's ``RMSnormNoscale``); N_q is the
    block's ``norm1`` (timm's name), N_k and N_v its ``norm1_k``/``norm1_v`` (the reference's ``sepln``: one norm per
    way), N its ``norm2`` — all the backbone's norm layer.

    Init (the reference's MaxText ``dense_conn`` init: W₁ fan-in normal N(0, 1/D), W₂ = 0, B_l = 1 on the newest
    output and 0 elsewhere, ``current_only``): every composition is X_l and the model **is** the standard pre-norm
    ViT with the same shared weights (R-exact; a timm checkpoint's ``norm1`` is copied into ``norm1_k``/``norm1_v``
    when retrofitting, ``retrofit_aliases``, which keeps that).

    Options: ``dynamic`` (True: the MLP above; False: the static B_l alone, the paper's "static dense" ablation),
    ``multiway`` (True: four ways; False: one composition feeds the whole block, the reference's ``dense_type="l"``),
    ``hidden``: the weight MLP's width, ``"round64"`` (default, the released configuration's: C·(l + 1) — ×4 after
    the last block, ``expand_last`` — rounded up to the next multiple of 64 above it) or ``"exact"`` (C·(l + 1),
    ×4 after the last block). Inapplicable combinations are refused (``hidden`` with ``dynamic=False``).

    The sites are the standard residual's (Δ = F): the attention site sees x = S_r and f = the attention output, the
    MLP site the usual h and MLP(N h); DropPath drops each Δ. Weight decay: W₁, W₂ are decayed, the static B_l
    (the connection strengths, 1 at the newest output) are not — decay would pull them to 0 (as DCA's b).
    """

    name = "muddformer"
    paper = "Xiao et al. 2025 (MUDDFormer), arXiv 2502.12170"

    def __init__(self, dim: int, *, args: BlockArgs, dynamic: bool = True, multiway: bool = True,
                 hidden: str = "round64") -> None:
        super().__init__(dim, args=args)

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        for key in ("dynamic", "multiway"):
            if not isinstance(options[key], bool):
                raise ValueError(f"{key}={options[key]!r} is not valid for muddformer; valid: True, False")
        if options["hidden"] not in HIDDENS:
            raise ValueError(f"hidden={options['hidden']!r} is not valid; valid choices: {', '.join(HIDDENS)}")

    @classmethod
    def inapplicable_options(cls, options: dict[str, Any]) -> dict[str, str]:
        if options["dynamic"] is False:
            return {"hidden": "dynamic=False (no weight MLP); it applies with dynamic=True"}
        return {}

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        return MuddBlock(args, sites=cls.build_sites(args, **options),
                         multiway=options["multiway"] and args.layer > 0)

    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        return MuddStream(dim, depth, norm_layer, **options)


def dense_hidden(ways: int, sources: int, last: bool, hidden: str) -> int:
    """The weight MLP's width after a block whose C·(l + 1) weights it produces: ×4 after the last block
    (``expand_last``), then, under ``round64``, the next multiple of 64 above (the reference's ``(h // 64 + 1)·64``)."""
    h = ways * sources * (4 if last else 1)
    return (h // 64 + 1) * 64 if hidden == "round64" else h


class DenseConnection(nn.Module, DepthWeights):
    """The dense connection after block ``block`` (0-based): from the newest output X_{block+1} (the last of
    ``sources``) the per-token weights A ∈ R^{C×(block+2)}, then the C compositions Σ_j A_cj X_j, stacked (C, B, N, D).
    ``bias`` is B_l (C, block + 2), ``w1``/``w2`` the weight MLP (absent when static)."""

    depth_columns = "representation j (0 = embeddings, j = output of block j − 1)"

    def __init__(self, dim: int, block: int, depth: int, ways: int, dynamic: bool, hidden: str, eps: float) -> None:
        super().__init__()
        sources = block + 2
        self.ways, self.sources, self.eps = ways, sources, eps
        self.bias = nn.Parameter(torch.zeros(ways, sources))
        if dynamic:
            width = dense_hidden(ways, sources, block == depth - 1, hidden)
            self.w1 = nn.Linear(dim, width, bias=False)
            self.act = nn.GELU()
            self.w2 = nn.Linear(width, ways * sources, bias=False)
        else:
            self.w1 = None
        self.set_depth(block, (depth, depth + 1), f"block {block}")

    @torch.no_grad()
    def init_weights(self) -> None:
        """B = 1 on the newest output, 0 elsewhere; W₁ ~ N(0, 1/D) (fan-in normal), W₂ = 0 (the reference's)."""
        self.bias.zero_()[:, -1] = 1.0
        if self.w1 is not None:
            self.w1.weight.normal_(0.0, 1.0 / math.sqrt(self.w1.in_features))
            self.w2.weight.zero_()

    def no_weight_decay(self) -> set[str]:
        return {"bias"}

    def weights(self, newest: torch.Tensor) -> torch.Tensor:
        """A (B, N, C, sources) for the newest block output (B, N, D)."""
        shape = (*newest.shape[:-1], self.ways, self.sources)
        if self.w1 is None:
            return self.bias.to(newest.dtype).expand(shape)
        normed = newest * inverse_rms(newest, self.eps).unsqueeze(-1)  # RMSNorm without a gain
        return self.w2(self.act(self.w1(normed))).view(shape) + self.bias

    def forward(self, sources: list[torch.Tensor]) -> torch.Tensor:
        a = self.weights(sources[-1]).unsqueeze(-1)  # (B, N, C, sources, 1)
        return torch.stack([weighted_sum(sources, a[..., c, :, :].unbind(-2)) for c in range(self.ways)])

    def depth_weights(self, sources: list[torch.Tensor]) -> torch.Tensor:
        """Mean weight (over the batch, tokens and ways) given to each representation X_j."""
        return depth_row(self.weights(sources[-1]).detach().float().mean(dim=(0, 1, 2)), self.depth_extent[1])


class MuddBlock(nn.Module):
    """A pre-norm block whose attention reads separate query, key and value inputs and whose residual input is a
    fourth composition (``multiway``), or an ordinary pre-norm block (block 0, or ``multiway=False``). Input: a
    (B, N, D) tensor, or the stacked (4, B, N, D) compositions (q, k, v, r). timm's names (``norm1`` = the query's
    norm, ``attn``, ``norm2``, ``mlp``); ``norm1_k``/``norm1_v`` copy ``norm1`` when a timm checkpoint is loaded."""

    def __init__(self, args: BlockArgs, sites: tuple[nn.Module, nn.Module], multiway: bool) -> None:
        super().__init__()
        dim = args.dim
        self.ls1, self.ls2 = sites
        self.multiway = multiway
        self.norm1 = args.norm_layer(dim)
        if multiway:
            self.norm1_k = args.norm_layer(dim)
            self.norm1_v = args.norm_layer(dim)
            self.retrofit_aliases = {f"norm1_{s}.{p}": f"norm1.{p}" for s in "kv" for p in ("weight", "bias")}
        self.attn = args.attention()
        self.norm2 = args.norm_layer(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * args.mlp_ratio), act_layer=args.act_layer,
                       drop=args.proj_drop)
        self.drop_path1 = DropPath(args.drop_path) if args.drop_path > 0.0 else nn.Identity()
        self.drop_path2 = DropPath(args.drop_path) if args.drop_path > 0.0 else nn.Identity()

    def sites(self) -> dict[str, nn.Module]:
        return {"attn": self.ls1, "mlp": self.ls2}

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        if self.multiway:
            q, k, v, r = x.unbind(0)
            u = self.norm1(q)
            a = cross_attention(self.attn, u, self.norm1_k(k), self.norm1_v(v))
        else:
            if x.dim() != 3:
                raise ValueError(f"a single-way MUDDFormer block takes one (B, N, D) input, got {tuple(x.shape)}")
            r, u = x, self.norm1(x)
            a = self.attn(u)
        h = r + self.drop_path1(self.ls1(r, u, a, history))
        u = self.norm2(h)
        return h + self.drop_path2(self.ls2(h, u, self.mlp(u), history))


class MuddStream(nn.Module):
    """Keeps X_0 (the embeddings) and every block output; after block l its dense connection (``dense.{l}``) gives
    the next block's compositions (4 ways into a multiway block, 1 otherwise) and, after the last block, the one
    composition the final norm and the head read."""

    def __init__(self, dim: int, depth: int, norm_layer: Any, *, dynamic: bool = True, multiway: bool = True,
                 hidden: str = "round64") -> None:
        super().__init__()
        eps = norm_eps(norm_layer)
        self.dense = nn.ModuleList(
            DenseConnection(dim, i, depth, len(WAYS) if multiway and i < depth - 1 else 1, dynamic, hidden, eps)
            for i in range(depth))

    def forward(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        sources = [x]
        for blk, dense in zip(blocks, self.dense, strict=True):
            sources.append(blk(x))
            x = dense(sources)
            if x.shape[0] == 1:
                x = x[0]
        return x
