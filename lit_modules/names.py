"""The names of the backbone's interchangeable parts — the one list of each, torch-free.

Importing torch costs ~4 s, and the CLI's ``--help`` and ``RunConfig`` validation need only the names, so the
registries are built from these tables (``lit_modules.RESIDUALS``, ``lit_modules.attention.ATTENTIONS``,
``lit_modules.vit.NORM_LAYERS``) rather than listed twice. Adding a residual variant is its file
``lit_modules/residual/<name>.py`` plus one line here.
"""

from __future__ import annotations

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
}

#: attention kind -> its class in ``lit_modules/attention.py``
ATTENTION_CLASSES: dict[str, str] = {
    "self": "SelfAttention",
    "re_attention": "ReAttention",
}

#: norm layer name -> its class, ``module:Class`` (timm's norms, or the normalisation-free maps of
#: ``lit_modules/norms.py``)
NORM_LAYER_CLASSES: dict[str, str] = {
    "layernorm": "timm.layers:LayerNorm",
    "rmsnorm": "timm.layers:RmsNorm",
    "dyt": "lit_modules.norms:DynamicTanh",
    "derf": "lit_modules.norms:DynamicErf",
}

RESIDUAL_NAMES: tuple[str, ...] = tuple(RESIDUAL_CLASSES)
ATTENTION_NAMES: tuple[str, ...] = tuple(ATTENTION_CLASSES)
NORM_LAYER_NAMES: tuple[str, ...] = tuple(NORM_LAYER_CLASSES)

#: ResFormer's value residual (``VisionTransformer(value_residual=...)``, ``lit_modules.value_residual``): off, the
#: paper's fixed V_n ← ½V_1 + ½V_n, or two learned scalars per layer (0.5 each at init)
VALUE_RESIDUAL_NAMES: tuple[str, ...] = ("none", "fixed", "learned")
