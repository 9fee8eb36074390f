"""SVHN: 32x32 colour house-number digits from a folder in torchvision's format (``train_32x32.mat``,
``test_32x32.mat``), parsed by torchvision itself (labels 10 -> 0, as torchvision does)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torchvision.datasets import SVHN

from data.common import data_error, reading, require_data_dir
from data.in_memory import InMemoryDataModule, Splits

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from data.base import DataArgs


class _FilesExistSVHN(SVHN):
    """torchvision's SVHN parser with its md5 check replaced by a file-existence check (as the CIFAR parsers here:
    the md5 would reject any file but the official ones, and reading 180 MB twice per load is wasted time)."""

    def _check_integrity(self) -> bool:
        return (Path(self.root) / self.filename).is_file()


class SVHNDataModule(InMemoryDataModule):
    """SVHN (73,257 train / 26,032 test; the 'extra' split is not used) with the ``.mat`` files directly under
    ``data_dir`` (torchvision's SVHN root); test = the official test split, val = a seeded ``val_fraction`` of the
    official train split. Held in memory as uint8 (N, 3, 32, 32); augmentation: random crop with 4-px zero padding,
    no flips (digits)."""

    name = "svhn"
    num_classes = 10
    in_chans = 3
    img_size = 32
    official_sizes = (73257, 26032)  # official train / test splits
    default_patch_size = 4
    max_shift = 4
    files = ("train_32x32.mat", "test_32x32.mat")
    layout = "train_32x32.mat and test_32x32.mat directly in the folder (torchvision's SVHN format)"

    @classmethod
    def missing_files(cls, root: Path) -> list[str]:
        """The files of the layout not under ``root``."""
        return [name for name in cls.files if not (root / name).is_file()]

    def __init__(self, **common: Unpack[DataArgs]) -> None:
        super().__init__(**common)
        missing = self.missing_files(require_data_dir(self.data_dir, self.name, self.layout))
        if missing:
            raise data_error(self.data_dir, self.name, f"is missing {', '.join(missing)}", self.layout)

    def load_splits(self) -> Splits:
        with reading(self.data_dir, self.name, self.layout):
            train, test = (_FilesExistSVHN(str(self.data_dir), split=s, download=False) for s in ("train", "test"))
            for split in (train, test):
                shape = tuple(split.data.shape[1:])
                if shape != (3, 32, 32) or len(split.data) != len(split.labels):
                    raise ValueError(f"{len(split.data)} images of shape {shape} and {len(split.labels)} labels")
                if len(split.labels) and (split.labels.min() < 0 or split.labels.max() >= self.num_classes):
                    raise ValueError(f"labels outside 0..{self.num_classes - 1} (and 10 for the digit 0)")

        def to_tensors(split: SVHN) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.from_numpy(split.data).contiguous(), torch.from_numpy(split.labels).long()

        return self.split_official(*to_tensors(train), *to_tensors(test))
