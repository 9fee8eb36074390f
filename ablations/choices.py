"""Torch-free name tables for configuration and the CLI (importing torch/lightning costs ~4 s; ``--help`` must not).

The backbone's names (residual variants, attention kinds, norm layers, value-residual modes, optimizers, head pooling)
and the datasets' are the registries' own, read from the torch-free ``lit_modules.names``, ``lit_modules.config`` and
``data.names``.
"""

from __future__ import annotations

from data.names import DATASET_NAMES
from lit_modules.config import GLOBAL_POOLS
from lit_modules.names import (
    ATTENTION_GATE_NAMES,
    ATTENTION_NAMES,
    NORM_LAYER_NAMES,
    PARAMETRIZATION_NAMES,
    QK_NORM_NAMES,
    RESIDUAL_NAMES,
    STREAM_KERNEL_NAMES,
    VALUE_RESIDUAL_NAMES,
)
from lit_modules.names import OPTIMIZER_NAMES as OPTIMIZERS

__all__ = ["RESIDUAL_NAMES", "ATTENTION_NAMES", "NORM_LAYER_NAMES", "VALUE_RESIDUAL_NAMES", "DATASET_NAMES",
           "INIT_VALUE_OPTIONS", "PRECISIONS", "OPTIMIZERS", "PADDING_MODES", "GLOBAL_POOLS", "ACCELERATORS",
           "STREAM_KERNEL_NAMES", "QK_NORM_NAMES", "ATTENTION_GATE_NAMES", "PARAMETRIZATION_NAMES"]

#: The option of each variant that ``--init-value`` sets (its "init knob"); variants not listed have none.
INIT_VALUE_OPTIONS: dict[str, str] = {
    "layerscale": "init_value",  # float, 'auto' (CaiT's depth rule) or None (no LayerScale: standard)
    "rezero": "init_value",
    "skipinit": "init_value",
    "highway": "gate_bias",
}

#: Lightning precision strings accepted by ``RunConfig.precision``, and ``auto`` (:mod:`ablations.bench.modes`).
PRECISIONS: tuple[str, ...] = ("auto", "32-true", "64-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true")

#: Padding of the random crop (``RunConfig.crop_padding_mode``): zeros, or the image mirrored at its border.
PADDING_MODES: tuple[str, ...] = ("constant", "reflect")

ACCELERATORS: tuple[str, ...] = ("auto", "cpu", "gpu", "cuda")
