"""Peri-LN (Kim et al., "Peri-LN: Revisiting Normalization Layer in the Transformer Architecture", arXiv 2502.02732)."""

from __future__ import annotations

from typing import Any

import torch

from .base import BlockArgs, ResidualSite


class PeriLN(ResidualSite):
    """Peri-LN ("sandwich" norm; Gemma-2's block, OLMo-core's ``PeriNormTransformerBlock``): a norm on both sides
    of every sublayer,

        x ← x + LN_out(F(LN_in x)),   Δ = LN_out(f),  f = F(u), u = LN_in x

    ``LN_in`` is the block's pre-norm (timm's ``norm1``/``norm2``, so a timm checkpoint's norms load into it),
    ``LN_out`` is this site's own ``norm`` (gain 1, bias 0 at init, as the paper's LayerNorm; x-transformers'
    ``sandwich_norm``), of the backbone's norm kind. The stream is never normalised, so the final norm before the
    head is kept (the paper keeps its final LN). DropPath drops Δ (the standard placement).

    ``embedding_norm``: False (default) / True — the paper's optional norm of the embeddings before the first block
    (``y_0 = Norm(x_0)``: the backbone's ``norm_pre``, after the position embedding, of the backbone's norm kind,
    gain 1 and bias 0).
    """

    name = "peri_ln"
    paper = "Kim et al. 2025 (Peri-LN), arXiv 2502.02732"

    def __init__(self, dim: int, *, args: BlockArgs, embedding_norm: bool = False) -> None:
        super().__init__(dim, args=args)
        self.norm = args.norm_layer(dim)

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        if not isinstance(options["embedding_norm"], bool):
            raise ValueError(f"embedding_norm={options['embedding_norm']!r} is not valid for peri_ln; valid: True, "
                             "False")

    @classmethod
    def uses_embedding_norm(cls, **options: Any) -> bool:
        return options["embedding_norm"]

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return self.norm(f)

    def no_weight_decay(self) -> set[str]:
        return set()  # the output norm's gain and bias are 1-D: timm's rule already leaves them undecayed
