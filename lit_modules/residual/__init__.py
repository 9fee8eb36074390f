"""The residual-connection variants, one class each, behind one registry.

``RESIDUALS[name]`` is a ``ResidualSite`` subclass; ``VisionTransformer(residual=name, residual_options={...})``
builds the backbone with it. ``docs/variants.md`` is the reference (formulas, defaults, adaptations, sources).
"""

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
    cls.name: cls for cls in (Standard, LayerScale, ReZero, SkipInit, Highway, LAuReL, ResSE, DCA)
}

__all__ = ["RESIDUALS", "BlockArgs", "ResidualSite", "Standard", "LayerScale", "ReZero", "SkipInit", "Highway",
           "LAuReL", "ResSE", "DCA", "cait_init_value"]
