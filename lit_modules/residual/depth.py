"""Shared machinery of the depth-aggregating variants — DCA (``dca``), DenseFormer (``denseformer``) and Attention
Residuals (``attn_res``): each feeds a consumer (a block, a sublayer, the head) a learned combination of the
**earlier representations** [v_0 = the embeddings, v_1, …] instead of the running residual stream.

- ``stack_sources``: the list of earlier representations as one (B, N, t, D) stack (DCA's layout);
- ``weighted_sum``: Σ_t w_t v_t over the list itself (DenseFormer's and Attention Residuals' combination);
- ``final_args``: the ``BlockArgs`` of the consumer after the last block (the combination the head reads);
- ``DepthWeights``: the mixin of a module that combines earlier representations and reports, per consumer, the
  mean weight it gives each of them — one row of the depth × depth heat map the diagnostics draw
  (``diag/depth_weights``); ``depth_weight_matrix`` assembles the rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from .base import BlockArgs


def stack_sources(sources: Sequence[Tensor]) -> Tensor:
    """[v_0, …, v_{t−1}], each (B, N, D) → the stack (B, N, t, D)."""
    return torch.stack(list(sources), dim=2)


def weighted_sum(sources: Sequence[Tensor], weights: Sequence[Tensor]) -> Tensor:
    """Σ_t w_t · v_t, each weight broadcast against its source (a scalar, or (B, N, 1) per token). A chain of
    fused multiply-adds over the list, not an einsum over ``stack_sources``: the stack's copy and its backward's
    scatter into the sources cost as much as the sum itself (2-3x the time on a CPU, forward and backward)."""
    h = sources[0] * weights[0]
    for v, w in zip(sources[1:], weights[1:], strict=True):
        h = torch.addcmul(h, v, w)
    return h


def final_args(dim: int, depth: int, norm_layer: Any) -> BlockArgs:
    """``BlockArgs`` of the consumer that follows the last block (``layer = depth``), e.g. the final GRN or the
    final Attention-Residuals aggregation before the head; it has no attention or MLP of its own."""
    return BlockArgs(dim=dim, num_heads=1, mlp_ratio=0, qkv_bias=False, qk_norm=False, proj_drop=0, attn_drop=0,
                     drop_path=0, norm_layer=norm_layer, act_layer=None, layer=depth, depth=depth,
                     num_prefix_tokens=0)


def norm_eps(norm_layer: Any, default: float = 1e-6) -> float:
    """The ε the backbone's norm layer is built with (``partial(cls, eps=…)``), for a variant's own norms."""
    return float(getattr(norm_layer, "keywords", {}).get("eps", default))


def depth_row(values: Tensor, width: int, columns: Sequence[int] | None = None) -> Tensor:
    """One consumer's row of the depth-weight matrix: ``values`` at ``columns`` (default 0 … len − 1), NaN in every
    other column (no such input). float32, on the values' device, detached."""
    row = torch.full((width,), float("nan"), dtype=torch.float32, device=values.device)
    index = range(len(values)) if columns is None else columns
    row[torch.as_tensor(list(index), dtype=torch.long, device=values.device)] = values.detach().float()
    return row


class DepthWeights:
    """Mixin of a module that combines earlier representations (a DCA GRN, a DenseFormer DWA, an Attention
    Residuals aggregation). Set by the module (or its builder):

    - ``depth_index``: its row in the model's depth-weight matrix (the consumer's position in forward order);
    - ``depth_extent``: (rows, columns) of that whole matrix, the same for every aggregator of one model;
    - ``depth_label``: the row's label (``"block 3"``, ``"mlp 1"``, ``"out"``);
    - ``depth_columns`` (class attribute): what the columns are, for the plot's axis.

    ``depth_weights(*inputs)`` takes the module's own forward inputs (the diagnostics call it from a forward hook)
    and returns its row: the mean weight given to each column over the batch, tokens (and channels), NaN where the
    module has no such input.
    """

    depth_columns: ClassVar[str] = "source j (0 = embeddings)"
    depth_index: int = 0
    depth_extent: tuple[int, int] = (0, 0)
    depth_label: str = ""

    def set_depth(self, index: int, extent: tuple[int, int], label: str) -> None:
        self.depth_index, self.depth_extent, self.depth_label = int(index), (int(extent[0]), int(extent[1])), label

    def depth_weights(self, *inputs: Any) -> Tensor:
        raise NotImplementedError


def depth_weight_matrix(rows: Mapping[int, Tensor], extent: tuple[int, int]) -> Tensor:
    """(rows, columns) float32 CPU matrix from {row index: row}; NaN where no consumer reported."""
    matrix = torch.full(extent, float("nan"), dtype=torch.float32)
    for index, row in rows.items():
        matrix[index, : len(row)] = row.detach().float().cpu()
    return matrix
