"""The base of every DataModule here: the common constructor arguments and the metadata every dataset exposes."""

from __future__ import annotations

from typing import TypedDict

import lightning.pytorch as pl
import torch


class DataArgs(TypedDict, total=False):
    """The keyword arguments every DataModule accepts (see :class:`DataModuleBase`)."""

    data_dir: str | None
    batch_size: int
    val_fraction: float
    seed: int
    augment: bool
    num_workers: int


class DataModuleBase(pl.LightningDataModule):
    """Common arguments and metadata.

    Known right after construction, without loading data: ``name``, ``num_classes``, ``in_chans``, ``img_size``
    (square side fed to the model) and ``default_patch_size``. After ``setup()``: ``train_size``, ``val_size`` and
    the per-channel ``mean`` / ``std`` of the train split. ``fixed_batch(n)`` returns a deterministic, normalised,
    un-augmented val batch for diagnostics.
    """

    name: str
    num_classes: int
    in_chans: int
    img_size: int
    default_patch_size: int
    #: (train, val) sizes known without loading (official splits, or a fixed pool split at val_fraction 0.2);
    #: None when they depend on the data or the options. For estimates (``ablations.run --dry-run``) only.
    known_sizes: tuple[int, int] | None = None

    def __init__(
        self,
        *,
        data_dir: str | None = None,
        batch_size: int = 128,
        val_fraction: float = 0.2,
        seed: int = 0,
        augment: bool = True,
        num_workers: int = 0,
    ) -> None:
        """``val_fraction`` is used by datasets without an official val split; ``augment=False`` disables all
        augmentation (val is never augmented); ``seed`` fixes the split, the shuffle and the augmentation."""
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.seed = seed
        self.augment = augment
        self.num_workers = num_workers
        self.train_size: int | None = None
        self.val_size: int | None = None
        self.mean: tuple[float, ...] | None = None
        self.std: tuple[float, ...] | None = None

    def fixed_batch(self, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` val images (normalised, never augmented) and their labels: the same on every call."""
        raise NotImplementedError
