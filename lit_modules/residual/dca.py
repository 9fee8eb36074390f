"""DeepCrossAttention (Heddes et al., arXiv 2502.06785, ICML 2025) and its GRN rungs, adapted to a ViT."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import DropPath, Mlp, trunc_normal_
from torch import nn

from ..attention import SelfAttention
from ..blocks import Block
from .base import BlockArgs, ResidualSite, SiteTerms, check_choice, unused_by_form
from .depth import DepthWeights, depth_row, final_args, stack_sources

FORMS = ("dca", "grn_v1", "grn_v2", "grn_v3", "seed")
#: the forms under which each option changes the model (the class docstring's table); given under any other form
#: an option is rejected (``validate_options``)
APPLIES = {"k": FORMS[:-1], "grn_v3_form": ("dca", "grn_v3"), "w_init_std": ("dca", "grn_v3")}


def stack_size(t: int, k: int | None) -> int:
    """How many vectors the stack holds after t block outputs: the model input plus the outputs, or with
    k-DCA at most the input, the sum of the intermediates and the last k outputs."""
    return 1 + t if k is None or t <= k else k + 2


class DCA(ResidualSite, DepthWeights):
    """Generalised residual network over the stack G = [x₀, f₁, …, f_{t−1}] of the model input and all
    previous block outputs (spec §8), computed per token:

    - ``grn_v1``: g = Σ_j b_j G_j, b ∈ R^t (= DenseFormer);
    - ``grn_v2``: g = Σ_j b_j ⊙ G_j, b ∈ R^{t×D};
    - ``grn_v3``: weights b_j + ReLU(wᵀG_j) (``grn_v3_form="text_A"``, Thm 4.1) or ReLU(b_j + wᵀG_j)
      (``"fig10_B"``, Appendix H; default, see below);
    - ``dca``: three independent GRN-v3 give the attention's query, key and value inputs; the block output
      f_t = a + MLP(LN(a + q_in)) excludes its input (lucidrains' reading of Fig. 4).
    - ``seed``: the seed notes' per-token two-way mix (see ``TokenMix``), not the paper's method.

    b = 1 + b' with b' = 0 at init and excluded from weight decay (decay would pull b to 0, not 1), as is w (a
    vector per output, which the project's rule for variants' vectors leaves undecayed; no source we could read
    decays it: lucidrains' code trains with plain Adam, no official code or paper rule was found); w = 0 at init,
    so the model equals the standard ViT (R-exact). Pitfall: under text_A, ReLU'(0) = 0 leaves w with zero
    gradient forever (GRN-v3 degenerates to v2); fig10_B is R-exact *and* trains w, hence the default;
    ``w_init_std > 0`` is the other fix. ``k`` selects k-DCA (model input + Σ intermediates + last k).

    Which options each form uses (✓); any other option given explicitly is rejected with a one-line ValueError,
    so two labels are never the same model (``grn_v3_form`` and ``w_init_std`` concern w, which only GRN-v3 has;
    ``dca`` is three GRN-v3 per block and a GRN-v3 before the head):

    =========== === ====== ====== ====== ====
    option      dca grn_v1 grn_v2 grn_v3 seed
    =========== === ====== ====== ====== ====
    k           ✓   ✓      ✓      ✓
    grn_v3_form ✓                 ✓
    w_init_std  ✓                 ✓
    =========== === ====== ====== ====== ====

    An instance is the GRN of one block (three outputs for ``dca``) or the final GRN before the head; as a
    ``DepthWeights`` it reports its row of the depth-weight heat map (row t = block t, row L = the final GRN;
    columns = stack positions).
    """

    name = "dca"
    paper = "Heddes et al. 2025, arXiv 2502.06785"
    depth_columns = "stacked input j (0 = x0)"

    def __init__(self, dim: int, *, args: BlockArgs, form: str = "dca", k: int | None = None,
                 grn_v3_form: str = "fig10_B", w_init_std: float = 0.0) -> None:
        super().__init__(dim, args=args)
        self.form, self.grn_v3_form, self.w_init_std = form, grn_v3_form, float(w_init_std)
        size = stack_size(args.layer, k)
        per_dim = 1 if form == "grn_v1" else dim
        outputs = 3 if form == "dca" else 1  # separate query, key and value compositions
        self.b_delta = nn.Parameter(torch.zeros(outputs, size, per_dim))  # b = 1 + b'
        self.w = nn.Parameter(torch.zeros(outputs, dim)) if form in ("grn_v3", "dca") else None
        self.set_depth(args.layer, (args.depth + 1, stack_size(args.depth, k)),
                       "out" if args.layer == args.depth else f"block {args.layer}")

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        check_choice("form", options["form"], FORMS)
        check_choice("grn_v3_form", options["grn_v3_form"], ("text_A", "fig10_B"))
        k = options["k"]
        if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
            raise ValueError(f"k={k!r} must be a positive integer (k-DCA) or None (full DCA)")
        if options["w_init_std"] < 0:
            raise ValueError(f"w_init_std must be >= 0, got {options['w_init_std']}")

    @classmethod
    def inapplicable_options(cls, options: dict[str, Any]) -> dict[str, str]:
        return unused_by_form(options, APPLIES, FORMS)

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        if options["form"] == "seed":
            return Block(args, sites=(TokenMix(args), TokenMix(args)))
        return DCABlock(args, grn=cls(args.dim, args=args, **options))

    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        if options["form"] == "seed":
            return super().build_stream(dim, depth, norm_layer, **options)
        out_args = final_args(dim, depth, norm_layer)
        final_form = "grn_v3" if options["form"] == "dca" else options["form"]
        return DenseStream(options["k"], cls(dim, args=out_args, **(options | {"form": final_form})))

    def init_weights(self) -> None:
        nn.init.zeros_(self.b_delta)
        if self.w is not None:
            if self.w_init_std > 0:
                trunc_normal_(self.w, std=self.w_init_std)
            else:
                nn.init.zeros_(self.w)

    def no_weight_decay(self) -> set[str]:
        """b (decay would pull b = 1 + b' towards 0, not 1) and GRN-v3's w: per-channel vectors, which the project
        never decays; stored as (outputs, ·) matrices, so timm's 1-D rule alone would decay them."""
        return {"b_delta"} | ({"w"} if self.w is not None else set())

    def weights(self, stack: torch.Tensor) -> torch.Tensor | None:
        """The input-dependent part of GRN-v3, ReLU(wᵀG_j) or ReLU(b_j + wᵀG_j): (outputs, B, N, t[, D])."""
        if self.w is None:
            return None
        s = torch.einsum("bntd,od->obnt", stack, self.w)
        if self.grn_v3_form == "text_A":
            return F.relu(s)
        b = 1.0 + self.b_delta
        return F.relu(b[:, None, None] + s[..., None])

    def forward(self, stack: torch.Tensor) -> torch.Tensor:
        """Stack (B, N, t, D) → combined inputs (outputs, B, N, D)."""
        if self.w is not None and self.grn_v3_form == "fig10_B":
            if torch._C._functorch.is_batchedtensor(stack):  # under torch.func.vmap (stacked runs): ReLUMix has
                return torch.einsum("obntd,bntd->obnd", self.weights(stack), stack)  # no vmap rule; same sum
            B, N, t, D = stack.shape
            return ReLUMix.apply(stack.reshape(B * N, t, D), self.w, 1.0 + self.b_delta).view(-1, B, N, D)
        dynamic = self.weights(stack)
        out = torch.einsum("bntd,otd->obnd", stack, 1.0 + self.b_delta.expand(-1, -1, stack.shape[-1]))
        if dynamic is not None:
            out = out + torch.einsum("obnt,bntd->obnd", dynamic, stack)
        return out

    def mean_weights(self, stack: torch.Tensor | None = None) -> torch.Tensor:
        """Mean weight given to each stacked vector (averaged over outputs, channels and — with a stack — batch
        and tokens), shape (t,)."""
        b = 1.0 + self.b_delta.detach()
        dyn = None if stack is None else self.weights(stack)
        if dyn is None:
            return b.mean(dim=(0, 2))
        if self.grn_v3_form == "fig10_B":
            return dyn.detach().mean(dim=(0, 1, 2, 4))
        return b.mean(dim=(0, 2)) + dyn.detach().mean(dim=(0, 1, 2))

    def depth_weights(self, stack: torch.Tensor) -> torch.Tensor:
        """This GRN's row of the depth-weight matrix (``DepthWeights``): ``mean_weights`` on the stack."""
        return depth_row(self.mean_weights(stack), self.depth_extent[1])

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """``weight_j``: the mean weight given to stacked vector j (``mean_weights``; x = the stack)."""
        return {f"weight_{j}": v for j, v in enumerate(self.mean_weights(x))}


class TokenMix(ResidualSite):
    """The seed notes' "DeepCrossAttention" (``form="seed"``), literally: a small MLP predicts two weights per
    token from the stream, normalised by a softmax,

        (α_skip, α_branch) = softmax(W₂ GELU(W₁ x + b₁) + b₂),   W₁ ∈ R^{D/4×D}, W₂ ∈ R^{2×D/4}
        y = α_skip ⊙ x + α_branch ⊙ F(u),   u = Norm(x)

    at each residual site. With timm's init (W ~ N(0, 0.02²), b = 0) both weights start ≈ 0.5: the skip and the
    branch are halved (not standard at init). It lacks everything that makes the paper's DCA: the stack of all
    previous outputs, per-dimension weights and the separate query/key/value compositions.
    """

    name = "dca"

    def __init__(self, args: BlockArgs) -> None:
        super().__init__(args.dim, args=args)
        self.predictor = nn.Sequential(nn.Linear(args.dim, max(1, args.dim // 4)), nn.GELU(),
                                       nn.Linear(max(1, args.dim // 4), 2))

    def weights(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.predictor(x), dim=-1)

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        w = self.weights(x)
        return (w[..., :1] - 1.0) * x + w[..., 1:] * f

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.weights(x)
        return w[..., 1:] * f, w[..., :1]

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if x is None:
            return {}
        w = self.weights(x).detach()
        return {"alpha_skip_mean": w[..., 0].mean(), "alpha_branch_mean": w[..., 1].mean()}


class ReLUMix(torch.autograd.Function):
    """GRN-v3 as in Appendix H (``fig10_B``): out_o = Σ_j ReLU(b_oj + w_oᵀG_j) ⊙ G_j, fused and chunked.

    Plain autograd materialises and saves the (outputs, tokens, t, D) weights ReLU(b + wᵀG) several times over —
    memory-bound elementwise work that dominates DCA's step on a CPU and its activation memory. This computes
    the same function over chunks of tokens small enough to stay in cache, saves only G and s = wᵀG, and
    recomputes the weights in backward. Inputs: G (tokens, t, D), w (outputs, D), b (outputs, t, D) → (outputs,
    tokens, D). ReLU'(0) = 0, as ``F.relu``. Not twice differentiable.
    """

    CHUNK_ELEMENTS = 1 << 19  # elements of one (outputs, tokens, t, D) chunk on a CPU: ~2 MiB of fp32, in cache
    #: ... on an accelerator: each chunk costs a dozen kernel launches, and cache-sized chunks made DCA's step grow
    #: with the batch (an H200, depth 6, batch 1024: 23x standard's step); 2^26 elements bound a chunk's
    #: temporaries at 256 MiB of fp32 (results/device/cuda/bench-overhead-batch*)
    DEVICE_CHUNK_ELEMENTS = 1 << 26

    @staticmethod
    def chunks(G: torch.Tensor, outputs: int) -> list[slice]:
        """Token slices of G, each ~CHUNK_ELEMENTS (on a CPU) or ~DEVICE_CHUNK_ELEMENTS (elsewhere) elements once
        expanded to (outputs, m, t, D)."""
        tokens, t, D = G.shape
        limit = ReLUMix.CHUNK_ELEMENTS if G.device.type == "cpu" else ReLUMix.DEVICE_CHUNK_ELEMENTS
        step = max(8, limit // (outputs * t * D))
        return [slice(c0, c0 + step) for c0 in range(0, tokens, step)]

    @staticmethod
    def forward(ctx: Any, G: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        G = G.contiguous()
        s = torch.matmul(G, w.t()).permute(2, 0, 1).unsqueeze(-1)  # (outputs, tokens, t, 1)
        out = G.new_empty(w.shape[0], G.shape[0], G.shape[2])
        for c in ReLUMix.chunks(G, w.shape[0]):
            z = (b.unsqueeze(1) + s[:, c]).clamp_(min=0).mul_(G[c])
            torch.sum(z, dim=2, out=out[:, c])
        ctx.save_for_backward(G, w, b, s)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        G, w, b, s = ctx.saved_tensors
        outputs, D = w.shape
        dG, dw, db = torch.empty_like(G), torch.zeros_like(w), torch.zeros_like(b)
        for c in ReLUMix.chunks(G, outputs):
            g = grad[:, c].unsqueeze(2)  # (outputs, m, 1, D)
            z = b.unsqueeze(1) + s[:, c]  # pre-activation (outputs, m, t, D)
            dz = torch.ops.aten.threshold_backward(G[c] * g, z, 0)  # ReLU's backward: 0 where z <= 0
            db.add_(dz.sum(dim=1))
            ds = dz.sum(dim=-1).flatten(1)  # (outputs, m·t)
            r = z.relu_()
            dG_c = torch.mul(r[0], g[0], out=dG[c])  # Σ_o r_o ⊙ g_o, unrolled: a sum over a leading dim is slow
            for o in range(1, outputs):
                dG_c.addcmul_(r[o], g[o])
            G_c = G[c].view(-1, D)
            dG_c.view(-1, D).addmm_(ds.t(), w)  # through s = wᵀG; per chunk, while G_c is in cache
            dw.addmm_(ds, G_c)
        return dG, dw, db


class DCABlock(nn.Module):
    """A ViT block fed by a GRN over the stack of previous outputs instead of the running stream.

    ``a = MHSA(LN_q q_in, LN_k k_in, LN_v v_in)``, ``f_t = a + MLP(LN₂(q_in + a))``; returns DropPath(f_t).
    ``norm1`` (timm's name) is the query norm; ``norm1_k``/``norm1_v`` are copied from it when a timm
    checkpoint is retrofitted (``retrofit_aliases``), which keeps the retrofitted model's function unchanged.
    """

    def __init__(self, args: BlockArgs, grn: DCA) -> None:
        super().__init__()
        dim = args.dim
        self.grn = grn
        self.norm1 = args.norm_layer(dim)
        self.cross = grn.b_delta.shape[0] == 3
        if self.cross:
            self.norm1_k = args.norm_layer(dim)
            self.norm1_v = args.norm_layer(dim)
            self.retrofit_aliases = {f"norm1_{s}.{p}": f"norm1.{p}" for s in "kv" for p in ("weight", "bias")}
        self.attn = args.attention()
        self.norm2 = args.norm_layer(dim)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * args.mlp_ratio), act_layer=args.act_layer,
                       drop=args.proj_drop)
        self.drop_path = DropPath(args.drop_path) if args.drop_path > 0.0 else nn.Identity()

    def sites(self) -> dict[str, nn.Module]:
        return {"block": self}

    def diagnostic_terms(self, args: tuple, output: torch.Tensor) -> SiteTerms:
        """The terms of one call, for a forward hook that saw the stack (B, N, t, D) and the block output f_t: the
        stream is the stack's sum (the R-exact reading), the branch and the update are f_t, the skip is 1; the
        params are the block's GRN's."""
        stack = args[0]
        return SiteTerms(stack.sum(dim=2), output, output, 1.0, self.grn.diagnostics(stack))

    def forward(self, stack: torch.Tensor) -> torch.Tensor:
        inputs = self.grn(stack)
        q_in = inputs[0]
        if self.cross:
            a = cross_attention(self.attn, self.norm1(q_in), self.norm1_k(inputs[1]), self.norm1_v(inputs[2]))
        else:
            a = self.attn(self.norm1(q_in))
        return self.drop_path(a + self.mlp(self.norm2(q_in + a)))


def cross_attention(attn: SelfAttention, q_in: torch.Tensor, k_in: torch.Tensor, v_in: torch.Tensor) -> torch.Tensor:
    """The block's attention (any kind of ``lit_modules.attention``) with separate query/key/value inputs: same
    weights, and the kind's own core (``attend``: fused/explicit switch, Re-attention's head mixing; the explicit
    path passes the attention map through ``attn.attn_drop`` so diagnostics hooks see it). The values pass through
    ``attn.v_norm`` and ``attn.value_residual`` as in ``SelfAttention.forward`` (ResFormer: block 0 records the
    values of its composed value input, later blocks mix them in); an output gate reads the query's input (in the
    reference the gate is part of the query projection)."""
    B, N, _ = q_in.shape
    weights = attn.qkv.weight.chunk(3)
    biases = attn.qkv.bias.chunk(3) if attn.qkv.bias is not None else (None, None, None)
    q, k, v = (F.linear(t, w, b).reshape(B, N, attn.num_heads, attn.head_dim).transpose(1, 2)
               for t, w, b in zip((q_in, k_in, v_in), weights, biases, strict=True))
    x = attn.attend(attn.q_norm(q), attn.k_norm(k), attn.value_residual(attn.v_norm(v)))
    return attn.proj_drop(attn.proj(attn.merge_heads(x, q_in)))  # a gated attention's gate reads the query input


class DenseStream(nn.Module):
    """Chains DCA blocks: each reads the (k-)stack of the model input and previous block outputs; the head
    reads ``out`` (a final GRN) over the whole stack. With b = 1, w = 0 the stack sum is the residual stream."""

    def __init__(self, k: int | None, out: DCA) -> None:
        super().__init__()
        self.k = k
        self.out = out

    def forward(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        first, mid, recent = x, None, []
        for blk in blocks:
            recent.append(blk(_stack(first, mid, recent)))
            if self.k is not None and len(recent) > self.k:
                old = recent.pop(0)
                mid = old if mid is None else mid + old
        return self.out(_stack(first, mid, recent))[0]


def _stack(first: torch.Tensor, mid: torch.Tensor | None, recent: list[torch.Tensor]) -> torch.Tensor:
    return stack_sources([first] + ([mid] if mid is not None else []) + recent)
