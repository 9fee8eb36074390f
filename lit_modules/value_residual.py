"""Value residual learning (ResFormer; Zhou et al., "Value Residual Learning", arXiv 2410.17897, ACL 2025).

Every self-attention layer after the first mixes the **first layer's values** into its own before attending:

    V_n ← λ₁ · V_1 + λ₂ · V_n        (every layer but the first; V = the value projection of the layer's input)
    U_n = softmax(Q_n K_nᵀ / √d) · V_n

A backbone option (``VisionTransformer(value_residual=...)``, names in ``lit_modules.names``), orthogonal to the
residual variant: it changes the values an attention mixes, not the residual sum, so it combines with every
variant and with both attention kinds (``SelfAttention``, ``ReAttention``; DCA's cross-attention too).

How the first layer's values reach the others, without branches in the blocks: every attention of the model
holds a ``value_residual`` module (``BlockArgs.attention()`` sets it from the backbone's factory), applied to its
per-head values (B, H, N, d) right after the qkv projection. All of one model share a :class:`ValueState`;
the backbone opens it before its stream runs and closes it afterwards, so "V_1" is always the values of **the
first call of layer 0 in the current forward**:

- layer 0: :class:`FirstValues` records its values on its first call of a forward and uses them unchanged;
- layers n ≥ 1: :class:`FixedMix` (λ₁ = λ₂ = 0.5, the paper's ResFormer) or :class:`LearnedMix` (λ₁, λ₂
  learned scalars per layer, both 0.5 at init, so the learned form starts as the fixed one);
- ``value_residual="none"``: :class:`NoValueResidual` everywhere (the identity; no parameters, no keys).

Blocks that run their attention more than once per forward (SkipDense: block l runs it on l + 1 stream states)
mix the same V_1 into every call; DCA's layer 0 records the values of its composed value input. The class-
attention blocks (CaiT head, timm's ``ClassAttn``) are not self-attention layers and are left unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .names import VALUE_RESIDUAL_NAMES


class ValueState:
    """The first layer's values of the forward in progress, shared by every attention of one model (a plain
    object, not a module: nothing to save, nothing to move between devices)."""

    def __init__(self) -> None:
        self.first: torch.Tensor | None = None

    def open(self) -> None:
        """Start a forward: the next layer-0 call records V_1."""
        self.first = None

    def close(self) -> None:
        """End a forward: drop the reference to V_1 (and to its autograd graph)."""
        self.first = None


class NoValueResidual(nn.Module):
    """``value_residual="none"``: the values are used as they are."""

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return v


class FirstValues(nn.Module):
    """Layer 0: V_1 is recorded on the first call of a forward (later calls in the same forward leave it)."""

    def __init__(self, state: ValueState) -> None:
        super().__init__()
        self.state = state

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        if self.state.first is None:
            self.state.first = v
        return v


class FixedMix(nn.Module):
    """Layer n ≥ 1 of ResFormer: ``V_n ← λ₁ V_1 + λ₂ V_n`` with the paper's fixed λ₁ = λ₂ = 0.5."""

    def __init__(self, state: ValueState, layer: int) -> None:
        super().__init__()
        self.state, self.layer = state, layer

    def weights(self) -> tuple[torch.Tensor | float, torch.Tensor | float]:
        return 0.5, 0.5

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        first = self.state.first
        if first is None:
            raise RuntimeError(f"value residual: attention layer {self.layer} ran before layer 0 in this forward; "
                               "call the VisionTransformer (it opens the per-forward state), not a block alone")
        lambda1, lambda2 = self.weights()
        return lambda1 * first + lambda2 * v

    def extra_repr(self) -> str:
        return f"layer={self.layer}"


class LearnedMix(FixedMix):
    """Layer n ≥ 1, learned form: ``V_n ← λ₁ V_1 + λ₂ V_n`` with λ = ``lambdas`` (2 unconstrained scalars per
    layer), 0.5 each at init (the fixed form), excluded from weight decay."""

    def __init__(self, state: ValueState, layer: int) -> None:
        super().__init__(state, layer)
        self.lambdas = nn.Parameter(torch.full((2,), 0.5))

    def init_weights(self) -> None:
        nn.init.constant_(self.lambdas, 0.5)

    def no_weight_decay(self) -> set[str]:
        return {"lambdas"}

    def weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lambdas[0], self.lambdas[1]


_LATER_LAYERS: dict[str, type[FixedMix]] = {"fixed": FixedMix, "learned": LearnedMix}


def no_value_residual(layer: int) -> nn.Module:
    """The default factory of ``BlockArgs.value_residual``: no mixing at any layer."""
    return NoValueResidual()


def value_residual_factory(mode: str, state: ValueState) -> Callable[[int], nn.Module]:
    """``layer -> module`` for ``BlockArgs.value_residual``; ``mode`` one of ``VALUE_RESIDUAL_NAMES``
    (one-line ValueError naming the valid choices otherwise)."""
    if mode not in VALUE_RESIDUAL_NAMES:
        raise ValueError(f"unknown value_residual {mode!r}; valid choices: {', '.join(VALUE_RESIDUAL_NAMES)}")
    if mode == "none":
        return no_value_residual
    later = _LATER_LAYERS[mode]

    def build(layer: int) -> nn.Module:
        return FirstValues(state) if layer == 0 else later(state, layer)

    return build
