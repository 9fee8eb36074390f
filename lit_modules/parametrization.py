"""How the backbone's initial scales, multipliers and per-parameter learning rates depend on its width and depth
(``VisionTransformer(parametrization=...)``): the standard parametrisation (timm's, everything as built) or
CompleteP (Dey et al., "Don't be lazy: CompleteP enables compute-efficient deep transformers", arXiv 2505.01618,
NeurIPS 2025), which makes the best learning rate transfer across depth and width.

A parametrisation is one class of this module behind ``lit_modules.names.PARAMETRIZATION_CLASSES``; its options are
the keyword-only arguments of ``__init__`` (as a residual variant's). The backbone asks it, at construction, for
the residual branches' multiplier (``branch_scale``, read by the standard residual site), the attention's logit
scale, the embedding and pre-head multipliers and the init of the hidden weights; the LightningModule asks the
backbone for its parameter groups, which the parametrisation annotates with each group's learning-rate and Adam-ε
multipliers (``lr_scale``, ``eps_scale``) and weight decay.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, ClassVar

import torch
from torch import nn

from .names import PARAMETRIZATION_CLASSES

#: the standard parametrisation's inits: timm's ViT init, or Megatron-LM's scaled init of the output projections
INITS = ("timm", "megatron")


class StandardParametrization:
    """The standard parametrisation: one learning rate and one ε for every parameter, the model initialised by
    ``init``: ``"timm"`` (default: timm's ViT init, every weight as built) or ``"megatron"`` (Megatron-LM's init,
    OLMo's ``full_megatron`` that HybridNorm's reference trains with: the blocks' output projections — the
    attention's ``proj`` and the MLP's ``fc2`` — drawn with std σ/√(2L) instead of σ, σ = timm's 0.02 for every
    hidden weight, L the blocks; the rest as timm's). Refused with a residual that initialises those projections
    itself (``ResidualSite.own_output_init``: DeepNorm, nGPT)."""

    name: ClassVar[str] = "standard"
    paper: ClassVar[str] = ""
    #: Options added since runs recorded their form: see ``ResidualSite.added_options``.
    added_options: ClassVar[dict[str, Any]] = {"init": "timm"}

    def __init__(self, *, depth: int, width: int, init: str = "timm") -> None:
        self.depth, self.width, self.init = depth, width, init

    # --- options ---------------------------------------------------------------------------------------------------
    @classmethod
    def options(cls) -> dict[str, inspect.Parameter]:
        params = inspect.signature(cls.__init__).parameters
        return {n: p for n, p in params.items() if p.kind is p.KEYWORD_ONLY and n not in ("depth", "width")}

    @classmethod
    def validate_options(cls, options: dict[str, Any], backbone: dict[str, Any]) -> dict[str, Any]:
        """One-line ValueErrors for an unknown option or value, or a backbone the parametrisation does not apply to;
        the options with defaults filled in."""
        valid = cls.options()
        for key in options:
            if key not in valid:
                raise ValueError(f"option '{key}' is not valid for parametrization '{cls.name}'; valid options: "
                                 f"{', '.join(sorted(valid)) or 'none'}")
        filled = {n: options.get(n, p.default) for n, p in valid.items()}
        if "init" in filled:
            if filled["init"] not in INITS:
                raise ValueError(f"init={filled['init']!r} is not valid for parametrization '{cls.name}'; valid: "
                                 + ", ".join(INITS))
            if filled["init"] != "timm" and backbone.get("own_output_init"):
                raise ValueError(f"init={filled['init']!r} does not apply to residual '{backbone.get('residual')}': "
                                 "it initialises the output projections itself; valid with it: init='timm'")
        return filled

    # --- what the backbone asks --------------------------------------------------------------------------------------
    @property
    def branch_scale(self) -> float:
        """The multiplier of every residual branch (Δ = m·F)."""
        return 1.0

    def attention_scale(self, head_dim: int) -> float | None:
        """The attention's logit scale; None: the attention's own 1/√d."""
        return None

    @property
    def input_multiplier(self) -> float:
        return 1.0

    @property
    def output_multiplier(self) -> float:
        return 1.0

    @torch.no_grad()
    def init_weights(self, model: nn.Module) -> None:
        """Rescale the model's initial weights (after the backbone's timm init): ``init="megatron"`` multiplies
        timm's draw of every block's output projections by 1/√(2L) (std 0.02 → 0.02/√(2L))."""
        if self.init == "megatron":
            for p in output_projections(model):
                p.mul_((2 * self.depth) ** -0.5)

    def param_groups(self, model: nn.Module, groups: list[dict]) -> list[dict]:
        """The optimiser's parameter groups (the backbone's weight-decay split), annotated."""
        return groups


EPS_SCOPES = ("blocks", "all")  # where CompleteP scales Adam's ε: the residual blocks (Table 1) or every group


class CompleteP(StandardParametrization):
    """CompleteP: μP for width and α = 1 depth scaling, with m_L = L/L_base (blocks) and m_N = D/D_base (width):

        x ← x + m_L^{−α} · F(LN x)                      every residual branch (α = 1: L_base/L)
        logits of the attention: q·k / d                 (μP's 1/d instead of 1/√d)
        hidden weights (every matrix of the blocks) initialised with std σ/√m_N (σ: timm's 0.02)
        embeddings × α_in,  pre-head features × α_out/m_N
        AdamW: hidden matrices lr η·m_N^{−1}·m_L^{α−1}, weight decay λ·m_N; hidden vectors (norms, biases)
        lr η·m_L^{α−1}, no decay; embeddings, final norm, head: lr η; the residual blocks' groups ε/(m_N·m_L^α)

    As the reference (EleutherAI/nanoGPT-mup, branch ``completep``, ``model.py``: ``Block.residual_scaling``,
    ``CausalSelfAttention``'s ``attention_scale``, the μP init, ``configure_optimizers``). At α = 1 the depth factor
    of the learning rates is m_L⁰ = 1: only the branch multiplier and ε carry the depth. At m_L = m_N = 1 the
    model is the standard pre-LN ViT except the 1/d attention scale (tested).

    Options: ``base_depth`` (2) and ``base_width`` (256): the base model the learning rate is tuned at (the
    reference's coordinate checks: depth 2, width 256); ``alpha`` ∈ [0.5, 1] (1: CompleteP; 0.5: the depth-μP
    exponent it is compared with); ``input_alpha``, ``output_alpha`` (1: the reference's tunable multipliers);
    ``eps_scope``: ``"blocks"`` (default, the paper's Table 1: "AdamW ε (residual blocks)" scaled, the embeddings,
    final norm and head at the base ε) or ``"all"`` (the reference code's ``configure_optimizers``: one scaled ε for
    every group). Applies to the standard residual only (the paper's pre-LN transformer), with timm's attention
    (Re-attention's head-mixing matrix is no linear layer of μP's: refused) and without a class-attention head;
    refused otherwise. The weight-decay split is the backbone's (position embedding, class token, norms, biases
    undecayed; the patch embedding and head decayed at λ); the reference also decays its position embedding.
    """

    name = "completep"
    paper = "Dey et al. 2025 (CompleteP), arXiv 2505.01618"

    def __init__(self, *, depth: int, width: int, base_depth: int = 2, base_width: int = 256, alpha: float = 1.0,
                 input_alpha: float = 1.0, output_alpha: float = 1.0, eps_scope: str = "blocks") -> None:
        super().__init__(depth=depth, width=width)
        self.base_depth, self.base_width, self.eps_scope = base_depth, base_width, eps_scope
        self.alpha, self.input_alpha, self.output_alpha = float(alpha), float(input_alpha), float(output_alpha)
        self.m_depth = depth / base_depth  # m_L
        self.m_width = width / base_width  # m_N

    @classmethod
    def validate_options(cls, options: dict[str, Any], backbone: dict[str, Any]) -> dict[str, Any]:
        filled = super().validate_options(options, backbone)
        if backbone.get("residual", "standard") != "standard":
            raise ValueError(f"parametrization 'completep' does not apply to residual '{backbone['residual']}': it "
                             f"scales the pre-LN residual branches; it applies to residual 'standard'")
        if backbone.get("norm_layer", "layernorm") == "seednorm":
            raise ValueError("parametrization 'completep' does not apply with norm_layer 'seednorm': its hidden-vector "
                             "rule (no decay) and SeeDNorm's decayed alpha and beta disagree; it applies with "
                             "layernorm, rmsnorm, dyt, derf")
        if backbone.get("attention", "self") != "self":
            raise ValueError(f"parametrization 'completep' does not apply with attention '{backbone['attention']}': "
                             f"its hidden matrices are the linear layers' weights; it applies with attention 'self'")
        if filled["eps_scope"] not in EPS_SCOPES:
            raise ValueError(f"eps_scope={filled['eps_scope']!r} is not valid for completep; valid: "
                             + ", ".join(EPS_SCOPES))
        if backbone.get("class_attention_blocks", 0):
            raise ValueError("parametrization 'completep' does not apply with class_attention_blocks > 0; it applies "
                             "with class_attention_blocks=0")
        for key in ("base_depth", "base_width"):
            value = filled[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{key}={value!r} is not valid for completep; valid: a positive integer")
        alpha = filled["alpha"]
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.5 <= alpha <= 1.0:
            raise ValueError(f"alpha={alpha!r} is not valid for completep; valid: a float in [0.5, 1] (1: CompleteP)")
        for key in ("input_alpha", "output_alpha"):
            value = filled[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{key}={value!r} is not valid for completep; valid: a float > 0")
        return filled

    @property
    def branch_scale(self) -> float:
        return self.m_depth ** -self.alpha

    def attention_scale(self, head_dim: int) -> float | None:
        return 1.0 / head_dim

    @property
    def input_multiplier(self) -> float:
        return self.input_alpha

    @property
    def output_multiplier(self) -> float:
        return self.output_alpha / self.m_width

    @torch.no_grad()
    def init_weights(self, model: nn.Module) -> None:
        """The hidden matrices (every ≥ 2-D parameter of the blocks) drawn with std σ/√m_N: timm's draw × 1/√m_N."""
        for p in hidden_parameters(model, matrices=True):
            p.mul_(self.m_width ** -0.5)

    def param_groups(self, model: nn.Module, groups: list[dict]) -> list[dict]:
        """Each of the backbone's groups split into hidden matrices, hidden vectors and the rest, with their
        ``lr_scale``, ``eps_scale`` and weight decay (the rest first: its learning rate is the base rate)."""
        matrices = {id(p) for p in hidden_parameters(model, matrices=True)}
        vectors = {id(p) for p in hidden_parameters(model, matrices=False)}
        depth_lr = self.m_depth ** (self.alpha - 1.0)
        block_eps = 1.0 / (self.m_width * self.m_depth ** self.alpha)
        out: list[dict] = []
        for kind in ("rest", "matrix", "vector"):
            for group in groups:
                params = [p for p in group["params"]
                          if (kind == "matrix") == (id(p) in matrices) and (kind == "vector") == (id(p) in vectors)]
                if not params:
                    continue
                wd, lr = group["weight_decay"], 1.0
                if kind == "matrix":
                    wd, lr = wd * self.m_width, depth_lr / self.m_width
                elif kind == "vector":
                    wd, lr = 0.0, depth_lr
                eps_scale = block_eps if kind != "rest" or self.eps_scope == "all" else 1.0
                out.append(group | {"params": params, "weight_decay": wd, "lr_scale": lr, "eps_scale": eps_scale})
        return out

    def __repr__(self) -> str:
        return (f"CompleteP(m_L={self.m_depth:g}, m_N={self.m_width:g}, alpha={self.alpha:g}, "
                f"input_alpha={self.input_alpha:g}, output_alpha={self.output_alpha:g}, eps_scope={self.eps_scope})")


def output_projections(model: nn.Module) -> list[nn.Parameter]:
    """The weights that write each block's sublayers into the stream: the attention's ``proj`` and the MLP's ``fc2``
    (timm's names, which every residual variant keeps), 2L of them."""
    return [p for block in model.blocks for p in (block.attn.proj.weight, block.mlp.fc2.weight)]


def hidden_parameters(model: nn.Module, matrices: bool) -> list[nn.Parameter]:
    """The parameters of the model's blocks: the matrices (ndim ≥ 2) or the vectors (norm gains, biases)."""
    return [p for p in model.blocks.parameters() if (p.ndim >= 2) == matrices]


PARAMETRIZATIONS: dict[str, type[StandardParametrization]] = {
    name: globals()[cls] for name, cls in PARAMETRIZATION_CLASSES.items()}
