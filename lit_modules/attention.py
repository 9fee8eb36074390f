"""The attention of the self-attention blocks, chosen by name (``VisionTransformer(attention=...)``).

Orthogonal to the residual variant: every block a variant builds asks ``BlockArgs.attention()`` for its attention,
so any residual works with any attention kind. Both kinds keep timm's ``Attention`` parameter names (``qkv``,
``proj``, ``q_norm``, ``k_norm``, ``attn_drop``, ``proj_drop``) and, in the explicit path, pass the attention maps
the values are mixed with through ``attn_drop`` — where the diagnostics' forward hook reads them.
"""

from __future__ import annotations

import inspect
import math
import re
from functools import partial
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from timm.layers import Attention, LayerNorm
from torch import nn

from .names import ATTENTION_CLASSES, QK_NORM_CLASSES
from .value_residual import NoValueResidual

THETA_INITS = ("identity", "randn", "official")
GATES = ("none", "elementwise", "headwise")  # the attention's output gate (the backbone's ``attention_gate``)
HEAD_NORMS = ("batch", "layer", "none")


class SelfAttention(Attention):
    """Multi-head self-attention (Vaswani et al., arXiv 1706.03762): timm's ``Attention`` (same parameters, same
    function: fused SDPA or the explicit softmax through ``attn_drop``),

        Attention(Q, K, V) = softmax(QKᵀ/√d) · V   per head,

    computed by ``forward`` in four steps every attention kind shares: the qkv projection, the per-head norms
    (``q_norm``, ``k_norm``: the backbone's ``qk_norm``; ``v_norm``: the identity unless a variant normalises the
    values, HybridNorm) and ``value_residual`` on the per-head values (the identity unless the backbone mixes in
    the first layer's values: ResFormer, ``lit_modules.value_residual``), then ``attend``, the core on given
    per-head q, k, v, and ``merge_heads`` (the output gate, if any, then the heads side by side) — so a block that
    composes q, k and v from different inputs (DCA's cross-attention) runs any attention kind with the kind's own
    weights and fused/explicit switch.

    ``gate`` (the backbone's ``attention_gate``; Qiu et al., "Gated Attention for Large Language Models", arXiv
    2505.06708, its G1 position): each head's output is multiplied by a sigmoid gate computed from the attention's
    input X, o_h ← SDPA_h ⊙ σ(X W_g + b_g)_h — ``"elementwise"`` (W_g ∈ R^{D×D}, one gate per head channel: the
    paper's best form; timm's ``gated`` attention, same parameter ``gate``) or ``"headwise"`` (W_g ∈ R^{D×H}, one
    gate per head); the bias follows ``qkv_bias`` as in the reference, where the gate is part of the widened query
    projection. ``"none"`` (default): no gate.
    """

    name: ClassVar[str] = "self"
    paper: ClassVar[str] = "Vaswani et al. 2017, arXiv 1706.03762"
    #: Options added since runs recorded their form: see ``ResidualSite.added_options``.
    added_options: ClassVar[dict[str, Any]] = {}

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, qk_norm: bool = False,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, norm_layer: Any = None, gate: str = "none") -> None:
        if gate not in GATES:
            raise ValueError(f"attention_gate={gate!r} is not valid; valid choices: {', '.join(GATES)}")
        super().__init__(dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_norm=qk_norm, attn_drop=attn_drop,
                         proj_drop=proj_drop, norm_layer=norm_layer, gated=gate == "elementwise")
        self.gate_kind = gate
        if gate == "headwise":
            self.gate = nn.Linear(dim, num_heads, bias=qkv_bias)
        self.v_norm: nn.Module = nn.Identity()  # per-head value norm (HybridNorm's QKV-norm sets it)
        self.value_residual: nn.Module = NoValueResidual()  # replaced by ``BlockArgs.attention()`` (per layer)
        self.sdpa_scale: float | None = None  # the fused kernel's logit scale; None: its default 1/√d (= scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        out = self.attend(self.q_norm(q), self.k_norm(k), self.value_residual(self.v_norm(v)))
        return self.proj_drop(self.proj(self.merge_heads(out, x)))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(B, H, N, d) q, k, v → (B, H, N, d): fused SDPA, or the explicit softmax through ``attn_drop``."""
        if self.fused_attn:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0,
                                                  scale=self.sdpa_scale)
        return self.attn_drop((q * self.scale @ k.transpose(-2, -1)).softmax(dim=-1)) @ v

    def merge_heads(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The heads' outputs (B, H, N, d) side by side, (B, N, H·d), each multiplied first by its output gate
        σ(x W_g + b_g) computed from the attention's input ``x`` (B, N, D) when the attention is gated; then timm's
        ``norm`` (the identity here)."""
        B, H, N, d = out.shape
        out = out.transpose(1, 2)
        if self.gate is not None:
            out = out * torch.sigmoid(self.gate(x)).view(B, N, H, -1)
        return self.norm(out.reshape(B, N, H * d))

    # --- options (read from the keyword-only arguments of ``__init__``, as ``ResidualSite.options``) -------------
    @classmethod
    def options(cls) -> dict[str, inspect.Parameter]:
        params = inspect.signature(cls.__init__).parameters
        return {n: p for n, p in params.items() if p.kind is p.KEYWORD_ONLY}

    @classmethod
    def validate_options(cls, options: dict[str, Any], num_heads: int, depth: int | None = None) -> dict[str, Any]:
        """One-line ValueErrors for unknown options or values; the options with defaults filled in. ``depth``: the
        number of self-attention blocks, for options that choose blocks (checked when given)."""
        valid = cls.options()
        for key in options:
            if key not in valid:
                raise ValueError(f"option '{key}' is not valid for attention '{cls.name}'; "
                                 f"valid options: {', '.join(sorted(valid)) or 'none'}")
        return {n: options.get(n, p.default) for n, p in valid.items()}

    @classmethod
    def layer_for(cls, layer: int, depth: int, options: dict[str, Any]) -> Any:
        """The attention class (with its options bound) that block ``layer`` of ``depth`` uses: this kind in every
        block unless a kind chooses its blocks (Re-attention's ``blocks``)."""
        return partial(cls, **options) if options else cls

    def map_tap(self) -> tuple[nn.Module, bool]:
        """Where the diagnostics read this attention's maps (explicit path): (module, True = its input / False =
        its output). Self-attention: the output of ``attn_drop``, the post-softmax maps that weight the values."""
        return self.attn_drop, False


class ReAttention(SelfAttention):
    """Re-attention (DeepViT, Zhou et al., arXiv 2103.11886, eq. 4): the heads' attention maps are mixed by a
    learned H×H matrix before they weight the values,

        Re-Attention(Q, K, V) = Norm(Θᵀ · softmax(QKᵀ/√d)) · V,   Θ ∈ R^{H×H},

    i.e. regenerated map g = Norm(Σ_h Θ_{hg} A_h) for every head g (``reattn_weights`` = Θ[h, g]).

    ``head_norm``: ``"batch"`` (the paper: BatchNorm over the head dimension, statistics over batch and both
    token axes, running averages in eval mode; default), ``"layer"`` (lucidrains/vit-pytorch: LayerNorm over the
    H heads of each (query, key) entry; needs H ≥ 2) or ``"none"``. ``theta_init``: ``"identity"`` (default; with
    ``head_norm="none"`` the layer equals self-attention at init; the paper states no init), ``"official"`` (the
    official code, zhoudaquan/dvit_repo ``models/layers.py``: Θ is a 1×1 ``nn.Conv2d(H, H)`` left at PyTorch's
    default init, which its ``_init_weights`` (Linear and LayerNorm only) never touches — Kaiming-uniform with
    a = √5, i.e. Θ ~ U(−1/√H, 1/√H); the conv's bias, also U(−1/√H, 1/√H), is not kept: the BatchNorm over heads
    removes any per-head constant) or ``"randn"`` (lucidrains draws Θ from a standard normal).

    ``blocks``: which self-attention blocks use Re-attention, the others keeping plain self-attention:
    ``"all"`` (default: the paper's depth study, the official ``deepvit_patch16_224_re_attn_{16,24,32}b``) or
    ``"top:k"``, the last k blocks (the official DeepViT-S applies it to the top 5 of 16 blocks, ``"top:5"``, and
    DeepViT-L to the top 12 of 32, ``"top:12"``).

    The regenerated maps go through ``attn_drop`` (what the diagnostics record) and the maps are always computed
    explicitly (Θ must mix them): ``fused_attn`` has no effect here.
    """

    name: ClassVar[str] = "re_attention"
    paper: ClassVar[str] = "Zhou et al. 2021, arXiv 2103.11886"

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, qk_norm: bool = False,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, norm_layer: Any = None, gate: str = "none", *,
                 theta_init: str = "identity", head_norm: str = "batch", blocks: str = "all") -> None:
        super().__init__(dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_norm=qk_norm, attn_drop=attn_drop,
                         proj_drop=proj_drop, norm_layer=norm_layer, gate=gate)
        self.theta_init = theta_init
        self.reattn_weights = nn.Parameter(torch.empty(num_heads, num_heads))
        self.reattn_norm = {"batch": nn.BatchNorm2d, "layer": HeadLayerNorm, "none": _identity}[head_norm](num_heads)
        self.init_weights()

    @classmethod
    def validate_options(cls, options: dict[str, Any], num_heads: int, depth: int | None = None) -> dict[str, Any]:
        options = super().validate_options(options, num_heads, depth)
        for key, choices in (("theta_init", THETA_INITS), ("head_norm", HEAD_NORMS)):
            if options[key] not in choices:
                raise ValueError(f"{key}={options[key]!r} is not valid; valid choices: {', '.join(choices)}")
        if options["head_norm"] == "layer" and num_heads < 2:
            raise ValueError("head_norm='layer' normalises over the heads and needs num_heads >= 2 "
                             f"(got {num_heads}); use head_norm='batch' or 'none'")
        top = top_blocks(options["blocks"])
        if depth is not None and top is not None and top > depth:
            raise ValueError(f"blocks={options['blocks']!r} asks for more blocks than depth={depth}; valid: 'all' "
                             f"or 'top:k' with 1 <= k <= {depth}")
        return options

    @classmethod
    def layer_for(cls, layer: int, depth: int, options: dict[str, Any]) -> Any:
        top = top_blocks(options["blocks"])
        return SelfAttention if top is not None and layer < depth - top else partial(cls, **options)

    def map_tap(self) -> tuple[nn.Module, bool]:
        """The regenerated maps Θᵀ·softmax **before** the head norm (the input of ``reattn_norm``): the BatchNorm
        standardises each head's map over batch and tokens, so the cosine similarity of its output's columns across
        layers is ≈ 0 by construction and says nothing about collapse."""
        return self.reattn_norm, True

    def init_weights(self) -> None:
        """Θ = I, Θ ~ U(−1/√H, 1/√H) (``official``: a 1×1 conv's default init) or Θ ~ N(0, 1) (called by timm's
        init under this module's seeded generator)."""
        with torch.no_grad():
            if self.theta_init == "identity":
                self.reattn_weights.copy_(torch.eye(self.num_heads))
            elif self.theta_init == "official":  # Conv2d.reset_parameters: fan_in = H·1·1, bound 1/√H
                nn.init.kaiming_uniform_(self.reattn_weights, a=math.sqrt(5))
            else:
                self.reattn_weights.normal_()

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        attn = (q * self.scale @ k.transpose(-2, -1)).softmax(dim=-1)
        attn = torch.einsum("bhij,hg->bgij", attn, self.reattn_weights)
        return self.attn_drop(self.reattn_norm(attn)) @ v


class QKRMSNorm(nn.Module):
    """QK-norm as in ViT-5 (Wang et al., arXiv 2602.08071; wangf3014/ViT-5 ``models_vit5.py``, ``RMSNorm``): each
    head's query (or key) divided by its root mean square over the head dimension, computed in (at least) fp32,
    times a learned gain of size d shared by every head (init 1, no bias): q ← w ⊙ q / √(mean q² + ε)."""

    def __init__(self, dim: int, eps: float = 1e-6, **factory: Any) -> None:
        super().__init__()
        self.eps = float(eps)
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.promote_types(dtype, torch.float32))
        h = h * torch.rsqrt(h.square().mean(dim=-1, keepdim=True) + self.eps)
        return (self.weight * h.to(dtype)).to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps:g}"


class QKLayerNorm(LayerNorm):
    """QK-norm with a LayerNorm over each head's dimension (gain and bias of size d shared by the heads): timm's
    ``qk_norm=True`` with its LayerNorm, the form of ViT-22B (Dehghani et al., arXiv 2302.05442)."""


def top_blocks(blocks: Any) -> int | None:
    """k of Re-attention's ``blocks="top:k"``, None for ``"all"``; one-line ValueError otherwise."""
    if blocks == "all":
        return None
    match = re.fullmatch(r"top:([0-9]+)", blocks) if isinstance(blocks, str) else None
    if match is None or int(match.group(1)) < 1:
        raise ValueError(f"blocks={blocks!r} is not valid; valid: 'all' or 'top:k' (the last k blocks, k >= 1)")
    return int(match.group(1))


class HeadLayerNorm(nn.LayerNorm):
    """LayerNorm over the head dimension of (B, H, N, N) attention maps (lucidrains' Re-attention norm)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _identity(num_heads: int) -> nn.Module:
    return nn.Identity()


ATTENTIONS: dict[str, type[SelfAttention]] = {name: globals()[cls] for name, cls in ATTENTION_CLASSES.items()}
#: the backbone's ``qk_norm`` -> the norm of each head's queries and keys (None: no QK-norm)
QK_NORMS: dict[str, type[nn.Module] | None] = {name: globals()[cls] if cls else None
                                              for name, cls in QK_NORM_CLASSES.items()}
