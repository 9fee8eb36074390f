"""The datasets' names — the one list, torch-free.

Importing torch costs ~4 s, and the CLI's ``--help`` and ``RunConfig`` validation need only the names, so
``data.DATASETS`` is built from this table rather than listed twice. Adding a dataset is its module
``data/<name>.py`` plus one line here.
"""

from __future__ import annotations

#: dataset name -> its DataModule, ``module:Class``
DATASET_CLASSES: dict[str, str] = {
    "digits": "data.digits:DigitsDataModule",
    "mnist5k": "data.mnist:MNIST5kDataModule",
    "mnist": "data.mnist:MNISTDataModule",
    "fashion_mnist": "data.mnist:FashionMNISTDataModule",
    "cifar10": "data.cifar:CIFAR10DataModule",
    "cifar100": "data.cifar:CIFAR100DataModule",
    "svhn": "data.svhn:SVHNDataModule",
    "imagefolder": "data.imagefolder:ImageFolderDataModule",
    "synthetic": "data.synthetic:SyntheticDataModule",
}

DATASET_NAMES: tuple[str, ...] = tuple(DATASET_CLASSES)
