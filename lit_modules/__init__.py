"""Backbone, residual variants, LightningModules and callbacks."""

from .residual import RESIDUALS
from .vit import LoadReport, VisionTransformer

__all__ = ["RESIDUALS", "VisionTransformer", "LoadReport"]
