"""CIFAR-10 / CIFAR-100 from a folder in torchvision's python-pickle format, parsed by torchvision itself."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torchvision.datasets import CIFAR10, CIFAR100

from data.common import data_error, reading, require_data_dir
from data.in_memory import InMemoryDataModule, Splits

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from data.base import DataArgs


class _FilesExistCIFAR10(CIFAR10):
    """torchvision's CIFAR-10 parser with its md5 check replaced by a file-existence check.

    The md5 check would reject any file but the official ones (e.g. tiny test folders). Clearing the md5 sums also
    turns the metadata check in ``_load_meta`` (``check_integrity(path, md5=None)``) into an existence check.
    """

    train_list = [[name, None] for name, _ in CIFAR10.train_list]
    test_list = [[name, None] for name, _ in CIFAR10.test_list]
    meta = {**CIFAR10.meta, "md5": None}

    def _check_integrity(self) -> bool:
        folder = Path(self.root) / self.base_folder
        return all((folder / name).is_file() for name, _ in self.train_list + self.test_list)


class _FilesExistCIFAR100(_FilesExistCIFAR10, CIFAR100):
    """torchvision's CIFAR-100 parser with the same file-existence check."""

    train_list = [[name, None] for name, _ in CIFAR100.train_list]
    test_list = [[name, None] for name, _ in CIFAR100.test_list]
    meta = {**CIFAR100.meta, "md5": None}
    base_folder = CIFAR100.base_folder


class CIFAR10DataModule(InMemoryDataModule):
    """CIFAR-10 under ``data_dir/cifar-10-batches-py``; test = the official test split, val = a seeded
    ``val_fraction`` of the official train split (``test_fraction=0``: val = the official test split, no test).

    Held in memory as uint8 (N, 3, 32, 32); augmentation: random crop with 4-px zero padding + horizontal flip.
    ``CIFAR100DataModule`` differs only in its class attributes.
    """

    name = "cifar10"
    num_classes = 10
    in_chans = 3
    img_size = 32
    official_sizes = (50000, 10000)  # official train / test splits
    default_patch_size = 4
    max_shift = 4
    hflip = True
    torchvision_class: type[CIFAR10] = _FilesExistCIFAR10
    layout = "cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta} (torchvision's CIFAR-10 python format)"

    def __init__(self, **common: Unpack[DataArgs]) -> None:
        super().__init__(**common)
        folder = require_data_dir(self.data_dir, self.name, self.layout) / self.torchvision_class.base_folder
        tv = self.torchvision_class
        expected = [name for name, _ in tv.train_list + tv.test_list] + [tv.meta["filename"]]
        missing = [name for name in expected if not (folder / name).is_file()]
        if missing:
            missing_text = ", ".join(f"{tv.base_folder}/{name}" for name in missing)
            raise data_error(self.data_dir, self.name, f"is missing {missing_text}", self.layout)

    def load_splits(self) -> Splits:
        with reading(self.data_dir, self.name, self.layout):
            train, test = (self.torchvision_class(self.data_dir, train=flag, download=False) for flag in (True, False))
            for split in (train, test):
                if len(split.data) != len(split.targets):
                    raise ValueError(f"{len(split.data)} images but {len(split.targets)} labels")
                if max(split.targets, default=0) >= self.num_classes or min(split.targets, default=0) < 0:
                    raise ValueError(f"labels outside 0..{self.num_classes - 1}")

        def to_tensors(split: CIFAR10) -> tuple[torch.Tensor, torch.Tensor]:
            images = torch.from_numpy(split.data).permute(0, 3, 1, 2).contiguous()  # torchvision keeps NHWC
            return images, torch.tensor(split.targets, dtype=torch.int64)

        return self.split_official(*to_tensors(train), *to_tensors(test))


class CIFAR100DataModule(CIFAR10DataModule):
    """CIFAR-100 (fine labels) under ``data_dir/cifar-100-python``; splits as CIFAR-10's."""

    name = "cifar100"
    num_classes = 100
    torchvision_class = _FilesExistCIFAR100
    layout = "cifar-100-python/{train,test,meta} (torchvision's CIFAR-100 python format)"
