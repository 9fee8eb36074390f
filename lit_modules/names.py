"""The names of the backbone's interchangeable parts — the one list of each, torch-free.

Importing torch costs ~4 s, and the CLI's ``--help`` and ``RunConfig`` validation need only the names, so the
registries are built from these tables (``lit_modules.RESIDUALS``, ``lit_modules.attention.ATTENTIONS``,
``lit_modules.vit.NORM_LAYERS``) rather than listed twice. Adding a residual variant is its file
``lit_modules/residual/<name>.py`` plus one line here.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

#: residual variant name -> its class in ``lit_modules/residual/<name>.py``
RESIDUAL_CLASSES: dict[str, str] = {
    "standard": "Standard",
    "layerscale": "LayerScale",
    "rezero": "ReZero",
    "skipinit": "SkipInit",
    "highway": "Highway",
    "laurel": "LAuReL",
    "res_se": "ResSE",
    "dca": "DCA",
    "skipdense": "SkipDense",
    "hyper_connections": "HyperConnections",
    "mhc": "MHC",
    "denseformer": "DenseFormer",
    "attn_res": "AttnRes",
    "ortho": "Ortho",
    "deepnorm": "DeepNorm",
    "post_ln": "PostLN",
    "res_post_norm": "ResPostNorm",
    "peri_ln": "PeriLN",
    "mix_ln": "MixLN",
    "ln_scaling": "LNScaling",
    "keel": "Keel",
    "resi_dual": "ResiDual",
    "ngpt": "NGPT",
    "gpas": "GPAS",
    "siamese_norm": "SiameseNorm",
    "deep_delta": "DeepDelta",
    "mhc_lite": "MHCLite",
    "kromhc": "KromHC",
    "muddformer": "MUDDFormer",
    "hybrid_norm": "HybridNorm",
}

#: attention kind -> its class in ``lit_modules/attention.py``
ATTENTION_CLASSES: dict[str, str] = {
    "self": "SelfAttention",
    "re_attention": "ReAttention",
}

#: QK-norm (the backbone's ``qk_norm``) -> its class in ``lit_modules/attention.py`` ("": none)
QK_NORM_CLASSES: dict[str, str] = {
    "none": "",
    "rmsnorm": "QKRMSNorm",
    "layernorm": "QKLayerNorm",
}

#: parametrisation (the backbone's ``parametrization``) -> its class in ``lit_modules/parametrization.py``
PARAMETRIZATION_CLASSES: dict[str, str] = {
    "standard": "StandardParametrization",
    "completep": "CompleteP",
}

#: norm layer name -> its class, ``module:Class`` (timm's norms, or the normalisation-free maps of
#: ``lit_modules/norms.py``)
NORM_LAYER_CLASSES: dict[str, str] = {
    "layernorm": "timm.layers:LayerNorm",
    "rmsnorm": "timm.layers:RmsNorm",
    "dyt": "lit_modules.norms:DynamicTanh",
    "derf": "lit_modules.norms:DynamicErf",
    "seednorm": "lit_modules.norms:SeeDNorm",
}

#: optimizer name -> its torch.optim class (``ViTClassifier``; adam: coupled L2 decay, the paper recipe's; adamw:
#: decoupled)
OPTIMIZER_CLASSES: dict[str, str] = {
    "adamw": "torch.optim:AdamW",
    "adam": "torch.optim:Adam",
}

RESIDUAL_NAMES: tuple[str, ...] = tuple(RESIDUAL_CLASSES)
QK_NORM_NAMES: tuple[str, ...] = tuple(QK_NORM_CLASSES)
PARAMETRIZATION_NAMES: tuple[str, ...] = tuple(PARAMETRIZATION_CLASSES)
#: the attention's output gate (Gated Attention, arXiv 2505.06708): none, one gate per head channel, one per head
ATTENTION_GATE_NAMES: tuple[str, ...] = ("none", "elementwise", "headwise")
ATTENTION_NAMES: tuple[str, ...] = tuple(ATTENTION_CLASSES)
NORM_LAYER_NAMES: tuple[str, ...] = tuple(NORM_LAYER_CLASSES)
OPTIMIZER_NAMES: tuple[str, ...] = tuple(OPTIMIZER_CLASSES)

#: ResFormer's value residual (``VisionTransformer(value_residual=...)``, ``lit_modules.value_residual``): off, the
#: paper's fixed V_n ← ½V_1 + ½V_n, or two learned scalars per layer (0.5 each at init)
VALUE_RESIDUAL_NAMES: tuple[str, ...] = ("none", "fixed", "learned")

#: Implementations of the multi-stream residuals' per-token passes (``lit_modules.residual.stream_kernels``);
#: ``auto`` picks one for the device.
STREAM_KERNEL_NAMES: tuple[str, ...] = ("auto", "eager", "compiled")

#: every TensorBoard tag the diagnostics write (``lit_modules.diagnostics``), as format strings; the reports
#: (``ablations.report.events``, ``model_tables``) read them back by these names
DIAGNOSTIC_TAGS: dict[str, str] = {
    "ratio_mean": "diag/ratio_mean/{sublayer}/{layer:02d}",
    "ratio_rms": "diag/ratio_rms/{sublayer}/{layer:02d}",
    "update_ratio": "diag/update_ratio/{sublayer}/{layer:02d}",
    "skip_scale": "diag/skip_scale/{sublayer}/{layer:02d}",
    "stream_rms": "diag/stream_rms/{layer:02d}",
    "attn_sim_adj": "diag/attn_sim_adj/{layer:02d}",
    "attn_sim_ratio": "diag/attn_sim_ratio/{layer:02d}",
    "attn_sim_k": "diag/attn_sim_k/{layer:02d}",
    "attn_sim_k_ratio": "diag/attn_sim_k_ratio/{layer:02d}",
    "attn_entropy": "diag/attn_entropy/{layer:02d}",
    "grad_norm": "diag/grad_norm/{layer:02d}",
    "param": "diag/param/{sublayer}/{layer:02d}/{key}",
    "attn_sim_adj_mean": "diag/attn_sim_adj_mean",
    "attn_sim_ratio_mean": "diag/attn_sim_ratio_mean",
    "attn_sim_k_mean": "diag/attn_sim_k_mean",
    "attn_sim_k_ratio_mean": "diag/attn_sim_k_ratio_mean",
    "similar_blocks": "diag/similar_blocks",
    "similar_blocks_fraction": "diag/similar_blocks_fraction",
    "attn_entropy_mean": "diag/attn_entropy_mean",
    "ratio_mean_avg": "diag/ratio_mean_avg",
    "attn_sim_full": "diag/attn_sim_full",
    "attn_sim_full_json": "diag/attn_sim_full_json",
    "depth_weights": "diag/depth_weights",
    "ratio_map": "diag/ratio_map",
    "depth_weights_json": "diag/depth_weights_json",
    "definitions": "diag/definitions",
    "composite_gain_forward": "diag/composite_gain/forward",
    "composite_gain_backward": "diag/composite_gain/backward",
}


def resolve(paths: dict[str, str]) -> dict[str, Any]:
    """A ``name -> "module:Class"`` table as ``name -> Class`` (imports each module: call it where torch may load)."""
    return {name: getattr(import_module(path.split(":")[0]), path.split(":")[1]) for name, path in paths.items()}
