"""DenseFormer: depth-weighted averaging (Pagliardini, Mohtashami, Fleuret & Jaggi, arXiv 2402.02622, NeurIPS 2024)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .base import BlockArgs
from .depth import DepthWeights, depth_row, weighted_sum
from .standard import Standard


class DenseFormer(Standard):
    """DenseFormer: after block i a **depth-weighted average** (DWA) of the embeddings and every block output so
    far becomes the next block's input,

        x_i = Block_i(y_{i−1}),   y_i = Σ_{j ≤ i} α_{i,j} x_j,   x_0 = y_0 = the embeddings,

    (1-based i here; the head reads y_L). The blocks are ordinary pre-norm blocks (their sites are the standard
    residual, ``Δ = F(u)``); only the stream changes (``DWAStream``). α_{i,i} = 1 and α_{i,j<i} = 0 at init, so the
    model equals the standard ViT (R-exact). The weights are scalars, one per (DWA, representation).

    Options, as the paper and ``epfml/DenseFormer`` (``DWAModules``): ``period`` p — a DWA only after the blocks
    i with i mod p = 0 (the others pass x_i on); ``dilation`` k — DWA i averages only the representations j ≡ i
    (mod k), j ≤ i: (i + k) // k weights. Defaults 1, 1: the plain DenseFormer.

    Weight decay: the α are **decayed** like matrices, as in the reference training code (each DWA is an
    ``nn.Linear`` weight in nanoGPT's decay group); stored (1, n) per DWA so timm's ndim rule decays them too.
    """

    name = "denseformer"
    paper = "Pagliardini et al. 2024, arXiv 2402.02622"

    def __init__(self, dim: int, *, args: BlockArgs, dilation: int = 1, period: int = 1) -> None:
        super().__init__(dim, args=args)

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        for key in ("dilation", "period"):
            value = options[key]
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= depth:
                raise ValueError(f"{key}={value!r} is not valid at depth {depth}; valid choices: integers 1..{depth}")

    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        return DWAStream(depth, dilation=options["dilation"], period=options["period"])


class DWA(nn.Module, DepthWeights):
    """The depth-weighted average after block ``block`` (0-based): y = Σ_k α_k x_{j_k} over the representations
    j_k ∈ ``columns`` = {j ≤ r : j ≡ r (mod dilation)}, r = block + 1 (x_0 = the embeddings, x_r = the output of
    block r − 1 in 0-based numbering). ``alpha`` (1, n) starts as (0, …, 0, 1): y = x_r."""

    depth_columns = "representation j (0 = embeddings, j = output of block j − 1)"

    def __init__(self, block: int, depth: int, dilation: int) -> None:
        super().__init__()
        r = block + 1
        self.columns = list(range(r % dilation, r + 1, dilation))  # (r + dilation) // dilation of them
        self.alpha = nn.Parameter(torch.empty(1, len(self.columns)))
        self.set_depth(block, (depth, depth + 1), f"block {block}")
        self.init_weights()

    def init_weights(self) -> None:
        with torch.no_grad():
            self.alpha.zero_()
            self.alpha[0, -1] = 1.0

    def forward(self, reps: list[torch.Tensor]) -> torch.Tensor:
        return weighted_sum([reps[j] for j in self.columns], self.alpha[0].to(reps[0].dtype).unbind())

    def depth_weights(self, reps: list[torch.Tensor] | None = None) -> torch.Tensor:
        """α as a row of the (L, L + 1) matrix: column j = representation x_j, NaN off the dilation's residues."""
        return depth_row(self.alpha[0], self.depth_extent[1], self.columns)


class DWAStream(nn.Module):
    """Chains ordinary blocks, keeping every representation [x_0, x_1, …]; after each block i with
    (i + 1) mod period = 0 (0-based) its DWA replaces the block output as the next input. ``dwa`` holds the DWAs
    by block index (``stream.dwa.{i}.alpha``)."""

    def __init__(self, depth: int, dilation: int = 1, period: int = 1) -> None:
        super().__init__()
        self.dwa = nn.ModuleDict({str(i): DWA(i, depth, dilation) for i in range(depth) if (i + 1) % period == 0})

    def forward(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        reps = [x]
        for i, blk in enumerate(blocks):
            x = blk(x)
            reps.append(x)
            if str(i) in self.dwa:
                x = self.dwa[str(i)](reps)
        return x
