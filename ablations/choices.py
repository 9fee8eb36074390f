"""Torch-free name tables for configuration and the CLI (importing torch/lightning costs ~4 s; ``--help`` must not).

``tests/test_config.py`` checks these against the real registries, ``lit_modules.RESIDUALS`` and ``data.DATASETS``,
so a variant or dataset added there without an entry here fails the tests rather than going unnoticed.
"""

from __future__ import annotations

RESIDUAL_NAMES: tuple[str, ...] = (
    "standard", "layerscale", "rezero", "skipinit", "highway", "laurel", "res_se", "dca",
)

DATASET_NAMES: tuple[str, ...] = (
    "digits", "mnist5k", "mnist", "cifar10", "cifar100", "imagefolder", "synthetic",
)

#: The option of each variant that ``--init-value`` sets (its "init knob"); variants not listed have none.
INIT_VALUE_OPTIONS: dict[str, str] = {
    "layerscale": "init_value",  # float, 'auto' (CaiT's depth rule) or None (no LayerScale: standard)
    "rezero": "init_value",
    "skipinit": "init_value",
    "highway": "gate_bias",
}

#: Lightning precision strings accepted by ``RunConfig.precision``.
PRECISIONS: tuple[str, ...] = ("32-true", "64-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true")

GLOBAL_POOLS: tuple[str, ...] = ("token", "avg")

ACCELERATORS: tuple[str, ...] = ("auto", "cpu", "gpu", "cuda")
