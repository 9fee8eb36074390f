"""Seeded epoch ordering, batched tensor augmentation and the in-memory batch loader.

The in-memory datasets keep a whole split as one uint8 tensor and cut batches by indexing it with a tensor of
indices, so there is no per-item ``__getitem__`` and no collate: tens of thousands of images per second on one
core, with augmentation. Everything random comes from generators seeded by (seed, epoch[, rank]).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.utils.data import Sampler

from data.common import seeded_generator


def rank_and_world_size() -> tuple[int, int]:
    """(rank, world size) of the initialised default torch.distributed process group, else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class EpochSampler(Sampler[int]):
    """Yields ``range(num_items)``, shuffled by a generator seeded from (seed, epoch) when ``shuffle``.

    Lightning calls ``set_epoch`` at the start of every epoch (it looks for ``loader.sampler.set_epoch``); without
    it, each pass moves on to the next epoch by itself, so consecutive passes differ but are reproducible.
    """

    def __init__(self, num_items: int, seed: int, shuffle: bool) -> None:
        self.num_items = num_items
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def next_epoch(self) -> int:
        """Return the epoch the coming pass belongs to, and move on to the next one."""
        epoch, self.epoch = self.epoch, self.epoch + 1
        return epoch

    def generator(self, epoch: int, stream: int) -> torch.Generator:
        """An independent generator for one use (``stream``) within one epoch."""
        return seeded_generator(self.seed, epoch, stream)

    def order(self, epoch: int) -> torch.Tensor:
        """The item order of ``epoch``: a seeded permutation, or ``arange`` when not shuffling."""
        if not self.shuffle:
            return torch.arange(self.num_items)
        return torch.randperm(self.num_items, generator=self.generator(epoch, stream=0))

    def __iter__(self) -> Iterator[int]:
        yield from self.order(self.next_epoch()).tolist()

    def __len__(self) -> int:
        return self.num_items


def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Shift each image by its own random (dy, dx) in [-max_shift, max_shift], filling with zeros (pad + crop)."""
    b, c, h, w = images.shape
    padded = F.pad(images, (max_shift,) * 4)
    offsets = torch.randint(0, 2 * max_shift + 1, (2, b, 1), generator=generator)
    rows = offsets[0] + torch.arange(h)  # (B, H): padded row read for each output row
    cols = offsets[1] + torch.arange(w)  # (B, W)
    flat_index = (rows[:, :, None] * padded.shape[-1] + cols[:, None, :]).view(b, 1, h * w).expand(b, c, h * w)
    return padded.flatten(2).gather(2, flat_index).view(b, c, h, w)


def random_hflip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Mirror each image left-right with probability 1/2."""
    flip = torch.rand(len(images), generator=generator) < 0.5
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


class BatchTransform:
    """uint8 batch -> float batch: scale by ``pixel_max``, optionally augment, normalise with the train mean/std."""

    def __init__(
        self,
        pixel_max: float,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        max_shift: int = 0,
        hflip: bool = False,
    ) -> None:
        self.pixel_max = pixel_max
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.max_shift = max_shift
        self.hflip = hflip

    def __call__(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Transform a batch; augmentation is applied only when a ``generator`` is given."""
        x = images.float() / self.pixel_max  # a new tensor: the stored images are never modified
        if generator is not None:
            if self.max_shift:
                x = random_shift(x, self.max_shift, generator)
            if self.hflip:
                x = random_hflip(x, generator)
        return x.sub_(self.mean).div_(self.std)


class TensorBatchLoader:
    """An iterable of (images, labels) batches cut from in-memory tensors; Lightning accepts it as a dataloader.

    A ``train`` loader shuffles per epoch, augments (if ``augment``) and drops a last batch of a single image;
    an eval loader keeps the stored order and every image, and never augments.

    Under torch.distributed it shards itself, because Lightning only injects a DistributedSampler into real
    ``DataLoader`` objects: a train loader gives each rank a disjoint, equal-size shard of the epoch's permutation
    (dropping at most ``world_size - 1`` items per epoch); an eval loader gives rank r the items
    ``r, r + world_size, ...`` (disjoint, sizes differ by at most one).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        transform: BatchTransform,
        batch_size: int,
        seed: int,
        train: bool,
        augment: bool = False,
    ) -> None:
        self.images = images
        self.labels = labels
        self.transform = transform
        self.batch_size = batch_size
        self.train = train
        self.augment = train and augment
        # Lightning calls ``loader.sampler.set_epoch(epoch)`` each epoch, and reads ``loader.batch_sampler`` too.
        self.sampler = EpochSampler(len(images), seed, shuffle=train)
        self.batch_sampler = None

    def _shard(self, order: torch.Tensor) -> torch.Tensor:
        rank, world_size = rank_and_world_size()
        if world_size == 1:
            return order
        if self.train:  # equal sizes, so every rank runs the same number of steps
            order = order[: len(order) // world_size * world_size]
        return order[rank::world_size]

    def _num_batches(self, num_items: int) -> int:
        full, rest = divmod(num_items, self.batch_size)
        keep_rest = rest >= 2 or (rest == 1 and not self.train)
        return full + int(keep_rest)

    def __len__(self) -> int:
        return self._num_batches(len(self._shard(torch.arange(len(self.images)))))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        epoch = self.sampler.next_epoch()
        order = self._shard(self.sampler.order(epoch))
        rank, _ = rank_and_world_size()
        generator = self.sampler.generator(epoch, stream=1 + rank) if self.augment else None
        for i in range(self._num_batches(len(order))):
            index = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield self.transform(self.images[index], generator), self.labels[index]
