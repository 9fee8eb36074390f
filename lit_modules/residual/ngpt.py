"""nGPT / normalized ViT (Loshchilov, Hsieh, Sun & Ginsburg, "nGPT: Normalized Transformer with Representation
Learning on the Hypersphere", arXiv 2410.01131)."""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import nn

from .base import BlockArgs, ResidualSite

ALPHA_INITS = ("paper", "inverse_depth")


def unit(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """t / ‖t‖ along ``dim`` (the paper's Norm; ε = 1e-12 only guards an all-zero vector)."""
    return F.normalize(t, p=2.0, dim=dim, eps=1e-12)


class ScaledVector(nn.Module):
    """A learned vector stored at a different scale than it is used (the paper's §2.6 "s_init / s_scale"
    parametrisation): ``value = param · init / scale`` with ``param`` starting at ``scale``, so the effective
    vector starts at ``init`` and Adam's step on it is ``init / scale`` times larger than on a plain parameter."""

    def __init__(self, shape: tuple[int, ...], init: float, scale: float) -> None:
        super().__init__()
        self.init, self.scale = float(init), float(scale)
        self.param = nn.Parameter(torch.full(shape, self.scale))

    def forward(self) -> torch.Tensor:
        return self.param * (self.init / self.scale)

    def no_weight_decay(self) -> set[str]:
        """Never decayed, whatever its shape (s_qk is (H, 1, d), which timm's ndim rule alone would decay): the
        reference decays none of nGPT's scales, and per-channel scales are never decayed here."""
        return {"param"}

    def extra_repr(self) -> str:
        return f"shape={tuple(self.param.shape)}, init={self.init:.4g}, scale={self.scale:.4g}"


class QKNorm(nn.Module):
    """nGPT's query/key normalisation (eq. 15–16): each head's q (or k) put on the unit sphere and scaled by
    s_qk (one entry per head and channel, init 1, stored at scale 1/√d_model). The paper's softmax scale √d_k (in
    place of 1/√d_k) is folded in as a further √d_k on each of q and k, since the attention applies 1/√d_k:
    (√d_k s q̂)·(√d_k s k̂)/√d_k = √d_k (s q̂)·(s k̂)."""

    def __init__(self, head_dim: int, *, num_heads: int, model_dim: int, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.s_qk = ScaledVector((num_heads, 1, head_dim), init=1.0, scale=model_dim ** -0.5)
        self.fold = math.sqrt(head_dim)

    def forward(self, t: torch.Tensor) -> torch.Tensor:  # (B, H, N, d)
        return unit(t) * (self.s_qk() * self.fold)


class NormalizedMlp(nn.Module):
    """nGPT's MLP without biases, for the ViT's GELU MLP: h = W_2 GELU(s_u·√d_model ⊙ W_1 x), s_u init 1 (stored
    at scale 1). The paper's SwiGLU has two hidden projections, u and v, and scales v (the gate's input) by
    s_v·√d_model so the nonlinearity sees O(1) inputs (the rows of W_1 and x are unit vectors, so W_1 x are
    cosines); the single GELU input here gets that scaling (an adaptation). timm's names (``fc1``, ``fc2``)."""

    def __init__(self, dim: int, hidden: int, act_layer: Any, drop: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, bias=False)
        self.s_u = ScaledVector((hidden,), init=1.0, scale=1.0)
        self.act = act_layer()
        self.drop1 = nn.Dropout(drop)
        self.fc2 = nn.Linear(hidden, dim, bias=False)
        self.drop2 = nn.Dropout(drop)
        self.gain = math.sqrt(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop1(self.act(self.fc1(x) * (self.s_u() * self.gain)))
        return self.drop2(self.fc2(h))


class NormalizedBlock(nn.Module):
    """nGPT's block (eq. 10–11): no norm layers; the sites move the (unit) stream towards each normalised branch
    output and renormalise. The attention is the backbone's kind (``BlockArgs.attention()``) built with
    bias-free qkv, qk-norm = ``QKNorm`` and no output bias."""

    def __init__(self, args: BlockArgs, sites: tuple[nn.Module, nn.Module]) -> None:
        super().__init__()
        self.ls1, self.ls2 = sites
        qk = partial(QKNorm, num_heads=args.num_heads, model_dim=args.dim)
        self.norm1 = nn.Identity()
        self.attn = dataclasses.replace(args, qkv_bias=False, qk_norm=True, norm_layer=qk).attention()
        self.attn.proj.register_parameter("bias", None)
        self.norm2 = nn.Identity()
        self.mlp = NormalizedMlp(args.dim, int(args.dim * args.mlp_ratio), args.act_layer, args.proj_drop)

    def sites(self) -> dict[str, nn.Module]:
        return {"attn": self.ls1, "mlp": self.ls2}

    def forward(self, x: torch.Tensor, history: list | None = None) -> torch.Tensor:
        x = x + self.ls1(x, x, self.attn(x), history)
        return x + self.ls2(x, x, self.mlp(x), history)


class NormalizedStream(nn.Module):
    """Puts the embeddings (patch embedding + position embedding) on the unit sphere, then runs the blocks."""

    def forward(self, x: torch.Tensor, blocks: nn.ModuleList) -> torch.Tensor:
        x = unit(x)
        for blk in blocks:
            x = blk(x, None)
        return x


class NormalizedHead(nn.Linear):
    """nGPT's output (eq. 4 and §2.5): logits z = s_z ⊙ (E h), E's rows unit vectors (renormalised after every
    step), s_z one scale per class (init 1, stored at scale 1/√d_model), no bias. ``pool_norm``: the pooled token
    is put back on the sphere first (default: the paper's h is always a unit vector; average pooling is not);
    False feeds the mean of unit tokens as vit-pytorch's ``normalized_vit.py`` does."""

    def __init__(self, dim: int, num_classes: int, pool_norm: bool) -> None:
        super().__init__(dim, num_classes, bias=False)
        self.pool_norm = pool_norm
        self.s_z = ScaledVector((num_classes,), init=1.0, scale=dim ** -0.5)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.pool_norm:
            h = unit(h)
        return super().forward(h) * self.s_z()


class NGPT(ResidualSite):
    """nGPT's normalised residual: every hidden vector lives on the unit sphere and each sublayer moves it part of
    the way towards the (normalised) branch output,

        h ← Norm(h + α ⊙ (Norm(F(h)) − h)),   Δ = Norm(h + α ⊙ (Norm(f) − h)) − h,   f = F(h)

    (eq. 10–11), α ∈ R^D per sublayer ("eigen learning rates"), init α_init = 0.05, stored at scale 1/√d_model (§2.6).
    Choosing ``ngpt`` makes the whole backbone the paper's normalised Transformer:

    - no norm layers (blocks ``NormalizedBlock``, no final norm); the stream starts as Norm(patch + pos embedding);
    - attention: q and k normalised per head and scaled by s_qk, softmax scale √d_k (``QKNorm``), bias-free
      projections; MLP: bias-free, hidden scaled by s_u·√d_model (``NormalizedMlp``);
    - head: unit-row weights and per-class scale s_z (``NormalizedHead``), no bias;
    - **weight normalisation**: after init and after every optimiser step (``project_parameters``, called by the
      LightningModule's ``optimizer_step``) every matrix is put back on the sphere along the embedding dimension —
      the rows of qkv, fc1 and the head (input = embedding), the columns of the attention/MLP output projections,
      the patch embedding's per-pixel columns, and the position embeddings and class token per position.

    DropPath (the paper has none) drops the α-step inside the renormalisation, Norm(h + DropPath(α ⊙ (ĥ − h))): a
    dropped site is the identity, a kept one stays on the sphere.

    Options: ``alpha_init``: ``"paper"`` (default, 0.05, the paper's value for its 24- and 36-layer models) or
    ``"inverse_depth"`` (1/depth, vit-pytorch's ``residual_lerp_scale_init``). ``pool_norm``: see
    ``NormalizedHead``. ``decompose``: x_new = ((1 − α)·h + α·ĥ)/n per token with n the norm of the sum, so the
    skip scale is (1 − α)/n and the branch term α·ĥ/n.
    """

    name = "ngpt"
    paper = "Loshchilov et al. 2024 (nGPT), arXiv 2410.01131"
    paper_training = {"weight_decay": 0.0, "warmup_epochs": 0.0}  # the reference trains without either
    own_output_init = True  # weights normalised on the unit sphere after init and every step

    def __init__(self, dim: int, *, args: BlockArgs, alpha_init: str = "paper", pool_norm: bool = True) -> None:
        super().__init__(dim, args=args)
        init = 0.05 if alpha_init == "paper" else 1.0 / args.depth
        self.alpha = ScaledVector((dim,), init=init, scale=dim ** -0.5)
        self.drop_path = DropPath(args.drop_path) if args.drop_path > 0.0 else nn.Identity()

    @property
    def pre_norm(self) -> bool:
        return False

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        if options["alpha_init"] not in ALPHA_INITS:
            raise ValueError(f"alpha_init={options['alpha_init']!r} is not valid for ngpt; valid choices: "
                             f"{', '.join(ALPHA_INITS)}")
        if not isinstance(options["pool_norm"], bool):
            raise ValueError(f"pool_norm={options['pool_norm']!r} is not valid for ngpt; valid: True, False")

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        return NormalizedBlock(args, sites=cls.build_sites(args, **options))

    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        return NormalizedStream()

    @classmethod
    def uses_final_norm(cls, **options: Any) -> bool:
        return False

    @classmethod
    def build_head(cls, dim: int, num_classes: int, **options: Any) -> nn.Module:
        return NormalizedHead(dim, num_classes, options["pool_norm"])

    @classmethod
    @torch.no_grad()
    def project_parameters(cls, model: nn.Module, **options: Any) -> None:
        """Every matrix back on the unit sphere along the embedding dimension (the reference's
        ``normalize_matrices``, run after each optimiser step)."""
        def norm_(p: torch.Tensor, dim: int) -> None:
            p.copy_(unit(p, dim=dim))

        norm_(model.patch_embed.proj.weight, 0)  # (D, C, p, p): each input pixel's embedding vector
        norm_(model.pos_embed, -1)
        if model.cls_token is not None:
            norm_(model.cls_token, -1)
        for blk in model.blocks:
            norm_(blk.attn.qkv.weight, 1)  # (3D, D): rows read the stream
            norm_(blk.attn.proj.weight, 0)  # (D, D): columns write the stream
            norm_(blk.mlp.fc1.weight, 1)
            norm_(blk.mlp.fc2.weight, 0)
        if isinstance(model.head, NormalizedHead):
            norm_(model.head.weight, 1)

    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        return unit(x + self.drop_path(self.alpha() * (unit(f) - x))) - x

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        alpha = self.alpha()
        z = x + alpha * (unit(f) - x)
        inv = 1.0 / z.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        return alpha * unit(f) * inv, (1.0 - alpha) * inv

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        alpha = self.alpha().detach()
        return {"alpha_mean": alpha.mean(), "alpha_std": alpha.std(correction=0)}

    def extra_repr(self) -> str:
        return f"alpha_init={self.alpha.init:.4g}"
