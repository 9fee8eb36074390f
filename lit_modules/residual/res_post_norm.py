"""Res-post-norm (Liu et al., "Swin Transformer V2", arXiv 2111.09883; timm's ``ResPostBlock``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..blocks import ResPostBlock
from .base import BlockArgs, ResidualSite


class ResPostNorm(ResidualSite):
    """Swin-V2's residual post-normalisation: the norm moves from the branch input to the branch output,

        x ← x + LN(F(x)),   Δ = LN(F(x))   (no input norm: the branch reads the stream itself)

    The block is ``blocks.ResPostBlock``: its ``norm1``/``norm2`` (timm's names, as timm's ``ResPostBlock``) are
    the output norms, bound to the sites; DropPath drops Δ (timm's placement). The backbone's final norm is kept
    (Swin-V2 and timm's res-post-norm ViT both normalise before the head).

    ``init_value``: the output norms' gain at init. ``0.0`` (default) is Swin-V2's official init
    (``_init_respostnorm`` in microsoft/Swin-Transformer, also timm's Swin-V2): the weight **and bias** of every
    output norm are zeroed, so Δ = 0 and every block starts as the identity. Another float sets the gain to it,
    bias 0 (timm's ``ResPostBlock(init_values=...)``); ``1.0`` is the unit gain of the norm layer's own init, with
    which every block adds a unit-variance vector at step 0; None leaves the norm layer's own init untouched. Swin-V2's other changes (scaled cosine attention, log-spaced position bias, the extra main-branch
    norm every 6 blocks of its largest models) are attention/architecture changes outside the residual and are
    not made here.

    ``decompose``: the update is all branch (LN(F)), the skip is the identity.
    """

    name = "res_post_norm"
    paper = "Liu et al. 2022 (Swin Transformer V2), arXiv 2111.09883"

    def __init__(self, dim: int, *, args: BlockArgs, init_value: float | None = 0.0) -> None:
        super().__init__(dim, args=args)
        self.init_value = init_value
        self._norm: tuple[nn.Module, ...] = ()  # the block's output norm, bound by ResPostBlock (owned there)

    @property
    def pre_norm(self) -> bool:
        return False

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        value = options["init_value"]
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError(f"init_value={value!r} is not valid for res_post_norm; valid: None or a float")

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        return ResPostBlock(args, sites=cls.build_sites(args, **options))

    def bind_norm(self, norm: nn.Module) -> None:
        self._norm = (norm,)

    @torch.no_grad()
    def init_norm(self) -> None:
        """The output norm's gain set to ``init_value`` and its bias zeroed (Swin-V2's ``_init_respostnorm`` at 0.0,
        timm's ``init_values`` otherwise); called by ``ResPostBlock.init_weights``, after the norm's own reset
        (timm's init is depth-first). None: the norm's own init."""
        if self.init_value is None or not self._norm:
            return
        norm = self._norm[0]
        if getattr(norm, "weight", None) is not None:
            norm.weight.fill_(float(self.init_value))
        if getattr(norm, "bias", None) is not None:
            norm.bias.zero_()

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return self._norm[0](f)

    def extra_repr(self) -> str:
        return f"init_value={self.init_value}"
