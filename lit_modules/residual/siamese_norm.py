"""SiameseNorm (Li et al., "SiameseNorm: Breaking the Barrier to Reconciling Pre/Post-Norm", arXiv 2602.08064,
ICML 2026)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..blocks import add_two_site_skeleton
from .base import BlockArgs, ResidualSite, check_auto_or_positive, inverse_scale


def siamese_divisor(layer: int) -> float:
    """c = √(2(l + 1)) for block l (0-based): the reference's divisor of the branch added to the post-norm stream."""
    return math.sqrt(2.0 * (layer + 1))


class SiameseNorm(ResidualSite):
    """Two streams that share every block: a post-norm-like stream x and a pre-norm-like stream y, both starting at
    the embeddings. At each sublayer of block l (the reference's DeiT ``Block``)

        x ← N_post(x)
        f = F(N_in(x + N_pre(y)))
        x ← x + f / c,   y ← y + f,        c = √(2(l + 1))

    and after the last block the head reads N_f(N_x(x) + N_y(y)). Every N is the backbone's norm layer (the
    reference's LayerNorm, ε = 1e-6): ``N_in`` is the block's ``norm1``/``norm2`` (timm's names and place: the norm
    right before the sublayer, so a timm checkpoint's norms load into it), ``N_post`` and ``N_pre`` are this site's
    ``post_norm`` and ``y_norm``, ``N_x``/``N_y`` the stream's ``norm_x``/``norm_y`` and ``N_f`` the backbone's
    final norm. Six norms per block where pre-LN has two (+8D parameters with LayerNorm), two more at the end.

    In this backbone a site returns Δ = x_new − x on the x stream: **Δ = N_post(x) + f/c − x**, and it adds f to
    the y stream (kept as ``history[0]`` by ``SiameseStream``; a site called outside the stream, with no history,
    leaves y alone). DropPath drops f for both streams, as the reference's ``drop_path(z)``: a dropped sublayer is
    x ← N_post(x), y unchanged (the post-norm still applies, as DeepNorm's).

    At init the first sublayer reads N_in(2·LN(x₀)) = LN(x₀), pre-LN's input (up to ε); after it the streams
    differ, so the model is not the standard ViT (level "neither").

    ``branch_divisor``: ``"auto"`` (default: c = √(2(l + 1)), the reference's; its language-model file keeps
    ``c = 1`` commented out) or a float > 0 for every block. ``decompose``: the skip scale is the post-norm's
    per-token factor 1/σ(x) (LayerNorm: σ² = var x + ε; RMSNorm: mean x² + ε; 1 for a normalisation-free norm
    layer) and the branch term b = Δ − (1/σ − 1)·x, so Δ = b + (skip − 1)·x exactly.
    """

    name = "siamese_norm"
    paper = "Li et al. 2026 (SiameseNorm), arXiv 2602.08064"

    def __init__(self, dim: int, *, args: BlockArgs, branch_divisor: float | str = "auto") -> None:
        super().__init__(dim, args=args)
        self.c = siamese_divisor(args.layer) if branch_divisor == "auto" else float(branch_divisor)
        self.post_norm = args.norm_layer(dim)
        self.y_norm = args.norm_layer(dim)

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        check_auto_or_positive("branch_divisor", options["branch_divisor"], cls.name)

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        return SiameseBlock(args, sites=cls.build_sites(args, **options))

    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        return SiameseStream(dim, norm_layer)

    def no_weight_decay(self) -> set[str]:
        return set()  # the norms' gains and biases are 1-D: timm's rule already leaves them undecayed

    def write(self, normed: torch.Tensor, f: torch.Tensor, history: list | None) -> torch.Tensor:
        """x_new = N_post(x) + f/c, given ``normed`` = N_post(x); y ← y + f in ``history[0]``."""
        if history:
            history[0] = history[0] + f
        return normed + f / self.c

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return self.write(self.post_norm(x), f, history) - x

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, Any]:
        skip = inverse_scale(self.post_norm, x)
        return self.post_norm(x) + f / self.c - skip * x, skip

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"branch_divisor": torch.tensor(self.c)}

    def extra_repr(self) -> str:
        return f"c={self.c:.4g}"


class SiameseBlock(nn.Module):
    """A block of the two-stream residual (``SiameseNorm``): timm's sublayer names (``norm1`` = N_in of the
    attention, ``attn``, ``norm2``, ``mlp``), sites ``ls1``/``ls2`` holding N_post (``post_norm``) and N_pre (``y_norm``). A site with forward
    hooks (the diagnostics) is called as a module, so its hooks see (x, u, f, history) → Δ; otherwise the block
    writes x_new = N_post(x) + f/c without forming Δ (N_post(x) is computed once)."""

    def __init__(self, args: BlockArgs, sites: tuple[SiameseNorm, SiameseNorm]) -> None:
        super().__init__()
        self.ls1, self.ls2 = sites
        add_two_site_skeleton(self, args, pre_norm=True)

    def sites(self) -> dict[str, nn.Module]:
        return {"attn": self.ls1, "mlp": self.ls2}

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        if not history:
            raise RuntimeError("a SiameseNorm block needs the stream's history (y in history[0]): call it through "
                               "the backbone's stream")
        x = self._step(self.ls1, self.norm1, self.attn, self.drop_path1, x, history)
        return self._step(self.ls2, self.norm2, self.mlp, self.drop_path2, x, history)

    @staticmethod
    def _step(site: SiameseNorm, norm: nn.Module, branch: nn.Module, drop_path: nn.Module, x: torch.Tensor,
              history: list) -> torch.Tensor:
        normed = site.post_norm(x)
        u = norm(normed + site.y_norm(history[0]))
        f = drop_path(branch(u))
        if site._forward_hooks or site._forward_pre_hooks:
            return x + site(x, u, f, history)
        return site.write(normed, f, history)


class SiameseStream(nn.Module):
    """The two streams: y starts as a copy of the embeddings x (``history[0]``); after the blocks the output is
    N_x(x) + N_y(y) (the reference's ``pre_norm(x) + post_norm(y)``), which the backbone's final norm then
    normalises."""

    def __init__(self, dim: int, norm_layer: Any) -> None:
        super().__init__()
        self.norm_x = norm_layer(dim)
        self.norm_y = norm_layer(dim)

    def forward(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        history = [x]
        for blk in blocks:
            x = blk(x, history)
        return self.norm_x(x) + self.norm_y(history[0])
