"""The residual-connection variants, one class each, behind one registry.

``RESIDUALS[name]`` is a ``ResidualSite`` subclass; ``VisionTransformer(residual=name, residual_options={...})``
builds the backbone with it. The registry is read from ``lit_modules.names.RESIDUAL_CLASSES`` (the one,
torch-free list of variants): variant ``name`` is its class in ``lit_modules/residual/<name>.py``.
``docs/variants.md`` is the reference (formulas, defaults, adaptations, sources).
"""

from importlib import import_module

from ..names import RESIDUAL_CLASSES
from .base import BlockArgs, ResidualSite
from .dca import DCA
from .highway import Highway
from .laurel import LAuReL
from .layerscale import LayerScale, cait_init_value
from .res_se import ResSE
from .rezero import ReZero
from .skipinit import SkipInit
from .standard import Standard

RESIDUALS: dict[str, type[ResidualSite]] = {
    name: getattr(import_module(f"{__name__}.{name}"), cls) for name, cls in RESIDUAL_CLASSES.items()
}

__all__ = ["RESIDUALS", "BlockArgs", "ResidualSite", "Standard", "LayerScale", "ReZero", "SkipInit", "Highway",
           "LAuReL", "ResSE", "DCA", "cait_init_value"]
