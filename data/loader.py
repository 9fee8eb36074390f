"""Seeded epoch ordering, batched tensor augmentation and the in-memory batch loader.

The in-memory datasets keep a whole split as one uint8 tensor and cut batches by indexing it with a tensor of
indices, so there is no per-item ``__getitem__`` and no collate: tens of thousands of images per second on one
core, with augmentation. Everything random comes from generators seeded by (seed, epoch[, rank]).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils.data import Sampler

from data.base import TrainAugment
from data.common import seeded_generator

# Imported where they are used, not here: data.augment (timm and torchvision's transforms). Each takes from a tenth of
# a second to seconds to import, and the command-line tools start without them.


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


@contextmanager
def one_cpu_thread(device: torch.device) -> Iterator[None]:
    """Run the block on one intra-op thread when ``device`` is the CPU. The recipe's pixel ops are hundreds of
    small calls per batch (RandAugment groups, colour-jitter blends): with two threads on this 2-core machine a
    batch of 128 CIFAR images took 0.3-4.7 s under load against 64-96 ms on one thread."""
    if device.type != "cpu" or torch.get_num_threads() == 1:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class BatchTransform:
    """uint8 batch -> float batch: augment (when given a generator), scale to [0, 1], normalise with the train
    mean/std. Runs on whatever device the batch is on; every random number is drawn from the CPU generator.

    Training order (each op with its own random parameters per image, :mod:`data.augment`): random crop of the
    image padded by ``max_shift`` (``augment.crop_padding_mode``: zeros or reflect), horizontal flip, then the
    recipe's RandAugment and colour jitter on uint8 pixels in [0, 255], then random erasing on the [0, 1] image,
    then normalisation. Without the recipe's ops, the crop and flip run on the stored values as they are.
    """

    def __init__(
        self,
        pixel_max: float,
        mean: tuple[float, ...],
        std: tuple[float, ...],
        max_shift: int = 0,
        hflip: bool = False,
        augment: TrainAugment | None = None,
    ) -> None:
        from data.augment import BatchColorJitter, BatchRandAugment, BatchRandomErasing

        augment = augment or TrainAugment()
        self.pixel_max = pixel_max
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self._stats_on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}  # mean, std per device
        self.max_shift = max_shift
        self.hflip = hflip
        self.padding_mode = augment.crop_padding_mode
        self.pixel_ops = []  # uint8 ops in [0, 255]
        if augment.rand_augment_ops:
            self.pixel_ops.append(BatchRandAugment(augment.rand_augment_ops, augment.rand_augment_magnitude))
        if augment.color_jitter:
            self.pixel_ops.append(BatchColorJitter(*augment.color_jitter))
        self.erasing = BatchRandomErasing(augment.random_erasing) if augment.random_erasing else None

    def __call__(self, images: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Transform a batch; augmentation is applied only when a ``generator`` is given."""
        from data.augment import random_crop, random_hflip

        x = images  # never modified in place: every op returns a new tensor
        if generator is not None:
            if self.max_shift:
                x = random_crop(x, self.max_shift, generator, self.padding_mode)
            if self.hflip:
                x = random_hflip(x, generator)
            if self.pixel_ops:
                x = x if self.pixel_max == 255 else (x.float() * (255 / self.pixel_max)).round_().to(torch.uint8)
                with one_cpu_thread(x.device):
                    for op in self.pixel_ops:
                        x = op(x, generator)
                x = x.float() / 255
            else:
                x = x.float() / self.pixel_max
            if self.erasing is not None:
                x = self.erasing(x, generator)
        else:
            x = x.float() / self.pixel_max
        if x.device not in self._stats_on:  # copied once per device, not once per batch
            self._stats_on[x.device] = (self.mean.to(x.device), self.std.to(x.device))
        mean, std = self._stats_on[x.device]
        return x.sub_(mean).div_(std)


class TensorBatchLoader:
    """An iterable of (images, labels) batches cut from in-memory tensors; Lightning accepts it as a dataloader.

    The batches are cut and transformed where ``images`` are: a DataModule that moved its images onto the
    accelerator gets batches made there (the order and the random parameters are drawn on the CPU as always).

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
        order = self._shard(self.sampler.order(epoch)).to(self.images.device)  # the images may be on an accelerator
        rank, _ = rank_and_world_size()
        generator = self.sampler.generator(epoch, stream=1 + rank) if self.augment else None
        for i in range(self._num_batches(len(order))):
            index = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield self.transform(self.images[index], generator), self.labels[index]
