"""The residual-site interface shared by every variant.

A pre-norm ViT block has two residual sites (attention, MLP). At each one the block computes

    u = Norm(x)          # skipped when a variant asks for the normalisation-free form
    f = Branch(u)        # attention or MLP
    x = x + DropPath(Δ)  # Δ = site(x, u, f, history)

so a variant only says what update ``Δ = x_new − x`` its formula adds to the stream. Dropping Δ (not f) is the
spec's DropPath convention: with drop probability 1 every variant reduces to its skip path exactly.

Variants that need more than one site's view (ReZero's α shared by both sublayers, LAuReL at block granularity,
LAuReL-PA's previous activations, DCA's stack of block outputs, DeepNorm's post-norm block and its dropped final
norm) override the ``build_*`` / ``uses_final_norm`` class methods below instead of adding ``if variant == ...``
branches to the backbone.
"""

from __future__ import annotations

import functools
import inspect
import math
from typing import Any, ClassVar, NamedTuple

import torch
from timm.layers import RmsNorm
from torch import nn

from ..blocks import Block, BlockArgs, ResidualStream


class SiteTerms(NamedTuple):
    """What the diagnostics read from one call of a residual site (``diagnostic_terms``), in the stream view:
    the stream ``x`` entering it, the ``branch`` term it adds, its whole ``update`` Δ, the ``skip`` scale, the
    variant's own ``params`` (``ResidualSite.diagnostics``) and its n×n stream ``mixing`` (multi-stream sites;
    else None)."""

    x: torch.Tensor
    branch: torch.Tensor
    update: torch.Tensor
    skip: torch.Tensor | float
    params: dict[str, torch.Tensor]
    mixing: torch.Tensor | None = None


class ResidualSite(nn.Module):
    """Base class of a residual connection: ``forward`` returns the update Δ added to the stream.

    Subclasses declare their options as keyword-only, typed ``__init__`` arguments after ``dim, *, args``;
    ``options()`` reads them from the signature, so validation and the CLI never list them twice.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    #: Training settings (run-config field names) the paper trains this design with where they differ from the
    #: usual recipe — e.g. nGPT: no weight decay, no warm-up. A study row of this residual takes them over the
    #: study's base; the row's own ``overrides`` still win (``ablations.studies.spec.StudySpec.config_for``).
    paper_training: ClassVar[dict[str, Any]] = {}
    #: Whether the variant initialises the blocks' output projections (``attn.proj``, ``mlp.fc2``) itself, as its
    #: paper's init: a parametrisation's init that rescales them (``init="megatron"``) is refused with it.
    own_output_init: ClassVar[bool] = False
    #: Options added to this class after runs recorded their form, each with the value that builds what the class
    #: built before it existed: ``lit_modules.vit.upgraded_form`` fills them into an older recorded form, so a new
    #: option whose default keeps the old behaviour does not make every stored run an "earlier form" (one whose
    #: default changes the behaviour does). Add an entry for every option a variant gains.
    added_options: ClassVar[dict[str, Any]] = {}

    def __init__(self, dim: int, *, args: BlockArgs) -> None:
        super().__init__()
        self.dim = dim
        self.layer = args.layer

    # --- the formula ----------------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor, history: list | None = None) -> torch.Tensor:
        raise NotImplementedError

    def decompose(self, x: torch.Tensor, u: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | float]:
        """(branch term, skip scale) for the diagnostics: what the branch adds to the stream (γ⊙F, α·F, t⊙F, ...)
        and the factor the skip multiplies x by (1 − t, β, s, ...; 1 when the skip is the identity). CaiT's ratio
        is ‖branch term‖/‖x‖; the skip's rescaling is reported on its own. Default: the update is all branch."""
        return self.forward(x, u, f), 1.0

    @property
    def pre_norm(self) -> bool:
        """Whether the block normalises the stream before the branch (False: normalisation-free form)."""
        return True

    def init_weights(self) -> None:
        """Initialise this site's own parameters (called by timm's init after the Linear layers)."""

    def no_weight_decay(self) -> set[str]:
        """Names (relative to this module) of parameters that must not be weight-decayed."""
        return {n for n, p in self.named_parameters(recurse=False) if p.ndim <= 1}

    def diagnostics(self, x: torch.Tensor | None = None, u: torch.Tensor | None = None,
                    f: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The variant's own parameters as scalars to log (γ mean/std, α, β, ...); given the site's stream input
        ``x``, normalised input ``u`` and branch output ``f`` from a diagnostic batch (``collect_diagnostics``
        passes all three), also activation statistics (gate means, Ortho's parallel/orthogonal split of f).
        Every override accepts the three, each optional."""
        return {}

    def diagnostic_terms(self, args: tuple, output: torch.Tensor) -> SiteTerms:
        """The terms of one call, for a forward hook that saw inputs ``(x, u, f, history)`` and the update Δ:
        ``decompose``, ``diagnostics`` (an override without ``f``, the older two-argument form, gets ``(x, u)``)
        and ``stream_mixing``, every tensor in the ``stream_view``."""
        x, u, f = args[0], args[1], args[2]
        branch, skip = self.decompose(x, u, f)
        takes_f = "f" in inspect.signature(self.diagnostics).parameters
        params = self.diagnostics(x, u, f) if takes_f else self.diagnostics(x, u)
        view = self.stream_view
        return SiteTerms(view(x), view(branch), view(output), skip, params, self.stream_mixing(x))

    def stream_view(self, t: torch.Tensor) -> torch.Tensor:
        """What the diagnostics call the stream, for a tensor in this site's stream layout (x, the branch term,
        Δ): the tensor itself; multi-stream sites (Hyper-Connections, mHC) return the mean over their n streams."""
        return t

    def stream_mixing(self, x: torch.Tensor | None = None) -> torch.Tensor | None:
        """The n×n matrix this site mixes its n residual streams with (H' = M·H + ...), averaged over the tokens of
        ``x`` when it depends on the input; None for a single-stream residual. The diagnostics multiply these over
        depth into the composite gain."""
        return None

    # --- construction hooks (class methods so the backbone stays variant-agnostic) --------------------------
    @classmethod
    def options(cls) -> dict[str, inspect.Parameter]:
        """The variant's own options: the keyword-only arguments of ``__init__`` after ``args``."""
        params = inspect.signature(cls.__init__).parameters
        return {n: p for n, p in params.items() if p.kind is p.KEYWORD_ONLY and n != "args"}

    @classmethod
    def validate_options(cls, options: dict[str, Any], backbone: dict[str, Any] | None = None) -> dict[str, Any]:
        """Reject options that belong to another variant, and options given explicitly that the chosen form does
        not use (``inapplicable_options``; given ``backbone``, the other backbone fields such as
        ``class_attention_blocks``: ``inapplicable_with_backbone``): two labels must never be the same model.
        Return the options with defaults filled in."""
        valid = cls.options()
        for key in options:
            if key not in valid:
                owners = sorted(n for n, c in _registry().items() if key in c.options())
                where = f" (it belongs to {', '.join(owners)})" if owners else ""
                choices = ", ".join(sorted(valid)) or "none"
                raise ValueError(f"option '{key}' is not valid for residual '{cls.name}'{where}; "
                                 f"valid options: {choices}")
        filled = {n: options.get(n, p.default) for n, p in valid.items()}
        unused = cls.inapplicable_options(filled) | cls.inapplicable_with_backbone(filled, backbone or {})
        for key in options:
            if key in unused:
                raise ValueError(f"option '{key}' does not apply to residual '{cls.name}' with {unused[key]}")
        return filled

    @classmethod
    def inapplicable_options(cls, options: dict[str, Any]) -> dict[str, str]:
        """The options the model built from ``options`` (defaults filled in) would ignore, each with the rest of a
        one-line error: the setting that makes it unused and where it applies (``"form='rw'; it applies to
        form lr, rw_lr"``). Default: every option always applies."""
        return {}

    @classmethod
    def inapplicable_with_backbone(cls, options: dict[str, Any], backbone: dict[str, Any]) -> dict[str, str]:
        """As ``inapplicable_options``, for options the rest of the backbone (``backbone``: RunConfig /
        ``VisionTransformer`` fields, e.g. ``class_attention_blocks``) makes unused. Default: none."""
        return {}

    @classmethod
    def check_options(cls, options: dict[str, Any], dim: int, depth: int) -> None:
        """Validate option values against the model size; raise ValueError naming the problem."""

    @classmethod
    def build_sites(cls, args: BlockArgs, **options: Any) -> tuple[nn.Module, nn.Module]:
        """The two sites of one block (attention, MLP)."""
        return cls(args.dim, args=args, **options), cls(args.dim, args=args, **options)

    @classmethod
    def build_block(cls, args: BlockArgs, **options: Any) -> nn.Module:
        return Block(args, sites=cls.build_sites(args, **options))

    @classmethod
    def build_stream(cls, dim: int, depth: int, norm_layer: Any, **options: Any) -> nn.Module:
        """How block outputs are chained: a plain residual stream unless the variant needs history."""
        return ResidualStream()

    @classmethod
    def build_head(cls, dim: int, num_classes: int, **options: Any) -> nn.Module:
        """The classifier head (``num_classes > 0``): timm's ``nn.Linear``; nGPT's scaled unit-row head overrides."""
        return nn.Linear(dim, num_classes)

    @classmethod
    def project_parameters(cls, model: nn.Module, **options: Any) -> None:
        """Put the model's parameters back on the variant's constraint set (nGPT: unit-norm matrices). Called by the
        backbone after its init (``VisionTransformer.project_parameters``) and by the LightningModule after every
        optimiser step. Default: no constraint."""

    @classmethod
    def uses_final_norm(cls, **options: Any) -> bool:
        """Whether the backbone normalises the stream before the head (timm's ``norm``/``fc_norm``). True for
        pre-norm streams; a post-LN variant whose last block already ends in a norm (DeepNorm) may say False."""
        return True

    @classmethod
    def uses_embedding_norm(cls, **options: Any) -> bool:
        """Whether the backbone normalises the embeddings (patches + position, class token) before the first block
        (timm's ``norm_pre``). False by default; Peri-LN's optional embedding norm says True."""
        return False


class OptionalFinalNorm:
    """Mixin for a site whose network's last sublayer already ends in a norm (post-LN forms): the ``final_norm``
    option (False: the backbone's final norm before the head is dropped; True: timm's is kept, an adaptation),
    rejected with a class-attention head, whose pre-norm CA blocks always keep it. Put it before ``ResidualSite``
    in the bases; ``check_options`` calls ``check_final_norm``."""

    name: str

    @classmethod
    def check_final_norm(cls, options: dict[str, Any]) -> None:
        if not isinstance(options["final_norm"], bool):
            raise ValueError(f"final_norm={options['final_norm']!r} is not valid for {cls.name}; valid: True, False")

    @classmethod
    def inapplicable_with_backbone(cls, options: dict[str, Any], backbone: dict[str, Any]) -> dict[str, str]:
        blocks = backbone.get("class_attention_blocks", 0)
        if blocks:
            return {"final_norm": f"class_attention_blocks={blocks} (the class-attention head always keeps the "
                                  f"final norm); it applies with class_attention_blocks=0"}
        return {}

    @classmethod
    def uses_final_norm(cls, **options: Any) -> bool:
        return options["final_norm"]


def _registry() -> dict[str, type[ResidualSite]]:
    from . import RESIDUALS

    return RESIDUALS


def unused_by_form(options: dict[str, Any], applies: dict[str, tuple[str, ...]], forms: tuple[str, ...],
                   key: str = "form") -> dict[str, str]:
    """``inapplicable_options`` from a table {option: the values of ``key`` (the form) under which it applies};
    an unknown form is reported first (``check_choice`` against ``forms``)."""
    form = options[key]
    check_choice(key, form, forms)
    return {name: f"{key}={form!r}; it applies to {key} {', '.join(where)}"
            for name, where in applies.items() if form not in where}


def check_choice(name: str, value: Any, choices: tuple) -> None:
    """One-line ValueError for a value outside a fixed set of choices."""
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not valid; valid choices: {', '.join(map(str, choices))}")


def check_auto_or_positive(name: str, value: Any, variant: str) -> None:
    """One-line ValueError unless ``value`` is ``"auto"`` or a finite float > 0 (a constant the paper derives from
    the depth, or an override)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (value == "auto" or (number and value > 0 and math.isfinite(value))):
        raise ValueError(f"{name}={value!r} is not valid for {variant}; valid: 'auto' or a float > 0")


def inverse_scale(norm: nn.Module, x: torch.Tensor) -> torch.Tensor | float:
    """The per-token factor 1/σ a LayerNorm or RMSNorm ``norm`` multiplies its (centred) input ``x`` by (LayerNorm:
    σ² = var x + ε; RMSNorm: mean x² + ε), (..., 1); 1.0 for any other layer (a normalisation-free map). The skip
    scale of a site whose update ends in such a norm: ``decompose``'s Δ = b + (1/σ − 1)·x."""
    if isinstance(norm, nn.LayerNorm):
        return torch.rsqrt(x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)
    if isinstance(norm, RmsNorm):
        return torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + norm.eps)
    return 1.0


def inverse_rms(v: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / sqrt(mean(v²) + ε) over the last dimension, the factor RMSNorm scales by: (..., D) -> (...). A variant
    whose normalised input only feeds a linear map applies it to the map's (small) output instead."""
    if torch._C._functorch.is_batchedtensor(v):  # under torch.func.vmap (stacked runs): the Function has no vmap
        return torch.rsqrt(torch.linalg.vecdot(v, v) / v.shape[-1] + eps)  # rule; vecdot is the same sum
    return torch.rsqrt(SumOfSquares.apply(v) / v.shape[-1] + eps)


def one_dtype(method):
    """For the ``forward`` and ``backward`` of a hand-written autograd Function: its floating-point tensor arguments
    cast to their promoted dtype and autocast off inside, so the backward sees the dtypes the forward computed in.
    Under bf16 autocast the forward's products ran in bf16 while its saved inputs stayed fp32, and the backward's
    products of the two failed ("expected scalar type Float but found BFloat16"). So these Functions compute in
    their inputs' widest dtype (the multi-stream bookkeeping in fp32 under ``bf16-mixed``, as autocast keeps
    element-wise work in fp32); the sublayers around them still autocast. Inputs of one dtype pass unchanged."""

    @functools.wraps(method)
    def wrapped(ctx: Any, *args: Any) -> Any:
        tensors = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
        args = tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
        device = tensors[0].device.type
        if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):  # not on "meta"
            with torch.autocast(device, enabled=False):
                return method(ctx, *args)
        return method(ctx, *args)

    return wrapped


class SumOfSquares(torch.autograd.Function):
    """Σ v² over the last dimension, with the backward written out: ∂v = 2g·v, one multiply. Autograd through
    ``vecdot(v, v)`` multiplies by v once per operand and adds the two (three passes over v; square-then-sum
    takes longer still on a CPU). Values and gradients are bit-identical to ``vecdot(v, v)``'s: 2g·v is exactly
    g·v + g·v in floating point."""

    @staticmethod
    @one_dtype
    def forward(ctx: Any, v: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(v)
        return torch.linalg.vecdot(v, v)

    @staticmethod
    @torch.autograd.function.once_differentiable
    @one_dtype
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (v,) = ctx.saved_tensors
        return v * (2.0 * grad).unsqueeze(-1)
