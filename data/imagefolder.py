"""Any image classification folder (``train/<class>/*.png``, optional ``val/<class>/*`` and ``test/<class>/*``)
via torchvision + timm.

Images are decoded per item, so this family uses a regular DataLoader (with ``num_workers``) and timm's
transforms. Augmentation stays reproducible: the sampler hands every item a seed drawn from (seed, epoch), and the
transform runs with Python's and torch's global RNGs seeded from it (their previous state is restored after).
Channels, size, patch, crop, flip and colour jitter fit the images unless given (:mod:`data.folder_fit`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from data.base import DataModuleBase
from data.common import (
    PARSE_ERRORS,
    DataError,
    channel_mean_std,
    data_error,
    reading,
    require_data_dir,
    seeded_generator,
    seeded_global_rngs,
    stratified_split,
    three_way_split,
)
from data.folder_fit import Fit, choose, image_files, look_at, unreadable
from data.loader import EpochSampler

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from data.base import DataArgs
# Imported where they are used, not here: timm. Each takes from a tenth of a second to seconds to import, and the
# command-line tools start without them.

LAYOUT = ("train/<class>/<images> and optionally val/<class>/<images> and test/<class>/<images> (torchvision "
          "ImageFolder layout)")


def find_classes(data_dir: str, split_dir: Path) -> list[str]:
    """The sorted class folders of one split, checking that there is at least one and that none is empty."""
    split = split_dir.name
    if not split_dir.is_dir():
        raise data_error(data_dir, "imagefolder", f"has no {split}/ folder", LAYOUT)
    classes = sorted(entry.name for entry in split_dir.iterdir() if entry.is_dir())  # as ImageFolder.find_classes
    if not classes:
        raise data_error(data_dir, "imagefolder", f"has no class folders in {split}/", LAYOUT)
    for cls in classes:
        if not any(path.suffix.lower() in IMG_EXTENSIONS for path in (split_dir / cls).rglob("*")):
            raise data_error(data_dir, "imagefolder", f"has no images in {split}/{cls}/", LAYOUT)
    return classes


def load_image(path: str, mode: str = "RGB"):
    """One image file as a PIL image in ``mode`` ("L": grey, "RGB"); a file that cannot be decoded is a DataError
    naming it (not the folder layout: the folder is fine, the file is not)."""
    from PIL import Image

    try:
        with open(path, "rb") as handle:
            return Image.open(handle).convert(mode)
    except PARSE_ERRORS as exc:
        raise DataError(unreadable(Path(path), exc)) from None


class ItemSeedSampler(EpochSampler):
    """An EpochSampler that yields ``(index, item_seed)`` pairs; the seeds are drawn from (seed, epoch) too."""

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.next_epoch()
        item_seeds = torch.randint(2**62, (self.num_items,), generator=self.generator(epoch, stream=1))
        yield from zip(self.order(epoch).tolist(), item_seeds.tolist(), strict=True)


class FolderSubset(Dataset):
    """Images ``indices`` of an ImageFolder through ``transform``; an ``(index, item_seed)`` key seeds the transform."""

    def __init__(self, folder: ImageFolder, indices: list[int], transform: Callable) -> None:
        self.folder = folder
        self.indices = indices
        self.transform = transform

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[torch.Tensor, int]:
        index, item_seed = key if isinstance(key, tuple) else (key, None)
        path, label = self.folder.samples[self.indices[index]]
        image = self.folder.loader(path)
        if item_seed is None:
            return self.transform(image), label
        with seeded_global_rngs(item_seed):
            return self.transform(image), label


class ImageFolderDataModule(DataModuleBase):
    """An ImageFolder tree; splits as :meth:`setup` says (a test split always, unless ``test_fraction`` is 0).

    Before anything is loaded, a sample of the train images says what they are (:mod:`data.folder_fit`): every
    option left at ``"auto"`` fits them — ``channels`` (1 for grey images, loaded as such; 3 for colour),
    ``img_size`` (their median shorter side, at most 224; images are resized to it, shorter side first, and
    centre-cropped), the patch (``patch_size``, else 16 from 128 px, about 8x8 patches from 64 px, 4x4 below),
    and the training augmentation: ``crop`` (``shift``: a random crop of the image padded by an eighth of its side; ``resized``:
    timm's random-resized crop; ``none``), ``flip`` (colour images only) and ``color_jitter`` (0.4 with the
    resized crop of colour images). :attr:`fit` holds the choices and ``fit.text()`` says them. Train mean/std are
    measured on up to ``stats_samples`` train images (a seeded sample) with the eval geometry. A recipe's
    RandAugment, colour jitter and random erasing (``train_augment``) become timm's own per-image versions (timm's
    RandAugment op set and magnitude scale, which differ from torchvision's; timm drops the colour jitter when
    RandAugment is on); its crop padding mode pads the ``shift`` crop.
    """

    name = "imagefolder"
    in_chans = 3

    def __init__(
        self,
        *,
        img_size: int | str = "auto",
        patch_size: int | None = None,
        channels: int | str = "auto",
        crop: str = "auto",
        flip: bool | str = "auto",
        color_jitter: float | str = "auto",
        stats_samples: int = 2000,
        **common: Unpack[DataArgs],
    ) -> None:
        super().__init__(**common)
        self.stats_samples = stats_samples
        self.root = require_data_dir(self.data_dir, self.name, LAYOUT)
        self.classes = find_classes(self.data_dir, self.root / "train")
        self.num_classes = len(self.classes)
        self.has_val_folder = (self.root / "val").exists()
        self.has_test_folder = (self.root / "test").exists()
        for split in ("test",) if self.has_test_folder else ():
            if find_classes(self.data_dir, self.root / split) != self.classes:
                raise data_error(self.data_dir, self.name, f"has {split}/ class folders that differ from train/'s",
                                 LAYOUT)
        if self.has_val_folder:
            val_classes = find_classes(self.data_dir, self.root / "val")
            if val_classes != self.classes:
                raise data_error(self.data_dir, self.name, "has val/ class folders that differ from train/'s", LAYOUT)
        train_files = tuple(image_files(self.root / "train", IMG_EXTENSIONS))
        needs_look = "auto" in (img_size, channels, crop, flip, color_jitter)
        try:
            look = look_at(train_files) if needs_look else None
        except ValueError as exc:  # an image that cannot be decoded: named by its file
            raise DataError(str(exc)) from None
        try:
            self.fit: Fit = choose(look, img_size=img_size, patch_size=patch_size, channels=channels, crop=crop,
                                   flip=flip, color_jitter=color_jitter)
        except ValueError as exc:
            raise DataError(f"{exc} (imagefolder '{self.data_dir}')") from None
        self.in_chans = self.fit.channels
        self.img_size = self.fit.img_size
        self.default_patch_size = self.fit.patch_size
        held_out = self.root / ("test" if self.has_test_folder else "val")
        if not self.has_val_folder and not self.has_test_folder:
            self.pool_size = len(train_files)  # the dry run's estimate: split as setup() splits it
        elif not (self.has_val_folder and self.has_test_folder):
            self.official_sizes = (len(train_files), len(image_files(held_out, IMG_EXTENSIONS)))
        self.train_set: FolderSubset | None = None
        self.val_set: FolderSubset | None = None
        self.test_set: FolderSubset | None = None

    def describe(self) -> str:
        """One line: the folder, its classes and what the run makes of its images (:meth:`Fit.text`)."""
        return f"imagefolder '{self.data_dir}': {self.num_classes} classes; {self.fit.text()}"

    def _folder(self, split: str) -> ImageFolder:
        return ImageFolder(str(self.root / split),
                           loader=functools.partial(load_image, mode="L" if self.fit.channels == 1 else "RGB"))

    def make_transform(self, training: bool, mean: tuple[float, ...], std: tuple[float, ...]) -> Callable:
        """The eval transform (resize to ``img_size``, centre crop, normalise) or the training one: the crop and
        flip of :attr:`fit`, then the recipe's ops (:attr:`train_augment`) or the fit's colour jitter."""
        from timm.data.transforms_factory import transforms_imagenet_eval, transforms_imagenet_train
        from torchvision import transforms

        size = self.fit.img_size
        if not training:
            return transforms_imagenet_eval(img_size=size, crop_pct=1.0, interpolation="bilinear", mean=mean, std=std)
        aug = self.train_augment  # the recipe's ops, as timm's per-image transforms (timm's RandAugment op set)
        primary, secondary, final = transforms_imagenet_train(
            img_size=size, hflip=0.5 if self.fit.flip else 0.0, interpolation="bilinear", mean=mean, std=std,
            color_jitter=aug.color_jitter or self.fit.color_jitter or None, re_prob=aug.random_erasing,
            re_mode="pixel",
            auto_augment=f"rand-m{aug.rand_augment_magnitude}-n{aug.rand_augment_ops}" if aug.rand_augment_ops else None,
            separate=True)
        if self.fit.crop != "resized":  # the image at its size (resized, centre-cropped), shifted or not
            steps = [transforms.Resize(size), transforms.CenterCrop(size)]
            if self.fit.crop == "shift":
                steps.append(transforms.RandomCrop(size, padding=self.fit.padding,
                                                   padding_mode=aug.crop_padding_mode))
            flips = [t for t in primary.transforms if isinstance(t, transforms.RandomHorizontalFlip)]
            primary = transforms.Compose(steps + flips)
        return transforms.Compose([*primary.transforms, *secondary.transforms, *final.transforms])

    def setup(self, stage: str | None = None) -> None:
        """Index the folders once, split if needed, measure the train statistics and build the transforms.

        Splits: ``test/`` is the test split when present, else ``val/`` (the held-out folder, as CIFAR's official
        test split), else a fixed stratified ``test_fraction`` of ``train/``; val is ``val/`` when both folders are
        there, else a seeded stratified ``val_fraction`` of what is left of ``train/``. ``test_fraction`` 0: the
        older layout (val = ``val/`` or a split of ``train/``; no test)."""
        if self.train_set is not None:
            return
        with reading(self.data_dir, self.name, LAYOUT):
            train_folder = self._folder("train")
            labels = torch.tensor(train_folder.targets)
            test_folder = val_folder = None
            test_indices: list[int] = []
            if self.test_fraction and self.has_test_folder:
                test_folder = self._folder("test")
            elif self.test_fraction and self.has_val_folder:
                test_folder = self._folder("val")
            if self.has_val_folder and (self.has_test_folder or not self.test_fraction):
                val_folder = self._folder("val")
                train_indices, val_indices = list(range(len(train_folder))), list(range(len(val_folder)))
            elif test_folder is not None or not self.test_fraction:
                val_folder = train_folder
                train_indices, val_indices = (p.tolist() for p in stratified_split(labels, self.val_fraction, self.seed))
            else:
                val_folder = test_folder = train_folder
                split = three_way_split(labels, self.val_fraction, self.test_fraction, self.seed)
                train_indices, val_indices, test_indices = (part.tolist() for part in split)
            if test_folder is not None and test_folder is not train_folder:
                test_indices = list(range(len(test_folder)))
            self.mean, self.std = self.measure_mean_std(train_folder, train_indices)
        train_transform = self.make_transform(self.augment, self.mean, self.std)
        eval_transform = self.make_transform(False, self.mean, self.std)
        self.train_set = FolderSubset(train_folder, train_indices, train_transform)
        self.val_set = FolderSubset(val_folder, val_indices, eval_transform)
        self.test_set = FolderSubset(test_folder, test_indices, eval_transform) if test_indices else None
        self.train_size, self.val_size, self.test_size = len(train_indices), len(val_indices), len(test_indices)

    def measure_mean_std(self, folder: ImageFolder, indices: list[int]) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per-channel mean/std of a seeded sample of at most ``stats_samples`` train images, in [0, 1] units."""
        pick = torch.randperm(len(indices), generator=seeded_generator(self.seed, 0x57A7))[: self.stats_samples]
        channels = self.fit.channels
        unnormalised = self.make_transform(False, mean=(0.0,) * channels, std=(1.0,) * channels)
        sample = FolderSubset(folder, [indices[i] for i in pick.sort().values], unnormalised)
        images = torch.stack([sample[i][0] for i in range(len(sample))])
        return channel_mean_std(images, pixel_max=1.0)

    def train_dataloader(self) -> DataLoader:
        self.setup()
        sampler = ItemSeedSampler(len(self.train_set), self.seed, shuffle=True)
        single_image_last_batch = len(self.train_set) % self.batch_size == 1
        return self._loader(self.train_set, sampler=sampler, drop_last=single_image_last_batch)

    def val_dataloader(self) -> DataLoader:
        self.setup()
        return self._loader(self.val_set, shuffle=False)

    def test_dataloader(self) -> DataLoader | None:
        self.setup()
        return None if self.test_set is None else self._loader(self.test_set, shuffle=False)

    def _loader(self, dataset: FolderSubset, **kwargs) -> DataLoader:
        workers = self.num_workers
        return DataLoader(dataset, self.batch_size, num_workers=workers, persistent_workers=workers > 0, **kwargs)

    def fixed_batch(self, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
        self.setup()
        items = [self.val_set[i] for i in range(min(n, len(self.val_set)))]
        return torch.stack([image for image, _ in items]), torch.tensor([label for _, label in items])
