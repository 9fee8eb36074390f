"""The data's settings, torch-free: what a DataModule is given (:class:`DataConfig`) and a recipe's per-image
augmentation (:class:`TrainAugment`). Each field's default is declared here once, with its help line and valid names:
``DataModuleBase`` takes its defaults from here, and a run's configuration holds these (``ablations.config``), whose
command line must not import torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from data.names import DATASET_NAMES

#: Padding of the random crop: zeros, or the image mirrored at its border.
PADDING_MODES: tuple[str, ...] = ("constant", "reflect")


@dataclass(frozen=True)
class TrainAugment:
    """A recipe's per-image training augmentation on top of the dataset's own random crop and flip.

    Applied in this order, after the crop (``crop_padding_mode``) and flip: RandAugment (``rand_augment_ops`` ops
    at ``rand_augment_magnitude``; 0 ops: off), colour jitter (brightness, contrast, saturation, hue; empty: off),
    then, on the [0, 1] float image, random erasing with probability ``random_erasing``. Mixup/CutMix is not here:
    it mixes a batch and its labels, so the LightningModule applies it (:class:`lit_modules.classifier.ViTClassifier`).
    The default is no extra augmentation (the ``basic`` recipe). Each field's ``help`` and ``choices`` describe it as
    a run's option.
    """

    crop_padding_mode: str = field(default="constant", metadata={
        "help": "padding of the random crop: " + ", ".join(PADDING_MODES), "choices": PADDING_MODES})
    rand_augment_ops: int = field(default=0, metadata={"help": "RandAugment ops per image (0: off)"})
    rand_augment_magnitude: int = field(default=9, metadata={"help": "RandAugment magnitude (of 31 bins)"})
    color_jitter: tuple[float, ...] = field(default=(), metadata={
        "help": "colour jitter brightness contrast saturation hue (0: off; one value v: v v v 0)"})
    random_erasing: float = field(default=0.0, metadata={"help": "random-erasing probability per image"})

    @property
    def changes_pixels(self) -> bool:
        """Whether any op beyond crop and flip is on (RandAugment, colour jitter or random erasing)."""
        return bool(self.rand_augment_ops or self.color_jitter or self.random_erasing)


@dataclass(frozen=True)
class DataConfig:
    """The dataset, its split into train/val/test, and how batches are loaded (``data.build_datamodule(dataset,
    **the others)``)."""

    dataset: str = field(default="digits", metadata={"help": "dataset: " + ", ".join(DATASET_NAMES),
                                                     "choices": DATASET_NAMES})
    data_dir: str | None = field(default=None, metadata={
        "help": "data folder (needed by mnist, cifar10/100, svhn, imagefolder; fashion_mnist looks here first, then "
                "in Debian's dataset-fashion-mnist folder)"})
    batch_size: int = field(default=128, metadata={"help": "batch size per device"})
    val_fraction: float = field(default=0.2, metadata={
        "help": "val share of a pool (or of an official train split), drawn with the run's seed"})
    test_fraction: float = field(default=0.2, metadata={
        "help": "held-out test share of a pool, the same images for every seed (datasets with an official test split "
                "use it); 0: no test split, val as before the test split"})
    augment: bool = field(default=True, metadata={
        "help": "training augmentation: the dataset's own crop/flip plus the recipe's (off: none, no Mixup)"})
    dataset_options: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "extra dataset arguments, e.g. num_samples=512 (synthetic)"})
    num_workers: int = field(default=0, metadata={"help": "DataLoader workers (in-memory datasets ignore it)"})

    def check(self) -> None:
        """One-line ValueErrors for settings no DataModule takes (before any is built)."""
        if not self.batch_size > 0:
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size}")
        if not self.num_workers >= 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction:g}")
        if not 0.0 <= self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must be in [0, 1), got {self.test_fraction:g}")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError(f"val_fraction + test_fraction must be below 1, got {self.val_fraction:g} + "
                             f"{self.test_fraction:g}")
