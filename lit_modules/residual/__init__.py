"""The residual-connection variants, one class each, behind one registry.

``RESIDUALS[name]`` is a ``ResidualSite`` subclass; ``VisionTransformer(residual=name, residual_options={...})``
builds the backbone with it. The registry is read from ``lit_modules.names.RESIDUAL_CLASSES`` (the one,
torch-free list of variants): variant ``name`` is its class in ``lit_modules/residual/<name>.py``, and the package
exports every registered class under its own name (``from lit_modules.residual import DCA, MHC``), so a new variant
is its file and its registry line.
``docs/variants.md`` is the reference (formulas, defaults, adaptations, sources).
"""

from importlib import import_module

from ..names import RESIDUAL_CLASSES
from .base import BlockArgs, ResidualSite
from .layerscale import cait_init_value

RESIDUALS: dict[str, type[ResidualSite]] = {
    name: getattr(import_module(f"{__name__}.{name}"), cls) for name, cls in RESIDUAL_CLASSES.items()
}
globals().update({RESIDUAL_CLASSES[name]: cls for name, cls in RESIDUALS.items()})

__all__ = ["RESIDUALS", "BlockArgs", "ResidualSite", "cait_init_value", *RESIDUAL_CLASSES.values()]
