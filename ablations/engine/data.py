"""The K runs' batches, stacked with a static shape, resident on the device.

Every run keeps its own data exactly as its plain run has it (:class:`data.in_memory.InMemoryDataModule` and
:class:`data.loader.TensorBatchLoader`): its own train/val split (drawn with its seed; the test split is the same for
all), its own per-epoch shuffle and its own augmentation draws from generators seeded by (seed, epoch). The runs
of a stack have splits of equal size, so their epochs have the same number of batches; the batches are stacked to
``(K, B, ...)`` and the last, smaller one is padded to B with zero images of weight 0 (:mod:`ablations.engine.step`),
so every step has one shape.

Two ways to make an epoch's training batches:

- **resident** (the recipe only crops and flips: ``basic``): the whole epoch of every run is computed on the device
  at the epoch's start in a few kernels. The crop offsets and flips are drawn by the very functions the loader
  calls (:func:`data.augment.random_crop`, :func:`data.augment.random_hflip`), in the loader's order, from the
  loader's generator, but applied on the CPU to an *index image* (pixel i holds i + 1, padding 0) instead of the
  pixels; the device then gathers every image's pixels through its index map, scales and normalises them: the
  same values as the loader's batches, bit for bit (``tests/test_engine.py``);
- **loader** (any other recipe: RandAugment, colour jitter, erasing, Mixup/CutMix): each run's own loader makes each
  batch on the device, as in its plain run, and the batches are stacked (Mixup/CutMix per run, from the same
  per-batch generator as ``ViTClassifier``).

Validation and test batches never change: they are made once, stacked and kept on the device (on a GPU in batches
of at least :data:`ablations.engine.loop.EVAL_BATCH_CUDA`: fewer launches, the same sums in another order).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Batch:
    """One stacked step's tensors: ``x`` (K, B, C, H, W), ``targets`` (K, B) labels or (K, B, classes) soft
    targets, ``labels`` (K, B) hard labels, ``weight`` (K, B) 1 for a real image, 0 for padding; ``images`` the
    real images of each run (the same for all runs of a stack)."""

    x: torch.Tensor
    targets: torch.Tensor
    labels: torch.Tensor
    weight: torch.Tensor
    images: int


def pad(t: torch.Tensor, size: int) -> torch.Tensor:
    """``t`` (n, ...) padded with zeros to (size, ...)."""
    if len(t) == size:
        return t
    return torch.cat([t, t.new_zeros(size - len(t), *t.shape[1:])])


def resident_ok(datamodule: Any) -> bool:
    """Whether a run's training batches can be made a whole epoch at a time (:class:`ResidentEpochs`): an in-memory
    datamodule whose augmentation is crop and flip only, or none."""
    transform = getattr(datamodule, "transform", None)
    return (transform is not None and hasattr(datamodule, "device_splits") and not transform.pixel_ops
            and transform.erasing is None)


class StackedBatches:
    """The K runs' batches (module docstring). ``datamodules``: each run's set-up DataModule (in-memory);
    ``device``: where the batches live; ``mixups``: each run's ``(SeededMixup, seed)`` or None; ``num_classes``;
    ``eval_batch_size``: the validation and test batches' size (default ``batch_size``)."""

    def __init__(self, datamodules: Sequence[Any], device: torch.device, *, batch_size: int,
                 mixups: Sequence[tuple[Any, int] | None] = (), num_classes: int = 10,
                 resident: bool | None = None, eval_batch_size: int | None = None) -> None:
        self.datamodules = list(datamodules)
        self.k = len(self.datamodules)
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_classes = num_classes
        self.mixups = list(mixups) or [None] * self.k
        for dm in self.datamodules:
            dm.device = self.device  # where its loaders cut and augment batches (no Trainer attached)
        self.loaders = [dm.train_dataloader() for dm in self.datamodules]
        sizes = {len(loader) for loader in self.loaders}
        if len(sizes) != 1:
            raise ValueError(f"the runs' training splits give different numbers of batches per epoch: {sorted(sizes)}")
        self.steps = sizes.pop()
        can = all(resident_ok(dm) for dm in self.datamodules) and not any(self.mixups)
        self.resident = can if resident is None else resident and can
        self.val = self._eval("val")
        self.test = self._eval("test")

    # --- training ------------------------------------------------------------------------------------------------
    def epoch(self, epoch: int) -> Iterator[Batch]:
        """The training batches of ``epoch`` (0-based), in order."""
        if self.resident:
            yield from self._resident_epoch(epoch)
            return
        for loader in self.loaders:
            loader.sampler.set_epoch(epoch)  # what Lightning does at each epoch's start
        iterators = [iter(loader) for loader in self.loaders]
        for i in range(self.steps):
            xs, targets, labels, counts = [], [], [], []
            for k, it in enumerate(iterators):
                x, y = next(it)
                t = y
                if self.mixups[k] is not None:
                    mixup, seed = self.mixups[k]
                    x, t = mixup(x, y, mixup_generator(seed, epoch, i))
                xs.append(pad(x, self.batch_size))
                targets.append(pad(t, self.batch_size))
                labels.append(pad(y, self.batch_size))
                counts.append(len(y))
            yield self._stacked(xs, targets, labels, counts[0])

    def _stacked(self, xs: list, targets: list, labels: list, n: int) -> Batch:
        weight = torch.zeros(self.k, self.batch_size, device=self.device)
        weight[:, :n] = 1
        return Batch(torch.stack(xs), torch.stack(targets), torch.stack(labels), weight, n)

    def _resident_epoch(self, epoch: int) -> Iterator[Batch]:
        per_run = [resident_epoch(loader, dm.transform, epoch, self.steps, self.batch_size)
                   for loader, dm in zip(self.loaders, self.datamodules, strict=True)]
        x = torch.stack([p[0] for p in per_run])  # (K, steps, B, C, H, W)
        y = torch.stack([p[1] for p in per_run])  # (K, steps, B)
        counts = per_run[0][2]
        for i, n in enumerate(counts):
            weight = torch.zeros(self.k, self.batch_size, device=self.device)
            weight[:, :n] = 1
            yield Batch(x[:, i], y[:, i], y[:, i], weight, n)

    # --- evaluation ----------------------------------------------------------------------------------------------
    def _eval(self, split: str) -> list[Batch]:
        """The split of every run in its stored order, never augmented, cut into batches of ``eval_batch_size``
        (the last padded). A run's validation loss is the image-weighted mean of its batch losses and its
        accuracy a count over all images, so the batch size changes nothing but the order of floating-point sums."""
        loaders = [getattr(dm, f"{split}_dataloader")() for dm in self.datamodules]
        if any(loader is None for loader in loaders):
            return []
        whole = []
        for loader in loaders:
            parts = list(loader)
            whole.append((torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])))
        if len({len(y) for _, y in whole}) != 1:
            raise ValueError(f"the runs' {split} splits have different sizes")
        size, step = len(whole[0][1]), self.eval_batch_size
        out = []
        for start in range(0, size, step):
            xs = [pad(x[start:start + step], step) for x, _ in whole]
            ys = [pad(y[start:start + step], step) for _, y in whole]
            n = min(step, size - start)
            weight = torch.zeros(self.k, step, device=self.device)
            weight[:, :n] = 1
            out.append(Batch(torch.stack(xs), torch.stack(ys), torch.stack(ys), weight, n))
        return out


def mixup_generator(seed: int, epoch: int, batch_idx: int) -> torch.Generator:
    """The generator of one training batch's Mixup/CutMix draws, as ``ViTClassifier.batch_generator`` seeds it
    (rank 0)."""
    from data.common import seeded_generator
    from lit_modules.classifier import MIXUP_STREAM

    return seeded_generator(seed, epoch, batch_idx, 0, MIXUP_STREAM)


def resident_epoch(loader: Any, transform: Any, epoch: int, steps: int, batch_size: int) -> \
        tuple[torch.Tensor, torch.Tensor, list[int]]:
    """One run's whole training epoch, as its loader would cut it: ``(steps, B, C, H, W)`` float images (the last
    batch zero-padded), ``(steps, B)`` labels and each batch's real size. Crop and flip are drawn on the CPU on
    index images (module docstring) and applied on the images' device in one gather."""
    from data.augment import random_crop, random_hflip

    images, labels = loader.images, loader.labels
    n, c, h, w = images.shape
    order = loader.sampler.order(epoch)
    generator = loader.sampler.generator(epoch, stream=1) if loader.augment else None
    maps, counts, index = [], [], []
    base = torch.arange(1, h * w + 1, dtype=torch.int32).view(1, 1, h, w)
    for i in range(steps):
        part = order[i * batch_size:(i + 1) * batch_size]
        counts.append(len(part))
        index.append(pad(part, batch_size))
        if generator is not None:
            m = base.expand(len(part), 1, h, w)
            if transform.max_shift:
                m = random_crop(m, transform.max_shift, generator, transform.padding_mode)
            if transform.hflip:
                m = random_hflip(m, generator)
            maps.append(pad(m.reshape(len(part), h * w), batch_size))
    device = images.device
    index = torch.stack(index).to(device)  # (steps, B)
    pixels = images[index.view(-1)].view(steps * batch_size, c, h * w)
    if maps:
        source = torch.stack(maps).view(steps * batch_size, 1, h * w).to(device=device, dtype=torch.long)
        pixels = pixels.gather(2, (source - 1).clamp_(min=0).expand(-1, c, -1))
        pixels = pixels.masked_fill_((source == 0).expand(-1, c, -1), 0)  # constant padding: zeros
    x = pixels.view(steps * batch_size, c, h, w).float() / transform.pixel_max
    mean, std = transform.mean.to(device), transform.std.to(device)
    x = x.sub_(mean).div_(std).view(steps, batch_size, c, h, w)
    valid = torch.zeros(steps, batch_size, dtype=torch.bool)
    for i, count in enumerate(counts):
        valid[i, :count] = True
    x = x * valid.to(device).view(steps, batch_size, 1, 1, 1)  # padding rows: zeros, as pad() makes them
    y = labels[index.view(-1)].view(steps, batch_size) * valid.to(device)
    return x, y, counts
