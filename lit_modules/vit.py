"""One ViT backbone whose residual connection is chosen by name.

Built from timm's layers (PatchEmbed, Attention, Mlp, DropPath, LayerNorm, trunc_normal_, init_weights_vit_timm)
and using timm's parameter names, so a ``timm.models.vision_transformer.VisionTransformer`` of the same config
loads into the ``standard`` (and, with ``init_values``, the ``layerscale``) variant with ``strict=True`` and gives
the same logits. The residual variant lives in ``lit_modules.residual``; the backbone only asks it to build
blocks and the stream that chains them (and whether the stream still needs the final norm). Orthogonal to it: the
attention kind (``lit_modules.attention``), ResFormer's value residual (``value_residual``), CaiT's
class-attention head (``class_attention_blocks``) and the norm layer (``norm_layer``).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from timm.layers import PatchEmbed, calculate_drop_path_rates, trunc_normal_
from timm.layers.pool1d import global_pool_nlc
from timm.models._manipulate import named_apply
from timm.models.cait import LayerScaleBlockClassAttn
from timm.models.vision_transformer import init_weights_vit_timm
from timm.optim import param_groups_weight_decay
from torch import nn

from .attention import ATTENTIONS, QK_NORMS
from .config import ViTConfig
from .names import ATTENTION_GATE_NAMES, NORM_LAYER_CLASSES, resolve
from .norms import check_norm_options
from .parametrization import PARAMETRIZATIONS
from .residual import RESIDUALS, BlockArgs, cait_init_value
from .residual.hyper_connections import MultiStreamSite
from .residual.stream_kernels import check
from .value_residual import ValueState, value_residual_factory

#: norm layer name -> class, called as ``cls(dim, eps=norm_eps)`` (names: ``lit_modules.names``)
NORM_LAYERS: dict[str, type[nn.Module]] = resolve(NORM_LAYER_CLASSES)


@dataclass
class LoadReport:
    """What ``VisionTransformer.load_pretrained`` did: keys it filled from the checkpoint, keys left at init."""

    loaded: list[str]
    new: list[str]
    derived: dict[str, str] = field(default_factory=dict)  # our key -> checkpoint key it was copied from

    def __str__(self) -> str:
        return (f"loaded {len(self.loaded)} tensors; {len(self.new)} new (left at init): "
                f"{', '.join(self.new) or 'none'}; {len(self.derived)} copied from an existing key")


def resolved_options(cfg: ViTConfig) -> dict[str, dict[str, Any]]:
    """The options every swappable part of ``cfg``'s model is built with, checked and with their defaults filled in:
    ``{"residual": ..., "attention": ..., "norm": ..., "parametrization": ...}`` (one-line ValueErrors as
    :class:`VisionTransformer` raises them). Two configs with equal resolved options build the same form, whatever
    each spelled out: a run records them (its ``form``), so that a default changed later is seen (``--import-runs``
    trains such a row again)."""
    variant = _lookup("residual", cfg.residual, RESIDUALS)
    attn_kind = _lookup("attention", cfg.attention, ATTENTIONS)
    norm_cls = _lookup("norm_layer", cfg.norm_layer, NORM_LAYERS)
    param_kind = _lookup("parametrization", cfg.parametrization, PARAMETRIZATIONS)
    depth, blocks_ca = cfg.depth, cfg.class_attention_blocks
    options = variant.validate_options(dict(cfg.residual_options),
                                       backbone={"class_attention_blocks": blocks_ca, "class_token": cfg.class_token})
    variant.check_options(options, dim=cfg.embed_dim, depth=depth)
    return {"residual": options,
            "attention": attn_kind.validate_options(dict(cfg.attention_options), num_heads=cfg.num_heads, depth=depth),
            "norm": check_norm_options(cfg.norm_layer, norm_cls, cfg.norm_options),
            "parametrization": param_kind.validate_options(dict(cfg.parametrization_options), backbone={
                "residual": cfg.residual, "attention": cfg.attention, "norm_layer": cfg.norm_layer,
                "class_attention_blocks": blocks_ca, "own_output_init": variant.own_output_init})}


#: the swappable parts of a model's form (:func:`resolved_options`' keys) and the registry each part's kind names
FORM_REGISTRIES: dict[str, Mapping[str, type]] = {"residual": RESIDUALS, "attention": ATTENTIONS, "norm": NORM_LAYERS,
                                                  "parametrization": PARAMETRIZATIONS}


def upgraded_form(form: Mapping[str, Any] | str) -> Any:
    """A form a run recorded (``{part: {"kind": ..., "options": {...}}}``, its resolved options), with every option
    its part's class has gained since filled in at the value that builds what the run built: the class's
    ``added_options`` (``{option: value before it existed}``). A run recorded before a new option compares equal to
    today's form when the option's default keeps the old behaviour, and differs (an earlier form) when the default
    changed it; an option missing from a recorded form that no class declares stays missing (a difference, as
    before). Parts and kinds the registries do not know are kept as recorded. ``form``: parsed or its JSON text
    (ValueError for text that is not JSON)."""
    if isinstance(form, str):
        form = json.loads(form)
    if not isinstance(form, Mapping):
        return form  # not a form: compared as it is
    upgraded = {}
    for part, value in form.items():
        cls = FORM_REGISTRIES.get(part, {}).get(value.get("kind")) if isinstance(value, Mapping) else None
        added = getattr(cls, "added_options", None) or {}
        if added and hasattr(cls, "options"):  # inherited declarations: only the options this class has
            valid = cls.options()
            added = {k: v for k, v in added.items() if k in valid}
        if added and isinstance(value.get("options"), Mapping):
            value = {**value, "options": {**added, **value["options"]}}
        upgraded[part] = value
    return upgraded


class VisionTransformer(nn.Module):
    """Vision Transformer (Dosovitskiy et al., arXiv 2010.11929) with a swappable residual connection.

    Built from one :class:`lit_modules.config.ViTConfig` (``VisionTransformer(cfg)``), or from its fields as
    keyword arguments (``VisionTransformer("layerscale", {"init_value": "auto"}, depth=24)``: the residual's name,
    its options, then any field; the rest keep the config's defaults, timm's ViT-Tiny at 32 px). The fields mirror
    timm's ``VisionTransformer`` arguments; ``residual`` names a variant of ``lit_modules.RESIDUALS`` and
    ``residual_options`` its own typed options (e.g. ``{"init_value": "auto"}`` for LayerScale); ``self.cfg`` is
    the config it was built from. Independent of the residual:

    - ``attention``: the self-attention blocks' attention, a kind of ``lit_modules.attention.ATTENTIONS`` —
      ``"self"`` (timm's ``Attention``) or ``"re_attention"`` (DeepViT) — with ``attention_options``
      (e.g. ``{"head_norm": "layer"}``);
    - ``class_attention_blocks``: CaiT's class-attention head (Touvron et al., arXiv 2103.17239). 0: the class
      token joins the patches from the start (ViT). N > 0: the self-attention blocks see the patch tokens only
      (``pos_embed`` covers the patches, as in CaiT), then N timm ``LayerScaleBlockClassAttn`` blocks
      (``blocks_token_only``) update only the class token — ``x_cls += γ₁ ⊙ CA(LN[x_cls; x_patches])``,
      ``x_cls += γ₂ ⊙ MLP(LN x_cls)`` with the query from the class token alone, γ at CaiT's depth rule
      ``cait_init_value(depth)``, no stochastic depth (as timm's CaiT) — before the final norm and the head;
    - ``norm_layer``: ``"layernorm"`` (timm's ``LayerNorm``), ``"rmsnorm"`` (timm's ``RmsNorm``), ε ``norm_eps``,
      or a normalisation-free map (``lit_modules.norms``): ``"dyt"`` (Dynamic Tanh, arXiv 2503.10622) or ``"derf"``
      (Derf, arXiv 2512.10938), which ignore ``norm_eps``, or ``"seednorm"``; used by every norm of the model
      (pre-norms, final norm, the variants' own norms); ``norm_options`` are the norm layer's own keyword
      arguments (DyT's and Derf's ``alpha_init``, Derf's ``shift_init``, SeeDNorm's ``groups``;
      ``lit_modules.norms.check_norm_options``);
    - ``value_residual``: ResFormer (Zhou et al., arXiv 2410.17897) — ``"none"`` (default), ``"fixed"``
      (every self-attention layer after the first uses V_n ← ½V_1 + ½V_n, V_1 = the first layer's values in this
      forward) or ``"learned"`` (λ₁V_1 + λ₂V_n, two learned scalars per layer from 0.5); see
      ``lit_modules.value_residual``.

    The final norm before the head (``norm``, or ``fc_norm`` with average pooling) is built unless the variant
    says its stream ends normalised (``ResidualSite.uses_final_norm``: DeepNorm's post-LN blocks) and there is no
    class-attention head (whose pre-norm updates need it).

    **Common random numbers.** Every module's initial values are drawn from a generator seeded by
    ``(init_seed, the module's name)``, so two models built with the same ``init_seed`` (by default one number
    drawn from torch's global RNG before anything is built, i.e. fixed by ``torch.manual_seed``) share the initial
    values of every parameter they have in common (patch embedding, attention, MLP, norms, head), whatever
    parameters a variant adds or in what order it builds them.
    """

    def __init__(self, residual: ViTConfig | str = "standard", residual_options: Mapping[str, Any] | None = None,
                 *, init_seed: int | None = None, **fields: Any) -> None:
        super().__init__()
        cfg = self.cfg = ViTConfig.build(residual, residual_options, **fields)
        # Drawn before any module is built, so it depends only on the caller's RNG state (e.g. the run's seed).
        self.init_seed = int(torch.randint(0, 2**31 - 1, ()).item()) if init_seed is None else int(init_seed)
        variant = _lookup("residual", cfg.residual, RESIDUALS)
        attn_kind = _lookup("attention", cfg.attention, ATTENTIONS)
        norm_cls = _lookup("norm_layer", cfg.norm_layer, NORM_LAYERS)
        qk_cls = _lookup("qk_norm", cfg.qk_norm, QK_NORMS)
        _lookup("attention_gate", cfg.attention_gate, dict.fromkeys(ATTENTION_GATE_NAMES))
        param_kind = _lookup("parametrization", cfg.parametrization, PARAMETRIZATIONS)
        cfg.check()
        depth, embed_dim, blocks_ca = cfg.depth, cfg.embed_dim, cfg.class_attention_blocks
        resolved = resolved_options(cfg)
        options, attn_options, param_options = (resolved[k] for k in ("residual", "attention", "parametrization"))
        self.parametrization = param_kind(depth=depth, width=embed_dim, **param_options)
        self.value_state = ValueState()  # the first layer's values of the forward in progress (ResFormer)
        values = value_residual_factory(cfg.value_residual, self.value_state)  # ValueError naming the valid choices
        self.residual = cfg.residual
        self.residual_options = options
        self.attention = cfg.attention
        self.attention_options = attn_options
        self.value_residual = cfg.value_residual
        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.num_prefix_tokens = 1 if cfg.class_token else 0
        # with a class-attention head the class token joins only after the self-attention blocks (CaiT)
        block_prefix_tokens = 0 if blocks_ca else self.num_prefix_tokens
        self.embed_dim = self.num_features = embed_dim
        norm_layer = partial(norm_cls, eps=cfg.norm_eps, **resolved["norm"])

        self.patch_embed = PatchEmbed(img_size=cfg.img_size, patch_size=cfg.patch_size, in_chans=cfg.in_chans,
                                      embed_dim=embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if cfg.class_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches + block_prefix_tokens, embed_dim))
        self.pos_drop = nn.Dropout(p=cfg.pos_drop_rate)
        self.norm_pre = norm_layer(embed_dim) if variant.uses_embedding_norm(**options) else nn.Identity()

        dpr = calculate_drop_path_rates(cfg.drop_path_rate, depth)  # timm's linear stochastic-depth rule
        block_args = [
            BlockArgs(dim=embed_dim, num_heads=cfg.num_heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias,
                      qk_norm=False, proj_drop=cfg.proj_drop_rate, attn_drop=cfg.attn_drop_rate, drop_path=dpr[i],
                      norm_layer=norm_layer, act_layer=nn.GELU, layer=i, depth=depth,
                      num_prefix_tokens=block_prefix_tokens, attn_layer=attn_kind.layer_for(i, depth, attn_options),
                      value_residual=values, qk_norm_layer=partial(qk_cls, eps=cfg.norm_eps) if qk_cls else None,
                      attention_gate=cfg.attention_gate, branch_scale=self.parametrization.branch_scale)
            for i in range(depth)
        ]
        self.blocks = nn.ModuleList(variant.build_block(a, **options) for a in block_args)
        if qk_cls is not None and not all(isinstance(b.attn.q_norm, qk_cls) and isinstance(b.attn.k_norm, qk_cls)
                                          for b in self.blocks):
            raise ValueError(f"qk_norm={cfg.qk_norm!r} does not apply to residual '{cfg.residual}': its attention "
                             f"normalises queries and keys its own way; it applies with qk_norm='none'")
        scale = self.parametrization.attention_scale(cfg.embed_dim // cfg.num_heads)
        if scale is not None:  # the logit scale of every self-attention (μP's 1/d), fused and explicit
            for blk in self.blocks:
                blk.attn.scale = blk.attn.sdpa_scale = scale
        self.input_multiplier = self.parametrization.input_multiplier  # embeddings × this before the blocks
        self.output_multiplier = self.parametrization.output_multiplier  # pre-head features × this
        self.stream = variant.build_stream(embed_dim, depth, norm_layer, **options)
        self.blocks_token_only = nn.ModuleList(
            LayerScaleBlockClassAttn(embed_dim, cfg.num_heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias,
                                     proj_drop=cfg.proj_drop_rate, attn_drop=cfg.attn_drop_rate, act_layer=nn.GELU,
                                     norm_layer=norm_layer, init_values=cait_init_value(depth))
            for _ in range(blocks_ca))
        use_fc_norm = cfg.global_pool == "avg"  # timm: average pooling normalises after pooling
        final_norm = variant.uses_final_norm(**options) or blocks_ca > 0
        self.norm = norm_layer(embed_dim) if final_norm and not use_fc_norm else nn.Identity()
        self.fc_norm = norm_layer(embed_dim) if final_norm and use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = variant.build_head(embed_dim, cfg.num_classes, **options) if cfg.num_classes > 0 else nn.Identity()

        self.init_weights()
        self.parametrization.init_weights(self)
        self.project_parameters()
        if cfg.fused_attn is not None:
            self.set_fused_attn(cfg.fused_attn)

    # --- init, optimisation ------------------------------------------------------------------------------------
    def init_weights(self) -> None:
        """timm's default ViT init (each residual site initialises its own parameters), every module from its own
        generator seeded by ``(init_seed, module name)``: see the class docstring."""
        with _seeded(self.init_seed, "pos_embed"):
            trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            with _seeded(self.init_seed, "cls_token"):
                if len(self.blocks_token_only):  # CaiT: the class token is the class attention's query
                    trunc_normal_(self.cls_token, std=0.02)
                else:
                    nn.init.normal_(self.cls_token, std=1e-6)

        def init(module: nn.Module, name: str) -> None:
            with _seeded(self.init_seed, name):
                init_weights_vit_timm(module, name)

        named_apply(init, self)

    def project_parameters(self) -> None:
        """The variant's parameter constraint (``ResidualSite.project_parameters``; nGPT: every matrix unit-norm
        along the embedding dimension), applied after init and, by ``ViTClassifier.optimizer_step``, after every
        optimiser step. A no-op for every other variant."""
        RESIDUALS[self.residual].project_parameters(self, **self.residual_options)

    def no_weight_decay(self) -> set[str]:
        """Full names of parameters excluded from weight decay: embeddings plus every variant's own scalars,
        per-channel scales, gate biases and DCA's b and w (2-D, so timm's ndim rule alone would decay them)."""
        names = {"pos_embed", "cls_token"}
        for prefix, module in self.named_modules():
            if module is not self and hasattr(module, "no_weight_decay"):
                names |= {f"{prefix}.{n}" for n in module.no_weight_decay()}
        return names

    def param_groups(self, weight_decay: float) -> list[dict]:
        """AdamW parameter groups (timm's rule: 1-D tensors and biases undecayed) plus ``no_weight_decay()``, as the
        parametrisation annotates them (CompleteP: each group's ``lr_scale`` and ``eps_scale``, the multipliers of
        the base learning rate and Adam's ε, and its weight decay; the standard parametrisation adds nothing)."""
        groups = param_groups_weight_decay(self, weight_decay, no_weight_decay_list=self.no_weight_decay())
        names = self.decayed_vectors()
        decayed = {id(p) for name, p in self.named_parameters() if name in names}
        if decayed:  # vectors a design's paper decays (SeeDNorm's α, β) join the decayed group
            kept = [p for g in groups if g["weight_decay"] == 0.0 for p in g["params"] if id(p) in decayed]
            for g in groups:
                g["params"] = [p for p in g["params"] if id(p) not in decayed or g["weight_decay"] > 0.0]
            groups = [g for g in groups if g["params"]]
            target = next((g for g in groups if g["weight_decay"] > 0.0), None)
            if target is None:
                groups.append(target := {"params": [], "weight_decay": weight_decay})
            target["params"] += kept
        return self.parametrization.param_groups(self, groups)

    def decayed_vectors(self) -> set[str]:
        """Full names of 1-D parameters that are weight-decayed although timm's rule leaves vectors alone: those a
        module's paper decays (``decayed_vectors()`` of the module; SeeDNorm's α and β)."""
        names: set[str] = set()
        for prefix, module in self.named_modules():
            if module is not self and hasattr(module, "decayed_vectors"):
                names |= {f"{prefix}.{n}" for n in module.decayed_vectors()}
        return names

    def residual_sites(self) -> list[tuple[int, str, nn.Module]]:
        """(layer, sublayer, module) for every residual site, in forward order. For Block/WholeBlock sites a
        forward hook sees inputs ``(x, u, f, history)`` and returns the update Δ; for DCA blocks the module is
        the block itself, whose hook sees ``(stack,)`` (B, N, t, D) and returns the block output f_t."""
        return [(i, name, site) for i, blk in enumerate(self.blocks) for name, site in blk.sites().items()]

    def set_fused_attn(self, enabled: bool) -> None:
        """Fused SDPA (fast, training) or the explicit-softmax path (returns attention maps to hooks), for every
        attention of the model (self-attention and class-attention blocks)."""
        for m in self.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = enabled

    def set_stream_kernels(self, name: str) -> None:
        """The implementation of the multi-stream residuals' per-token passes (Hyper-Connections, mHC):
        ``"eager"`` (PyTorch operations, the default) or ``"compiled"`` (fused by ``torch.compile``; the same
        function, see ``lit_modules.residual.stream_kernels``). No effect on the other variants."""
        check(name)  # ValueError for an unknown name, before any site changes
        for site in self.multi_stream_sites():
            site.stream_kernels = name

    def multi_stream_sites(self) -> list[nn.Module]:
        """The residual sites whose per-token passes ``set_stream_kernels`` chooses (none for single-stream
        variants)."""
        return [m for m in self.modules() if isinstance(m, MultiStreamSite)]

    # --- forward -------------------------------------------------------------------------------------------------
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        cls_token = None if self.cls_token is None else self.cls_token.expand(x.shape[0], -1, -1)
        if cls_token is not None and not len(self.blocks_token_only):
            x = torch.cat([cls_token, x], dim=1)
        x = self.norm_pre(self.pos_drop(x + self.pos_embed))
        if self.input_multiplier != 1.0:
            x = x * self.input_multiplier
        self.value_state.open()  # V_1 (value residual) is recorded afresh by this forward's first layer-0 call
        x = self.stream(x, self.blocks)
        self.value_state.close()
        if len(self.blocks_token_only):  # CaiT: only the class token is updated, reading the patch tokens
            for blk in self.blocks_token_only:
                cls_token = blk(x, cls_token)
            x = torch.cat([cls_token, x], dim=1)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = global_pool_nlc(x, pool_type=self.global_pool, num_prefix_tokens=self.num_prefix_tokens)
        x = self.head_drop(self.fc_norm(x))
        if pre_logits:
            return x
        return self.head(x if self.output_multiplier == 1.0 else x * self.output_multiplier)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    # --- retrofitting a pretrained (timm) checkpoint ---------------------------------------------------------------
    def load_pretrained(self, checkpoint: Mapping[str, torch.Tensor] | str | Path) -> LoadReport:
        """Load a timm ViT state dict (or a local file holding one) of the same config.

        Every key of the checkpoint must exist here (otherwise ValueError naming the keys); parameters the
        variant adds are either copied from the key they extend (DCA's per-input norms from ``norm1``) or left
        at their init. Returns which keys were new.
        """
        state = _read_checkpoint(checkpoint)
        own = self.state_dict()
        unexpected = sorted(set(state) - set(own))
        if unexpected:
            raise ValueError(f"checkpoint keys not in residual '{self.residual}' model: {', '.join(unexpected[:8])}"
                             + (" ..." if len(unexpected) > 8 else ""))
        derived = {}
        for prefix, module in self.named_modules():
            for ours, theirs in getattr(module, "retrofit_aliases", {}).items():
                key, src = f"{prefix}.{ours}" if prefix else ours, f"{prefix}.{theirs}" if prefix else theirs
                if key not in state and src in state:
                    derived[key] = src
        merged = dict(state) | {k: state[v] for k, v in derived.items()}
        for key, value in merged.items():
            if own[key].shape != value.shape:
                raise ValueError(f"checkpoint tensor '{key}' has shape {tuple(value.shape)}, "
                                 f"model expects {tuple(own[key].shape)} (different config?)")
        self.load_state_dict(merged, strict=False)
        new = sorted(set(own) - set(merged))
        return LoadReport(loaded=sorted(state), new=new, derived=derived)


@contextmanager
def _seeded(seed: int, name: str) -> Iterator[None]:
    """Run the block with torch's CPU RNG seeded by (seed, name); the global RNG state is restored afterwards.
    Only the CPU generator, the one ``fork_rng(devices=[])`` restores, is seeded: ``torch.manual_seed`` would also
    (re)seed every accelerator's generator, unrestored, and costs some 300x as much (it queues CUDA's lazy seeding
    with a stack trace; a model seeds once per module: most of its construction time)."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63 - 1))
        yield


def _read_checkpoint(checkpoint: Mapping[str, torch.Tensor] | str | Path) -> Mapping[str, torch.Tensor]:
    if isinstance(checkpoint, (str, Path)):
        path = Path(checkpoint)
        if not path.is_file():
            raise ValueError(f"checkpoint file '{path}' does not exist")
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        for key in ("state_dict", "model"):  # Lightning / timm training checkpoints wrap the weights
            if isinstance(checkpoint, Mapping) and key in checkpoint and isinstance(checkpoint[key], Mapping):
                checkpoint = checkpoint[key]
    return checkpoint


def _lookup(kind: str, name: str, registry: Mapping[str, Any]) -> Any:
    if name not in registry:
        raise ValueError(f"unknown {kind} '{name}'; valid choices: {', '.join(registry)}")
    return registry[name]
