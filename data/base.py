"""The base of every DataModule here: the common constructor arguments and the metadata every dataset exposes."""

from __future__ import annotations

import math
from typing import TypedDict

import lightning.pytorch as pl
import torch

from data.settings import DataConfig, TrainAugment


def split_sizes(pool_size: int | None, official_sizes: tuple[int, int] | None, val_fraction: float,
                test_fraction: float) -> tuple[int, int, int] | None:
    """(train, val, test) sizes of a pool of ``pool_size`` images or of official (train, test) splits, as the
    DataModules split them (:func:`data.common.three_way_split`, ``split_official``); None when neither is known."""
    if official_sizes is not None:
        train, test = official_sizes
        if test_fraction == 0:
            return train, test, 0
        val = math.ceil(train * val_fraction)
        return train - val, val, test
    if pool_size is None:
        return None
    test, val = math.ceil(pool_size * test_fraction), math.ceil(pool_size * val_fraction)
    return pool_size - test - val, val, test


class DataArgs(TypedDict, total=False):
    """The keyword arguments every DataModule accepts (see :class:`DataModuleBase`)."""

    data_dir: str | None
    batch_size: int
    val_fraction: float
    test_fraction: float
    seed: int
    augment: bool
    num_workers: int
    train_augment: TrainAugment


class DataModuleBase(pl.LightningDataModule):
    """Common arguments and metadata.

    Known right after construction, without loading data: ``name``, ``num_classes``, ``in_chans``, ``img_size``
    (square side fed to the model) and ``default_patch_size``. After ``setup()``: ``train_size``, ``val_size``,
    ``test_size`` and the per-channel ``mean`` / ``std`` of the train split. ``fixed_batch(n)`` returns a
    deterministic, normalised, un-augmented val batch for diagnostics.

    Three splits: train (fitted), val (every selection: the best epoch, a tuned learning rate) and test (reported,
    never selected on). The test split is the same images for every seed and variant: a dataset's official test
    split, or a stratified share ``test_fraction`` of a pool drawn with a fixed seed
    (:data:`data.common.TEST_SPLIT_SEED`); val is drawn with the run's ``seed`` from what is left (a share
    ``val_fraction`` of the pool, or of the official train split). ``test_fraction=0`` keeps the two-split layout
    of studies run before the test split (val = the official test split, or ``val_fraction`` of the pool).
    """

    name: str
    num_classes: int
    in_chans: int
    img_size: int
    default_patch_size: int
    #: Images known without loading: the pool's size (``pool``) or the official (train, test) sizes
    #: (``official``); None when they depend on the data or the options. For estimates (``sizes``) only.
    pool_size: int | None = None
    official_sizes: tuple[int, int] | None = None

    def __init__(
        self,
        *,
        data_dir: str | None = DataConfig.data_dir,
        batch_size: int = DataConfig.batch_size,
        val_fraction: float = DataConfig.val_fraction,
        test_fraction: float = DataConfig.test_fraction,
        seed: int = 0,
        augment: bool = DataConfig.augment,
        num_workers: int = DataConfig.num_workers,
        train_augment: TrainAugment | None = None,
    ) -> None:
        """``val_fraction`` is used by datasets without an official val split; ``augment=False`` disables all
        augmentation (val is never augmented); ``seed`` fixes the split, the shuffle and the augmentation;
        ``train_augment``: the recipe's augmentation beyond the dataset's own crop and flip; ``test_fraction``:
        the held-out test share of a pool (datasets with an official test split use it whenever it is above 0)."""
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        if not 0.0 <= test_fraction < 1.0 or val_fraction + test_fraction >= 1.0:
            raise ValueError(f"test_fraction must be in [0, 1) with val_fraction + test_fraction < 1, got "
                             f"{test_fraction} (val_fraction {val_fraction})")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.seed = seed
        self.augment = augment
        self.num_workers = num_workers
        self.train_augment = train_augment or TrainAugment()
        self.train_size: int | None = None
        self.val_size: int | None = None
        self.test_size: int | None = None
        self.mean: tuple[float, ...] | None = None
        self.std: tuple[float, ...] | None = None

    def sizes(self) -> tuple[int, int, int] | None:
        """(train, val, test) sizes before loading, as ``setup()`` will make them (None: unknown until loaded)."""
        return split_sizes(self.pool_size, self.official_sizes, self.val_fraction, self.test_fraction)

    def test_dataloader(self):
        """The test split, in its stored order, never augmented (None when there is no test split)."""
        raise NotImplementedError

    def fixed_batch(self, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` val images (normalised, never augmented) and their labels: the same on every call."""
        raise NotImplementedError
