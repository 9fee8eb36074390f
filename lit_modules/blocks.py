"""The blocks and streams the residual variants build (``ResidualSite.build_block`` / ``build_stream``).

Kept apart from the backbone (``vit.py``) and below the residual package: the backbone asks a variant for its
blocks, the variant builds them from these classes (and ``BlockArgs``); nothing here imports a variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from timm.layers import DropPath, Mlp
from torch import nn

from .attention import SelfAttention
from .value_residual import no_value_residual


@dataclass(frozen=True)
class BlockArgs:
    """Everything a variant needs to build one block of the backbone (built by ``VisionTransformer``)."""

    dim: int
    num_heads: int
    mlp_ratio: float
    qkv_bias: bool
    qk_norm: bool
    proj_drop: float
    attn_drop: float
    drop_path: float
    norm_layer: Any
    act_layer: Any
    layer: int  # 0-based block index
    depth: int  # total number of blocks
    num_prefix_tokens: int
    attn_layer: Any = SelfAttention  # the injection point of the attention kind (``lit_modules.attention``)
    # layer -> the attention's ``value_residual`` module (``lit_modules.value_residual``: ResFormer's V mixing)
    value_residual: Any = no_value_residual
    qk_norm_layer: Any = None  # the backbone's QK-norm (``qk_norm``), the norm of each head's q and k; None: off
    attention_gate: str = "none"  # the backbone's output gate of the attention (``lit_modules.attention``)
    branch_scale: float = 1.0  # the parametrisation's multiplier of the residual branches (CompleteP's m_L^{-α})

    def attention(self) -> nn.Module:
        """The block's attention (timm's argument names), of the backbone's chosen kind, with this layer's value
        residual module (the identity unless the backbone mixes the first layer's values in). Its q and k are
        normalised by ``norm_layer`` when a variant sets ``qk_norm=True`` itself (nGPT, HybridNorm), else by the
        backbone's ``qk_norm_layer`` if any."""
        qk = self.norm_layer if self.qk_norm else self.qk_norm_layer
        attn = self.attn_layer(self.dim, num_heads=self.num_heads, qkv_bias=self.qkv_bias, qk_norm=qk is not None,
                               attn_drop=self.attn_drop, proj_drop=self.proj_drop, norm_layer=qk or self.norm_layer,
                               gate=self.attention_gate)
        attn.value_residual = self.value_residual(self.layer)
        return attn


class Block(nn.Module):
    """Pre-norm transformer block with two residual sites, ``ls1`` (attention) and ``ls2`` (MLP).

    The sites sit where timm's ``LayerScale`` sits, so the standard and LayerScale variants keep timm's names.
    """

    def __init__(self, args: BlockArgs, sites: tuple[nn.Module, nn.Module]) -> None:
        super().__init__()
        self.ls1, self.ls2 = sites
        add_two_site_skeleton(self, args, pre_norm=self.ls1.pre_norm)

    def sites(self) -> dict[str, nn.Module]:
        """Residual sites by sublayer; a forward hook on one sees inputs (x, u, f, history) and output Δ."""
        return {"attn": self.ls1, "mlp": self.ls2}

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        u = self.norm1(x)
        x = x + self.drop_path1(self.ls1(x, u, self.attn(u), history))
        u = self.norm2(x)
        x = x + self.drop_path2(self.ls2(x, u, self.mlp(u), history))
        return x


class SiteNormBlock(Block):
    """A block whose norms are applied by its sites (``pre_norm`` False): ``norm1``/``norm2`` keep timm's names
    and position (a timm checkpoint's norms load into them) and are handed to the sites through ``bind_norm``."""

    def __init__(self, args: BlockArgs, sites: tuple[nn.Module, nn.Module]) -> None:
        super().__init__(args, sites)
        self.norm1 = args.norm_layer(args.dim)  # replaces the Identity of a pre_norm=False block, same position
        self.norm2 = args.norm_layer(args.dim)
        self.ls1.bind_norm(self.norm1)
        self.ls2.bind_norm(self.norm2)


class PostNormBlock(SiteNormBlock):
    """Post-norm block (DeepNorm): the norm comes after each sum, and each site applies it itself,

        x ← x + Δ₁,  Δ₁ = site₁(x, x, DropPath(Attn(x))) = norm1(α·x + DropPath(Attn(x))) − x,   then norm2, MLP

    so the branches read the stream directly and a site's hook still sees (x, u = x, f, history) → Δ. DropPath
    drops the branch G inside the norm, as DeepNet's code does (dropping Δ would rescale a kept sample's
    x + (LN(z) − x)/(1 − p), which is no longer normalised): with p = 1 a site is LN(α·x). ``norm1``
    and ``norm2`` keep timm's names (a timm checkpoint's pre-norm weights load into them; the function differs)
    and are owned here; each site receives its norm through ``bind_norm``. ``init_weights`` runs after the
    sublayers' timm init (timm's ``named_apply`` is depth-first) and lets each site re-initialise its sublayer
    (``init_sublayer``: DeepNet's β-scaled init).
    """

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        x = x + self.ls1(x, x, self.drop_path1(self.attn(x)), history)  # DropPath on G, inside the norm (DeepNet)
        x = x + self.ls2(x, x, self.drop_path2(self.mlp(x)), history)
        return x

    def init_weights(self) -> None:
        self.ls1.init_sublayer(self.attn)
        self.ls2.init_sublayer(self.mlp)


class ResPostBlock(SiteNormBlock):
    """Res-post-norm block (Swin-V2; timm's ``ResPostBlock``): no input norm, the norm sits on the branch output,

        x ← x + DropPath(norm1(Attn(x))),   x ← x + DropPath(norm2(MLP(x))),

    so the site's update is Δ = norm(F(x)) and DropPath drops Δ (timm's placement). ``norm1``/``norm2`` keep timm's
    names (a timm ``ResPostBlock`` checkpoint loads by name) and are handed to the sites through ``bind_norm``.
    """

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        x = x + self.drop_path1(self.ls1(x, x, self.attn(x), history))
        x = x + self.drop_path2(self.ls2(x, x, self.mlp(x), history))
        return x

    def init_weights(self) -> None:
        self.ls1.init_norm()
        self.ls2.init_norm()


class InnerDropBlock(Block):
    """Pre-norm block whose sites act on the sum after the add (Keel's ``LN_out(α·x + F(LN_in x))``, GPAS's scaling
    of x + F, Deep Delta's rank-1 skip): DropPath drops the branch F the site receives, as ``PostNormBlock`` does,
    so a dropped site is the site's own map of x (LN_out(α·x); (1 − s)·x; the identity), not x."""

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        u = self.norm1(x)
        x = x + self.ls1(x, u, self.drop_path1(self.attn(u)), history)
        u = self.norm2(x)
        x = x + self.ls2(x, u, self.drop_path2(self.mlp(u)), history)
        return x


class ScaledNormBlock(Block):
    """Pre-norm block whose normalised input is scaled by a constant before each branch (LayerNorm Scaling:
    u = LN(x)·``scale``); the sites see the scaled u."""

    def __init__(self, args: BlockArgs, sites: tuple[nn.Module, nn.Module], scale: float) -> None:
        super().__init__(args, sites)
        self.scale = float(scale)

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        u = self.norm1(x) * self.scale
        x = x + self.drop_path1(self.ls1(x, u, self.attn(u), history))
        u = self.norm2(x) * self.scale
        x = x + self.drop_path2(self.ls2(x, u, self.mlp(u), history))
        return x

    def extra_repr(self) -> str:
        return f"scale={self.scale:.6g}"


class WholeBlock(nn.Module):
    """A block with one residual site around the whole pre-norm block (LAuReL at block granularity).

    ``f(x) = Block(x) − x = A(LN₁x) + M(LN₂(x + A(LN₁x)))``; the site turns f into the update Δ.
    """

    def __init__(self, args: BlockArgs, site: nn.Module) -> None:
        super().__init__()
        self.res = site
        add_sublayers(self, args, pre_norm=site.pre_norm)
        self.drop_path = DropPath(args.drop_path) if args.drop_path > 0.0 else nn.Identity()

    def sites(self) -> dict[str, nn.Module]:
        return {"block": self.res}

    def branch(self, x: torch.Tensor) -> torch.Tensor:
        """f(x) = Block(x) − x, the whole pre-norm block without its skip."""
        a = self.attn(self.norm1(x))
        return a + self.mlp(self.norm2(x + a))

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return x + self.drop_path(self.res(x, x, self.branch(x), history))


class DenseBlock(WholeBlock):
    """A whole block whose branch is applied to every stream state so far (SkipDense at block granularity):

        x_{l+1} = x_l + Σ_{i=0}^{l} f_l(x_i),   f_l(x) = Block_l(x) − x,

    the states x_0 … x_l being recorded in the stream's ``history`` (this block appends its input x_l). The site
    receives the sum as its f. Depth-quadratic: block l runs its branch (and its attention) ``attention_calls =
    l + 1`` times, its own input first — the call whose attention map the diagnostics record.
    """

    def __init__(self, args: BlockArgs, site: nn.Module) -> None:
        super().__init__(args, site)
        self.attention_calls = args.layer + 1

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        f = self.branch(x)
        for state in history:
            f = f + self.branch(state)
        history.append(x)
        return x + self.drop_path(self.res(x, x, f, history))


def add_sublayers(block: nn.Module, args: BlockArgs, pre_norm: bool) -> None:
    """The two timm sublayers of a block, under timm's names (norm1, attn, norm2, mlp; the norms are identities unless
    ``pre_norm``)."""
    dim = args.dim
    block.norm1 = args.norm_layer(dim) if pre_norm else nn.Identity()
    block.attn = args.attention()
    block.norm2 = args.norm_layer(dim) if pre_norm else nn.Identity()
    block.mlp = Mlp(in_features=dim, hidden_features=int(dim * args.mlp_ratio), act_layer=args.act_layer,
                    drop=args.proj_drop)


def add_two_site_skeleton(block: nn.Module, args: BlockArgs, pre_norm: bool) -> None:
    """The skeleton of every block with two residual sites (``Block``, Hyper-Connections' and AttnRes' blocks): the
    sublayers (``add_sublayers``) and one DropPath per site (drop_path1, drop_path2; identities at rate 0)."""
    add_sublayers(block, args, pre_norm)
    block.drop_path1 = DropPath(args.drop_path) if args.drop_path > 0.0 else nn.Identity()
    block.drop_path2 = DropPath(args.drop_path) if args.drop_path > 0.0 else nn.Identity()


class DualStream(nn.Module):
    """ResiDual's two streams (arXiv 2304.14802): the blocks run the post-LN stream x_a while their sites add each
    branch output into the dual stream x_d, kept as ``history[0]`` (x_d starts at the embeddings x_0); the output
    is x_a + norm(x_d), the dual stream normalised once at the end."""

    def __init__(self, dim: int, norm_layer) -> None:
        super().__init__()
        self.norm = norm_layer(dim)

    def forward(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        history = [x]
        for blk in blocks:
            x = blk(x, history)
        return x + self.norm(history[0])


class ResidualStream(nn.Module):
    """The usual residual stream: blocks applied in sequence.

    ``keep_history`` gives the blocks a fresh list per forward in which sites that use previous activations
    (LAuReL-PA) record the stream states they see; other variants pay nothing for it.
    """

    def __init__(self, keep_history: bool = False) -> None:
        super().__init__()
        self.keep_history = keep_history

    def forward(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        history = [] if self.keep_history else None
        for blk in blocks:
            x = blk(x, history)
        return x
