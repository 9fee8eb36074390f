"""DeepNorm (Wang, Ma, Dong, Huang, Zhang & Wei, "DeepNet: Scaling Transformers to 1,000 Layers", arXiv 2203.00555)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..blocks import PostNormBlock
from .base import BlockArgs, OptionalFinalNorm, ResidualSite, check_auto_or_positive, check_choice

INITS = ("xavier_normal", "timm_scaled")


def deepnorm_alpha(depth: int) -> float:
    """The paper's encoder-only α = (2N)^{1/4}, N = number of blocks (Table 1)."""
    return (2.0 * depth) ** 0.25


def deepnorm_beta(depth: int) -> float:
    """The paper's encoder-only β = (8N)^{−1/4}, N = number of blocks (Table 1)."""
    return (8.0 * depth) ** -0.25


class DeepNorm(OptionalFinalNorm, ResidualSite):
    """Post-LN residual with an up-weighted skip (DeepNet, Fig. 2; encoder-only constants, Table 1):

        x ← LN(α·x + G(x)),   α = (2N)^{1/4},   G = attention or MLP applied to x itself (no pre-norm)

    plus an init that scales the FFN, value and output projections by β = (8N)^{−1/4} (N = ``depth``, the number
    of blocks). In this backbone a site returns Δ = x_new − x, so **Δ = LN(α·x + G(x)) − x**; the LN is the
    block's ``norm1``/``norm2`` (timm's names, applied *after* the sum: ``blocks.PostNormBlock``), ``pre_norm`` is False.

    **DropPath** drops G inside the norm, x ← LN(α·x + DropPath(G(x))), as the paper's code (torchscale) does: a
    dropped site is LN(α·x) = LN(x) up to ε, a kept one LN(α·x + G/(1 − p)). This is the one exception to the
    project's "drop Δ" convention: dropping Δ = LN(z) − x would leave every *kept* sample un-normalised in
    training (x + (LN(z) − x)/(1 − p)) while eval normalises it.

    Options: ``alpha``/``beta`` (``"auto"``: the paper's constants for N = depth; a float overrides),
    ``init``: ``"xavier_normal"`` (default, the paper's Fig. 2: Xavier-normal with gain β for the MLP's fc1/fc2,
    the value rows of timm's fused qkv and the output projection, gain 1 for the query and key rows; biases 0) or
    ``"timm_scaled"`` (timm's trunc_normal(0.02) kept and those weights multiplied by β — torchscale's "divide
    by (8N)^{1/4} after init", on timm's init). ``final_norm``: False (default) drops the backbone's final norm
    before the head — a post-LN encoder's last block already ends in a LN (torchscale has no final LN with
    DeepNorm); True keeps timm's final norm (an adaptation). With a class-attention head the final norm is always
    kept (the CA blocks are pre-norm residual updates), so ``final_norm`` given with ``class_attention_blocks > 0``
    is rejected: it would not change the model.

    ``decompose``: with z = α·x + G and σ the norm's per-token scale of z (√(var z + ε) for LayerNorm,
    √(mean z² + ε) for RMSNorm), the skip scale is c = α/σ (what the post-LN multiplies the skip by) and the
    branch term b = LN(z) − c·x, so Δ = b + (c − 1)·x exactly. Diagnostics: ``branch_skip_ratio`` = mean over
    tokens of ‖G(x)‖/‖α·x‖, the branch's size relative to the up-weighted skip inside the norm (the quantity
    DeepNet's analysis keeps bounded).
    """

    name = "deepnorm"
    paper = "Wang et al. 2022 (DeepNet), arXiv 2203.00555"
    own_output_init = True  # the β-scaled init of the output projections

    def __init__(self, dim: int, *, args: BlockArgs, alpha: float | str = "auto", beta: float | str = "auto",
                 init: str = "xavier_normal", final_norm: bool = False) -> None:
        super().__init__(dim, args=args)
        self.alpha = deepnorm_alpha(args.depth) if alpha == "auto" else float(alpha)
        self.beta = deepnorm_beta(args.depth) if beta == "auto" else float(beta)
        self.init_scheme = init
        self._norm: tuple[nn.Module, ...] = ()  # the block's post-norm, bound by PostNormBlock (not registered here)

    @property
    def pre_norm(self) -> bool:
        return False

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        for key in ("alpha", "beta"):
            check_auto_or_positive(key, options[key], cls.name)
        check_choice("init", options["init"], INITS)
        cls.check_final_norm(options)

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        return PostNormBlock(args, sites=cls.build_sites(args, **options))

    def bind_norm(self, norm: nn.Module) -> None:
        """The post-norm this site applies (``PostNormBlock``'s norm1/norm2)."""
        self._norm = (norm,)  # a tuple hides it from Module registration: the block owns it (timm's name)

    @torch.no_grad()
    def init_sublayer(self, sublayer: nn.Module) -> None:
        """The paper's init of the sublayer this site wraps (called by ``PostNormBlock.init_weights`` after timm's
        init): attention — q and k row blocks of timm's fused qkv with gain 1, the v rows and ``proj`` with gain
        β — or MLP — ``fc1``, ``fc2`` with gain β. ``timm_scaled`` multiplies the β-weights by β instead."""
        if hasattr(sublayer, "qkv"):
            q, k, v = sublayer.qkv.weight.chunk(3, dim=0)  # views of the fused (3D, D) weight
            plain, scaled = (q, k), (v, sublayer.proj.weight)
        else:
            plain, scaled = (), (sublayer.fc1.weight, sublayer.fc2.weight)
        if self.init_scheme == "timm_scaled":
            for w in scaled:
                w.mul_(self.beta)
            return
        for w in plain:
            nn.init.xavier_normal_(w, gain=1.0)
        for w in scaled:
            nn.init.xavier_normal_(w, gain=self.beta)

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return self._norm[0](self.alpha * x + f) - x

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        norm = self._norm[0]
        z = self.alpha * x + f
        centred = z - z.mean(dim=-1, keepdim=True) if isinstance(norm, nn.LayerNorm) else z
        skip = self.alpha * torch.rsqrt(centred.square().mean(dim=-1, keepdim=True) + getattr(norm, "eps", 0.0))
        return norm(z) - skip * x, skip

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        if x is None or f is None:
            return {}
        ratio = f.detach().norm(dim=-1) / (self.alpha * x.detach().norm(dim=-1)).clamp_min(1e-30)
        return {"branch_skip_ratio": ratio.mean()}

    def extra_repr(self) -> str:
        return f"alpha={self.alpha:.4g}, beta={self.beta:.4g}, init={self.init_scheme}"
