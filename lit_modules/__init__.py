"""Backbone, residual variants, LightningModules and callbacks; ``create_model("layerscale", depth=8)`` builds a
backbone in one line (:mod:`lit_modules.factory`).

The package's own names are imported on first use (PEP 562), so ``lit_modules.names`` — the registries' names —
can be imported without torch (the CLI's ``--help`` and ``RunConfig`` validation).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {"RESIDUALS": ".residual", "VisionTransformer": ".vit", "LoadReport": ".vit", "resolved_options": ".vit",
            "upgraded_form": ".vit", "create_model": ".factory"}

__all__ = ["RESIDUALS", "VisionTransformer", "LoadReport", "resolved_options", "upgraded_form", "create_model"]

if TYPE_CHECKING:
    from .factory import create_model
    from .residual import RESIDUALS
    from .vit import LoadReport, VisionTransformer, resolved_options, upgraded_form


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
