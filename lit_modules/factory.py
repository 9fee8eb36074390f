"""``create_model``: a backbone in one line, as timm's ``timm.create_model`` gives one.

    from lit_modules import create_model

    model = create_model("layerscale", init_value="auto", depth=8)          # ViT-Tiny at 32 px, LayerScale
    model = create_model("highway", preset="vit_small", img_size=224, patch_size=16, num_classes=1000)
    model = create_model("laurel", form="rw_lr", rank=8, in_chans=1, img_size=28, patch_size=7, preset="study")

The first argument names a residual variant (``lit_modules.RESIDUALS``); every other keyword is a backbone field
(``lit_modules.config.ViTConfig``: size, geometry, attention, norms, parametrization, ...) or one of that
variant's own options (``init_value``, ``form``, ``n``, ...), told apart by name (no option shares a field's name).
``preset`` starts from a named size (``vit_tiny``, ``vit_small``, ``vit_base``, ``study``). No weights are
downloaded (``pretrained=True`` is refused): ``model.load_pretrained(path)`` loads a timm ViT checkpoint of the same
configuration.
"""

from __future__ import annotations

from typing import Any

from .config import FIELDS, PRESETS, ViTConfig


def create_model(residual: str = "standard", *, preset: str | None = None, pretrained: bool = False,
                 **kwargs: Any):
    """A :class:`lit_modules.vit.VisionTransformer` with residual ``residual``: ``kwargs`` that name a backbone
    field set it, the others are the variant's own options (module docstring). One-line ValueError for an unknown
    variant, preset or value, TypeError naming the valid fields and options for an unknown keyword."""
    from .residual import RESIDUALS
    from .vit import VisionTransformer

    if pretrained:
        raise ValueError("pretrained=True: no weights are downloaded; build the model, then model.load_pretrained(path) "
                         "loads a timm ViT checkpoint of the same configuration")
    if residual not in RESIDUALS:
        raise ValueError(f"unknown residual {residual!r}; valid choices: {', '.join(RESIDUALS)}")
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid choices: {', '.join(PRESETS)}")
    own = RESIDUALS[residual].options()
    fields = {k: v for k, v in kwargs.items() if k in FIELDS and k not in ("residual", "residual_options")}
    options = dict(kwargs.get("residual_options") or {})
    for key, value in kwargs.items():
        if key in own:
            options[key] = value
        elif key not in FIELDS:
            raise TypeError(f"create_model({residual!r}) got an unknown argument {key!r}; valid: the backbone's fields "
                            f"({', '.join(FIELDS)}) and {residual}'s options ({', '.join(own) or 'none'})")
    base = PRESETS[preset] if preset is not None else ViTConfig()
    return VisionTransformer(base.replace(residual=residual, residual_options=options, **fields))
