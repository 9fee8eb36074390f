"""The shared base of the in-memory datasets (digits, mnist5k, mnist, cifar10/100, synthetic).

A subclass only says what its images are (class attributes) and how to load them (``load_splits``); this base
computes the train statistics and serves the splits through :class:`~data.loader.TensorBatchLoader`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from data.base import DataModuleBase
from data.common import channel_mean_std, stratified_split, three_way_split
from data.loader import BatchTransform, TensorBatchLoader


class Splits(NamedTuple):
    """Images are uint8 (N, C, H, W) tensors, labels int64 (N,) tensors."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    val_images: torch.Tensor
    val_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor


class InMemoryDataModule(DataModuleBase):
    """Both splits held as uint8 tensors, scaled, augmented and normalised batch-wise on the fly.

    ``num_workers`` is ignored: in-memory batches need no worker processes. ``train_indices`` / ``val_indices`` /
    ``test_indices`` record the stratified split of datasets split from one pool (for datasets with an official
    test split, ``train_indices`` / ``val_indices`` index the official train split).
    """

    pixel_max: float = 255.0  # stored value of a white pixel: images are divided by it before normalising
    max_shift: int = 0  # training augmentation: random shifts of up to this many pixels (pad + crop)
    hflip: bool = False  # training augmentation: random horizontal flips

    splits: Splits | None = None
    _device_splits: tuple[torch.device, Splits] | None = None
    device: torch.device = torch.device("cpu")  # where batches are made when no Trainer is attached (e.g. a bench)
    train_indices: torch.Tensor | None = None
    val_indices: torch.Tensor | None = None
    test_indices: torch.Tensor | None = None

    def load_splits(self) -> Splits:
        """Load the data as uint8 tensors; called once, by ``setup()``."""
        raise NotImplementedError

    def split_pool(self, images: torch.Tensor, labels: torch.Tensor) -> Splits:
        """Split one pool: a fixed test split, then train/val by the run's seed (:func:`data.common.three_way_split`),
        remembering the indices."""
        split = three_way_split(labels, self.val_fraction, self.test_fraction, self.seed)
        self.train_indices, self.val_indices, self.test_indices = split
        return Splits(*(t for part in split for t in (images[part], labels[part])))

    def split_official(self, train_images: torch.Tensor, train_labels: torch.Tensor, test_images: torch.Tensor,
                       test_labels: torch.Tensor) -> Splits:
        """A dataset with an official test split: test = it; val = a seeded stratified ``val_fraction`` of the
        official train split. With ``test_fraction`` 0 the older layout: val = the official test split, no test."""
        if self.test_fraction == 0:
            empty = test_images[:0], test_labels[:0]
            return Splits(train_images, train_labels, test_images, test_labels, *empty)
        self.train_indices, self.val_indices = stratified_split(train_labels, self.val_fraction, self.seed)
        train, val = self.train_indices, self.val_indices
        return Splits(train_images[train], train_labels[train], train_images[val], train_labels[val], test_images,
                      test_labels)

    def setup(self, stage: str | None = None) -> None:
        """Load the data once (later calls, e.g. one per Lightning stage, do nothing) and compute train statistics."""
        if self.splits is not None:
            return
        splits = self.load_splits()
        self.train_size, self.val_size = len(splits.train_images), len(splits.val_images)
        self.test_size = len(splits.test_images)
        self.mean, self.std = channel_mean_std(splits.train_images, self.pixel_max)
        self.transform = BatchTransform(self.pixel_max, self.mean, self.std, self.max_shift, self.hflip,
                                        self.train_augment)
        self.splits = splits

    def device_splits(self) -> Splits:
        """The splits on the device of the attached Trainer (its strategy's root device: the rank's own GPU under
        DDP), copied there once and kept; without a Trainer, on ``self.device`` (the CPU unless set). Batches are
        then cut and augmented on the accelerator: no host-to-device copy of images per step."""
        self.setup()
        trainer = self.trainer
        device = trainer.strategy.root_device if trainer is not None else self.device
        if device.type == "cpu":
            return self.splits
        if self._device_splits is None or self._device_splits[0] != device:
            self._device_splits = (device, Splits(*(t.to(device) for t in self.splits)))
        return self._device_splits[1]

    def train_dataloader(self) -> TensorBatchLoader:
        s = self.device_splits()
        return TensorBatchLoader(
            s.train_images, s.train_labels, self.transform, self.batch_size, self.seed, train=True, augment=self.augment
        )

    def val_dataloader(self) -> TensorBatchLoader:
        s = self.device_splits()
        return TensorBatchLoader(s.val_images, s.val_labels, self.transform, self.batch_size, self.seed, train=False)

    def test_dataloader(self) -> TensorBatchLoader | None:
        s = self.device_splits()
        if not len(s.test_images):
            return None
        return TensorBatchLoader(s.test_images, s.test_labels, self.transform, self.batch_size, self.seed, train=False)

    def fixed_batch(self, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        self.setup()
        return self.transform(self.splits.val_images[:n]), self.splits.val_labels[:n]
