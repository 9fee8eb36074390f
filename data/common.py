"""Small helpers shared by every dataset family: errors, seeding, splitting, statistics."""

from __future__ import annotations

import math
import pickle
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch


class DataError(ValueError):
    """A data folder is missing or malformed. The message is one line naming the folder and the expected layout."""


def data_error(data_dir: str | Path, dataset: str, problem: str, layout: str) -> DataError:
    """Build a one-line :class:`DataError`, e.g. ``data folder '/x' for cifar10 is missing ...; expected ...``."""
    message = f"data folder '{data_dir}' for {dataset} {problem}; expected {layout}"
    return DataError(" ".join(message.split()))  # one line, whatever the problem text holds


def require_data_dir(data_dir: str | Path | None, dataset: str, layout: str) -> Path:
    """Return ``data_dir`` as a Path, or raise DataError when it is None or not an existing folder."""
    if data_dir is None:
        raise DataError(f"no data folder given for {dataset} (pass data_dir / --data-dir); expected {layout}")
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise data_error(data_dir, dataset, "does not exist", layout)
    return root


def seeded_generator(*keys: int) -> torch.Generator:
    """A CPU torch.Generator whose stream depends only on the integer ``keys`` (e.g. seed, epoch, rank).

    numpy's SeedSequence mixes the keys, so (seed=0, epoch=1) and (seed=1, epoch=0) give unrelated streams.
    """
    state = np.random.SeedSequence([int(k) for k in keys]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


@contextmanager
def seeded_global_rngs(seed: int) -> Iterator[None]:
    """Seed the global RNGs that third-party transforms draw from — Python's ``random``, numpy's and torch's CPU
    generator — with ``seed`` inside the block, and restore their previous states after (timm's Mixup draws from
    numpy and ``random``, torchvision's and timm's per-image transforms from ``random`` and torch). Not
    thread-safe: another thread drawing from them meanwhile would see, and shift, the seeded streams."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.random.default_generator.manual_seed(seed)  # the CPU generator only: see lit_modules.vit._seeded
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


def stratified_split(labels: torch.Tensor, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded stratified split of ``range(len(labels))`` into sorted (train_indices, val_indices).

    The val split holds ``ceil(n * val_fraction)`` items (as scikit-learn's ``train_test_split``), shared out over
    the classes in proportion to their size by largest remainder, so each class keeps its share to within one item.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n = len(labels)
    n_val = math.ceil(n * val_fraction)
    classes, counts = labels.unique(sorted=True, return_counts=True)
    # Integer largest-remainder allocation of n_val over the classes (ties go to the lower class id).
    quota, remainder = counts * n_val // n, counts * n_val % n
    extra = torch.argsort(remainder, descending=True, stable=True)[: n_val - int(quota.sum())]
    quota[extra] += 1

    generator = seeded_generator(seed, 0x5EED)
    train_parts, val_parts = [], []
    for cls, k in zip(classes.tolist(), quota.tolist(), strict=True):
        members = (labels == cls).nonzero().flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        val_parts.append(members[:k])
        train_parts.append(members[k:])
    return torch.cat(train_parts).sort().values, torch.cat(val_parts).sort().values


#: Seed of the held-out test split of a pool: the same test images for every run seed and variant.
TEST_SPLIT_SEED = 0x7E57


def three_way_split(labels: torch.Tensor, val_fraction: float, test_fraction: float,
                    seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sorted (train, val, test) indices of one pool. The test split (``ceil(n * test_fraction)`` items,
    stratified) is drawn with :data:`TEST_SPLIT_SEED`, never with ``seed``: it is the same for every run. The val
    split (``ceil(n * val_fraction)`` items of the whole pool, stratified) is drawn from the rest with ``seed``.
    ``test_fraction`` 0: no test split (empty), train/val exactly as :func:`stratified_split` of the whole pool."""
    if test_fraction == 0:
        train, val = stratified_split(labels, val_fraction, seed)
        return train, val, torch.empty(0, dtype=torch.long)
    if not 0.0 < test_fraction < 1.0 or val_fraction + test_fraction >= 1.0:
        raise ValueError(f"val_fraction + test_fraction must be below 1 (and each in (0, 1)), got {val_fraction} + "
                         f"{test_fraction}")
    rest, test = stratified_split(labels, test_fraction, TEST_SPLIT_SEED)
    n_val = math.ceil(len(labels) * val_fraction)
    train, val = stratified_split(labels[rest], n_val / len(rest) - 1e-12, seed)
    return rest[train], rest[val], test


def channel_mean_std(
    images: torch.Tensor, pixel_max: float, chunk: int = 4096
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of ``images / pixel_max`` for an (N, C, H, W) tensor of any dtype.

    Works in float64 chunks, so 50,000 CIFAR images never need a full float copy in memory.
    """
    total = torch.zeros(images.shape[1], dtype=torch.float64)
    total_sq = torch.zeros_like(total)
    for start in range(0, len(images), chunk):
        x = images[start : start + chunk].to(torch.float64) / pixel_max
        total += x.sum(dim=(0, 2, 3))
        total_sq += x.square().sum(dim=(0, 2, 3))
    count = images.numel() / images.shape[1]
    mean = total / count
    std = (total_sq / count - mean.square()).clamp_min(1e-12).sqrt()
    return tuple(mean.tolist()), tuple(std.tolist())


# What parsers (pickle, numpy, torchvision's readers, PIL) raise on truncated, garbled or mis-shaped files.
PARSE_ERRORS = (OSError, EOFError, ValueError, KeyError, IndexError, RuntimeError, AssertionError, pickle.PickleError)


@contextmanager
def reading(data_dir: str | Path, dataset: str, layout: str) -> Iterator[None]:
    """Turn an error raised while parsing files under ``data_dir`` into a one-line DataError."""
    try:
        yield
    except DataError:
        raise
    except PARSE_ERRORS as exc:
        raise data_error(data_dir, dataset, f"could not be read ({type(exc).__name__}: {exc})", layout) from exc
