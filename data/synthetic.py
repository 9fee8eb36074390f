"""A generated, learnable dataset of noisy class templates: instant, offline, any size."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from data.common import seeded_generator
from data.in_memory import InMemoryDataModule, Splits

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from data.base import DataArgs


class SyntheticDataModule(InMemoryDataModule):
    """Each class has a fixed random template image; a sample is its class template plus Gaussian noise.

    Everything is generated from ``seed``: templates, labels (balanced) and noise. With the default noise a linear
    classifier, and a tiny ViT, get far above chance within an epoch or two. No augmentation.
    ``default_patch_size`` is 4 (or 2 or 1 when ``img_size`` is not a multiple of 4).
    """

    name = "synthetic"

    def __init__(
        self,
        *,
        num_samples: int = 1024,
        img_size: int = 16,
        in_chans: int = 3,
        num_classes: int = 4,
        noise: float = 0.25,
        **common: Unpack[DataArgs],
    ) -> None:
        """``noise`` is the std of the per-pixel noise, as a fraction of the [0, 1] pixel range."""
        super().__init__(**common)
        if num_samples < 2 * num_classes:
            raise ValueError(f"num_samples must be >= 2 * num_classes, got {num_samples} for {num_classes} classes")
        self.num_samples = num_samples
        self.pool_size = num_samples
        self.img_size = img_size
        self.default_patch_size = next(p for p in (4, 2, 1) if img_size % p == 0)
        self.in_chans = in_chans
        self.num_classes = num_classes
        self.noise = noise

    def load_splits(self) -> Splits:
        generator = seeded_generator(self.seed, 0x5A17)
        shape = (self.in_chans, self.img_size, self.img_size)
        templates = torch.rand(self.num_classes, *shape, generator=generator)
        labels = torch.arange(self.num_samples) % self.num_classes
        labels = labels[torch.randperm(self.num_samples, generator=generator)]
        noise = self.noise * torch.randn(self.num_samples, *shape, generator=generator)
        images = (templates[labels] + noise).clamp(0, 1).mul(255).round().to(torch.uint8)
        return self.split_pool(images, labels)
