"""Tests for the data package: splits, determinism, normalisation, augmentation, folder formats, errors, Lightning.

Folder datasets are tested on tiny folders written here in the real on-disk formats (CIFAR pickles, MNIST idx
files, PNG trees) and parsed by torchvision's own code. Nothing is downloaded.
"""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import data.loader
from data import DATASETS, DataError, build_datamodule
from data.augment import random_crop
from data.common import stratified_split
from data.loader import TensorBatchLoader

# ----------------------------------------------------------------------------------------------------------------
# helpers


def first_batch(dm) -> tuple[torch.Tensor, torch.Tensor]:
    return next(iter(dm.train_dataloader()))


def concat(loader) -> tuple[torch.Tensor, torch.Tensor]:
    batches = list(loader)
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


def unnormalise(dm, images: torch.Tensor) -> torch.Tensor:
    """Back to [0, 1] pixel units."""
    mean, std = torch.tensor(dm.mean).view(1, -1, 1, 1), torch.tensor(dm.std).view(1, -1, 1, 1)
    return images * std + mean


def matching_offsets(plain: torch.Tensor, augmented: torch.Tensor, pad: int, flips: bool) -> list[tuple]:
    """All (dy, dx, flipped) for which ``augmented`` is ``plain`` zero-padded by ``pad``, cropped (and mirrored)."""
    h, w = plain.shape[-2:]
    padded = F.pad(plain, (pad,) * 4)
    found = []
    for flipped in (False, True) if flips else (False,):
        source = padded.flip(-1) if flipped else padded
        for dy in range(2 * pad + 1):
            for dx in range(2 * pad + 1):
                if torch.allclose(source[..., dy : dy + h, dx : dx + w], augmented, atol=1e-5):
                    found.append((dy - pad, dx - pad, flipped))
    return found


def assert_one_line_error(excinfo, *fragments: str) -> None:
    message = str(excinfo.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def write_cifar(root: Path, num_classes: int, n_train: int = 20, n_test: int = 10) -> dict:
    """A tiny CIFAR-10/100 folder in torchvision's pickle format; returns what was written.

    The real files are Python 2 pickles whose str keys torchvision decodes (``encoding="latin1"``) to 'data',
    'labels', ...: the same dicts are pickled here with str keys.
    """
    rng = np.random.default_rng(num_classes)
    images = rng.integers(0, 256, (n_train + n_test, 3072), dtype=np.uint8)  # rows: 1024 R, 1024 G, 1024 B
    labels = rng.integers(0, num_classes, n_train + n_test).tolist()
    names = [f"class_{i}" for i in range(num_classes)]
    label_key = "labels" if num_classes == 10 else "fine_labels"

    def batch(rows: slice, title: str) -> dict:
        return {"batch_label": title, "data": images[rows], label_key: labels[rows], "filenames": []}

    if num_classes == 10:
        folder, per_file = root / "cifar-10-batches-py", n_train // 5
        files = {f"data_batch_{i + 1}": batch(slice(i * per_file, (i + 1) * per_file), "training") for i in range(5)}
        files["test_batch"] = batch(slice(n_train, None), "testing")
        files["batches.meta"] = {"label_names": names, "num_cases_per_batch": per_file, "num_vis": 3072}
    else:
        folder = root / "cifar-100-python"
        files = {"train": batch(slice(None, n_train), "training"), "test": batch(slice(n_train, None), "testing")}
        files["meta"] = {"fine_label_names": names, "coarse_label_names": [f"super_{i}" for i in range(20)]}
    folder.mkdir(parents=True)
    for name, content in files.items():
        (folder / name).write_bytes(pickle.dumps(content, protocol=2))
    as_tensor = torch.from_numpy(images).view(-1, 3, 32, 32)
    return {
        "folder": folder,
        "train": (as_tensor[:n_train], labels[:n_train]),
        "test": (as_tensor[n_train:], labels[n_train:]),
    }


def write_png_tree(root: Path, classes: list[str], per_class: int, seed: int = 0) -> None:
    """``root/<class>/<i>.png``: 10x12 RGB images, one base colour per class plus noise."""
    rng = np.random.default_rng(seed)
    for c, cls in enumerate(classes):
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(60 * c + rng.integers(0, 80, (10, 12, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / cls / f"{i}.png")


class LinearClassifier(pl.LightningModule):
    """The smallest model that shows the loaders feed Lightning real, learnable data."""

    def __init__(self, in_features: int, num_classes: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(in_features, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.flatten(1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.02)


# ----------------------------------------------------------------------------------------------------------------
# registry and metadata


def test_unknown_dataset_lists_valid_choices():
    with pytest.raises(ValueError) as excinfo:
        build_datamodule("cifar11")
    assert str(excinfo.value) == f"unknown dataset 'cifar11'; valid choices: {', '.join(sorted(DATASETS))}"
    assert {"digits", "mnist5k", "cifar10", "cifar100", "imagefolder", "synthetic"} <= set(DATASETS)


@pytest.mark.parametrize(
    ("name", "num_classes", "in_chans", "img_size", "patch"),
    [("digits", 10, 1, 8, 4), ("mnist5k", 10, 1, 28, 4), ("synthetic", 4, 3, 16, 4)],
)
def test_metadata_is_known_before_setup(name, num_classes, in_chans, img_size, patch):
    dm = build_datamodule(name)
    metadata = (dm.name, dm.num_classes, dm.in_chans, dm.img_size, dm.default_patch_size)
    assert metadata == (name, num_classes, in_chans, img_size, patch)
    assert dm.splits is None and dm.train_size is None  # nothing loaded yet
    assert dm.img_size % dm.default_patch_size == 0


# ----------------------------------------------------------------------------------------------------------------
# splits and determinism


@pytest.fixture(scope="module")
def digits():
    dm = build_datamodule("digits", seed=0)
    dm.setup()
    return dm


def test_digits_split_is_sized_and_stratified(digits):
    assert (digits.train_size, digits.val_size, digits.test_size) == (1077, 360, 360) == digits.sizes()
    train, val, test = (set(i.tolist()) for i in (digits.train_indices, digits.val_indices, digits.test_indices))
    assert len(train | val | test) == 1797 and not train & val and not train & test and not val & test
    labels = torch.cat([digits.splits.train_labels, digits.splits.val_labels, digits.splits.test_labels])
    for split in (digits.splits.val_labels, digits.splits.test_labels):
        counts = torch.bincount(split, minlength=10)
        expected = torch.bincount(labels, minlength=10) * 360 / 1797
        assert (counts > 0).all()  # every class is in val and test ...
        assert ((counts - expected).abs() < 1).all()  # ... in proportion to its size


def test_the_test_split_is_the_same_for_every_seed_and_disjoint_from_train_and_val(digits):
    """The protocol's reported split: fixed across seeds (and so across the variants a seed pairs), never seen in
    training or selection; val and train move with the seed."""
    others = [build_datamodule("digits", seed=s) for s in (1, 7)]
    for dm in others:
        dm.setup()
        assert torch.equal(dm.test_indices, digits.test_indices)
        assert torch.equal(dm.splits.test_images, digits.splits.test_images)
        assert not set(dm.test_indices.tolist()) & (set(dm.train_indices.tolist()) | set(dm.val_indices.tolist()))
    assert not torch.equal(others[0].val_indices, digits.val_indices)
    # mnist5k, the studies' dataset: 3,000 / 1,000 / 1,000, the test images fixed
    a, b = build_datamodule("mnist5k", seed=0), build_datamodule("mnist5k", seed=3)
    a.setup()
    b.setup()
    assert (a.train_size, a.val_size, a.test_size) == (3000, 1000, 1000) == b.sizes()
    assert torch.equal(a.test_indices, b.test_indices) and not torch.equal(a.val_indices, b.val_indices)
    assert torch.equal(torch.bincount(a.splits.test_labels), torch.bincount(b.splits.test_labels))
    # the test loader serves every test image once, in stored order, never augmented
    images, labels = concat(a.test_dataloader())
    assert torch.equal(labels, a.splits.test_labels) and torch.equal(images, a.transform(a.splits.test_images))


def test_test_fraction_zero_is_the_two_split_layout_of_older_studies(digits):
    old = build_datamodule("digits", seed=0, test_fraction=0.0)
    old.setup()
    assert (old.train_size, old.val_size, old.test_size) == (1437, 360, 0) and old.test_dataloader() is None
    from sklearn.datasets import load_digits

    train, val = stratified_split(torch.from_numpy(load_digits().target), 0.2, 0)
    assert torch.equal(old.val_indices, val) and torch.equal(old.train_indices, train)
    with pytest.raises(ValueError, match="test_fraction must be in"):
        build_datamodule("digits", val_fraction=0.5, test_fraction=0.5)


def test_same_seed_same_split_and_batches_other_seed_differs(digits):
    again, other = build_datamodule("digits", seed=0), build_datamodule("digits", seed=1)
    again.setup()
    other.setup()
    assert torch.equal(again.val_indices, digits.val_indices)
    assert not torch.equal(other.val_indices, digits.val_indices)
    (x0, y0), (x1, y1), (_, y2) = first_batch(digits), first_batch(again), first_batch(other)
    assert torch.equal(x0, x1) and torch.equal(y0, y1)  # shuffle and augmentation both reproduced
    assert not torch.equal(y0, y2)


def test_each_epoch_reshuffles_and_set_epoch_replays_it(digits):
    loader = digits.train_dataloader()
    epoch0, epoch1 = concat(loader), concat(loader)
    assert not torch.equal(epoch0[1], epoch1[1])
    assert torch.equal(torch.sort(epoch0[1]).values, torch.sort(epoch1[1]).values)  # same images, new order
    loader.sampler.set_epoch(0)  # what Lightning calls at the start of each epoch
    replay = concat(loader)
    assert torch.equal(replay[0], epoch0[0]) and torch.equal(replay[1], epoch0[1])


# ----------------------------------------------------------------------------------------------------------------
# normalisation and augmentation


def test_normalisation_uses_train_statistics_only(digits):
    from sklearn.datasets import load_digits

    pixels = torch.from_numpy(load_digits().images) / 16
    assert digits.mean[0] == pytest.approx(pixels[digits.train_indices].mean().item(), abs=1e-9)
    assert digits.std[0] == pytest.approx(pixels[digits.train_indices].std(unbiased=False).item(), abs=1e-9)
    assert digits.mean[0] != pytest.approx(pixels.mean().item(), abs=1e-6)  # the val images are not in it

    plain = build_datamodule("digits", augment=False)
    images, _ = concat(plain.train_dataloader())
    assert len(images) == 1077
    assert images.mean().item() == pytest.approx(0, abs=1e-5)
    assert images.std(unbiased=False).item() == pytest.approx(1, abs=1e-5)


@pytest.mark.parametrize(("name", "pad"), [("digits", 1), ("mnist5k", 2)])
def test_shift_augmentation_moves_images_but_keeps_labels(name, pad):
    augmented, plain = build_datamodule(name, augment=True), build_datamodule(name, augment=False)
    (xa, ya), (xp, yp) = first_batch(augmented), first_batch(plain)
    assert torch.equal(ya, yp) and xa.shape == xp.shape
    xa, xp = unnormalise(augmented, xa[:48]), unnormalise(plain, xp[:48])
    offsets = [matching_offsets(p, a, pad, flips=False) for p, a in zip(xp, xa, strict=True)]
    assert all(offsets)  # every image is a shifted copy, within +-pad, zero-filled
    assert sum(not torch.allclose(p, a) for p, a in zip(xp, xa, strict=True)) > len(xa) // 2
    unique_offsets = [found[0] for found in offsets if len(found) == 1]
    assert max(max(abs(dy), abs(dx)) for dy, dx, _ in unique_offsets) == pad  # the full range is used


def test_random_crop_with_zero_padding_covers_exactly_the_range():
    image = torch.zeros(400, 1, 9, 9)
    image[:, 0, 4, 4] = 1
    moved = random_crop(image, 2, torch.Generator().manual_seed(0))
    position = (moved[:, 0] == 1).flatten(1).nonzero()[:, 1]  # where the bright pixel went, per image
    shifts = set(zip((position // 9 - 4).tolist(), (position % 9 - 4).tolist(), strict=True))
    assert shifts == {(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)}
    assert moved.sum().item() == 400  # nothing lost or duplicated


def test_val_is_never_augmented_and_fixed_batch_is_deterministic(digits):
    plain = build_datamodule("digits", augment=False)
    first, second = concat(digits.val_dataloader()), concat(digits.val_dataloader())
    reference = concat(plain.val_dataloader())
    assert torch.equal(first[0], second[0]) and torch.equal(first[0], reference[0])
    assert torch.equal(first[1], digits.splits.val_labels)  # stored order, every image, in one pass

    images, labels = digits.fixed_batch(64)
    assert images.shape == (64, 1, 8, 8)
    assert torch.equal(images, digits.fixed_batch(64)[0]) and torch.equal(images, plain.fixed_batch(64)[0])
    assert torch.equal(images, first[0][:64]) and torch.equal(labels, first[1][:64])


def test_train_loader_drops_only_a_single_image_last_batch():
    images, labels = torch.zeros(259, 1, 2, 2, dtype=torch.uint8), torch.zeros(259, dtype=torch.long)
    transform = data.loader.BatchTransform(255.0, (0.0,), (1.0,))

    def sizes(n: int, train: bool) -> list[int]:
        loader = TensorBatchLoader(images[:n], labels[:n], transform, 128, seed=0, train=train)
        batch_sizes = [len(y) for _, y in loader]
        assert len(loader) == len(batch_sizes)
        return batch_sizes

    assert sizes(257, train=True) == [128, 128]  # a last batch of 1 is dropped
    assert sizes(258, train=True) == [128, 128, 2]  # a last batch of 2 is kept
    assert sizes(257, train=False) == [128, 128, 1]  # val keeps everything


def test_loader_shards_itself_under_torch_distributed(monkeypatch):
    dm = build_datamodule("synthetic", num_samples=205, num_classes=5, augment=False)
    dm.setup()  # 123 train / 41 val / 41 test
    shards = {}
    for rank in (0, 1):
        monkeypatch.setattr(data.loader, "rank_and_world_size", lambda rank=rank: (rank, 2))
        train, val = dm.train_dataloader(), dm.val_dataloader()
        shards[rank] = (concat(train)[0].flatten(1), concat(val)[0].flatten(1), len(train))

    def rows(x: torch.Tensor) -> set:
        return {tuple(r.tolist()) for r in x}

    (train0, val0, len0), (train1, val1, len1) = shards[0], shards[1]
    assert len(train0) == len(train1) == 61 and len0 == len1
    assert not rows(train0) & rows(train1)
    assert len(val0) + len(val1) == 41 and not rows(val0) & rows(val1)


# ----------------------------------------------------------------------------------------------------------------
# synthetic


def test_synthetic_options_and_seed():
    dm = build_datamodule("synthetic", num_samples=200, img_size=8, in_chans=1, num_classes=5, seed=3)
    assert (dm.num_classes, dm.in_chans, dm.img_size) == (5, 1, 8)
    dm.setup()
    assert (dm.train_size, dm.val_size, dm.test_size) == (120, 40, 40)
    assert torch.equal(torch.bincount(dm.splits.val_labels), torch.full((5,), 8))
    assert torch.equal(torch.bincount(dm.splits.test_labels), torch.full((5,), 8))
    x, _ = first_batch(dm)
    assert x.shape == (120, 1, 8, 8)  # the whole train split in one batch of up to 128
    options = dict(num_samples=200, img_size=8, in_chans=1, num_classes=5)
    same, other = (build_datamodule("synthetic", seed=seed, **options) for seed in (3, 4))
    assert torch.equal(same.fixed_batch()[0], dm.fixed_batch()[0])
    assert not torch.equal(other.fixed_batch()[0], dm.fixed_batch()[0])


# ----------------------------------------------------------------------------------------------------------------
# folder datasets: CIFAR, MNIST, ImageFolder


@pytest.mark.parametrize("num_classes", [10, 100])
def test_cifar_folder_is_parsed_by_torchvision(tmp_path, num_classes):
    written = write_cifar(tmp_path, num_classes)
    dm = build_datamodule(f"cifar{num_classes}", data_dir=str(tmp_path), batch_size=8)
    assert (dm.num_classes, dm.in_chans, dm.img_size, dm.default_patch_size) == (num_classes, 3, 32, 4)
    dm.setup()
    assert (dm.train_size, dm.val_size, dm.test_size) == (16, 4, 10)  # sizes() knows the official 50,000 / 10,000
    assert torch.equal(dm.splits.test_images, written["test"][0])  # test = the official test split
    assert dm.splits.test_labels.tolist() == written["test"][1]
    train, val = dm.train_indices, dm.val_indices  # val = a seeded share of the official train split
    assert sorted(train.tolist() + val.tolist()) == list(range(20))
    assert torch.equal(dm.splits.train_images, written["train"][0][train])
    assert torch.equal(dm.splits.val_images, written["train"][0][val])
    expected_mean = (written["train"][0][train].double() / 255).mean(dim=(0, 2, 3))
    assert dm.mean == pytest.approx(expected_mean.tolist(), abs=1e-9)  # train split only

    x, y = first_batch(dm)
    assert x.shape == (8, 3, 32, 32) and y.dtype == torch.int64
    plain_dm = build_datamodule(f"cifar{num_classes}", data_dir=str(tmp_path), batch_size=8, augment=False)
    xa, xp = unnormalise(dm, x), unnormalise(plain_dm, first_batch(plain_dm)[0])
    found = [matching_offsets(p, a, pad=4, flips=True) for p, a in zip(xp, xa, strict=True)]
    assert all(len(f) == 1 for f in found)  # a 4-px-padded random crop, maybe mirrored
    assert {f[0][2] for f in found} == {False, True}  # both flip states among the 8 images


def test_cifar_errors_are_one_line_and_name_the_folder(tmp_path):
    with pytest.raises(DataError) as excinfo:
        build_datamodule("cifar10", data_dir=str(tmp_path / "nowhere"))
    assert_one_line_error(excinfo, str(tmp_path / "nowhere"), "does not exist", "cifar-10-batches-py/")

    with pytest.raises(DataError) as excinfo:
        build_datamodule("cifar100")
    assert_one_line_error(excinfo, "no data folder given for cifar100", "cifar-100-python/{train,test,meta}")

    written = write_cifar(tmp_path, 10)
    (written["folder"] / "data_batch_3").unlink()
    with pytest.raises(DataError) as excinfo:
        build_datamodule("cifar10", data_dir=str(tmp_path))
    assert_one_line_error(excinfo, f"'{tmp_path}'", "missing cifar-10-batches-py/data_batch_3;", "CIFAR-10 python")

    (written["folder"] / "data_batch_3").write_bytes(b"not a pickle")
    dm = build_datamodule("cifar10", data_dir=str(tmp_path))  # files exist: parsed at setup
    with pytest.raises(DataError) as excinfo:
        dm.setup()
    assert_one_line_error(excinfo, f"'{tmp_path}'", "could not be read", "cifar-10-batches-py/")


def idx_file_bytes(array: np.ndarray) -> bytes:
    """An idx (ubyte) file's bytes, the format of MNIST's raw files: 0, 0, type 0x08, ndim, big-endian sizes."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx(path: Path, array: np.ndarray) -> None:
    """An uncompressed idx (ubyte) file, the format of MNIST's raw files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(idx_file_bytes(array))


def mnist_family_arrays(n_train: int = 20, n_test: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """The four files of a tiny MNIST-family dataset (file name -> array): random pixels, labels cycling 0..9."""
    rng = np.random.default_rng(seed)
    return {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
            "train-labels-idx1-ubyte": np.arange(n_train) % 10,
            "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
            "t10k-labels-idx1-ubyte": np.arange(n_test) % 10}


def declare_files(monkeypatch, name: str, arrays: dict[str, np.ndarray]) -> None:
    """Make the DataModule of ``name`` (mnist, fashion_mnist) expect these tiny files: their counts and the md5 of
    their bytes, where it expects the published files' (60,000 / 10,000 and the published md5s)."""
    import hashlib

    cls = DATASETS[name]
    monkeypatch.setattr(cls, "official_sizes", (len(arrays["train-images-idx3-ubyte"]),
                                                len(arrays["t10k-images-idx3-ubyte"])))
    monkeypatch.setattr(cls, "content_md5", {n: hashlib.md5(idx_file_bytes(a)).hexdigest() for n, a in arrays.items()})


def test_full_mnist_folder(tmp_path, monkeypatch):
    raw, arrays = tmp_path / "MNIST" / "raw", mnist_family_arrays()
    for file_name, array in arrays.items():
        write_idx(raw / file_name, array)
    declare_files(monkeypatch, "mnist", arrays)
    dm = build_datamodule("mnist", data_dir=str(tmp_path), batch_size=8)
    dm.setup()
    assert (dm.train_size, dm.val_size, dm.test_size, dm.img_size) == (16, 4, 10, 28)
    assert torch.equal(dm.splits.test_images[:, 0], torch.from_numpy(arrays["t10k-images-idx3-ubyte"].astype(np.uint8)))
    old = build_datamodule("mnist", data_dir=str(tmp_path), test_fraction=0.0)  # the two-split layout
    old.setup()
    assert (old.train_size, old.val_size, old.test_size) == (20, 10, 0)
    assert torch.equal(old.splits.val_images, dm.splits.test_images)
    assert first_batch(dm)[0].shape == (8, 1, 28, 28)

    (raw / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError) as excinfo:
        build_datamodule("mnist", data_dir=str(tmp_path))
    assert_one_line_error(excinfo, f"'{raw}'", "is missing t10k-labels-idx1-ubyte (raw or .gz) beside",
                          "torchvision's MNIST layout")


def test_imagefolder_without_val_folder_splits_train(tmp_path):
    write_png_tree(tmp_path / "train", ["ant", "bee", "cat"], per_class=5)
    dm = build_datamodule("imagefolder", data_dir=str(tmp_path), batch_size=4, img_size=16)
    assert (dm.num_classes, dm.in_chans, dm.img_size, dm.default_patch_size) == (3, 3, 16, 4)  # 4x4 patches
    dm.setup()
    assert (dm.train_size, dm.val_size, dm.test_size) == (9, 3, 3)
    assert sorted(dm.val_set.folder.targets[i] for i in dm.val_set.indices) == [0, 1, 2]  # stratified
    assert sorted(dm.test_set.folder.targets[i] for i in dm.test_set.indices) == [0, 1, 2]
    assert not set(dm.test_set.indices) & (set(dm.val_set.indices) | set(dm.train_set.indices))
    assert len(dm.mean) == len(dm.std) == 3 and all(0 < s < 1 for s in dm.std)

    x, y = first_batch(dm)
    assert x.shape == (4, 3, 16, 16) and set(y.tolist()) <= {0, 1, 2}
    twin = build_datamodule("imagefolder", data_dir=str(tmp_path), batch_size=4, img_size=16)
    x_twin, y_twin = first_batch(twin)
    assert torch.equal(x, x_twin) and torch.equal(y, y_twin)  # seeded shuffle and seeded timm augmentation
    plain = build_datamodule("imagefolder", data_dir=str(tmp_path), batch_size=4, img_size=16, augment=False)
    assert torch.equal(first_batch(plain)[1], y) and not torch.allclose(first_batch(plain)[0], x)

    images, labels = dm.fixed_batch(64)
    assert images.shape == (3, 3, 16, 16) and torch.equal(images, twin.fixed_batch(64)[0])
    assert torch.equal(images, next(iter(dm.val_dataloader()))[0])


def test_imagefolder_with_val_folder(tmp_path):
    write_png_tree(tmp_path / "train", ["ant", "bee"], per_class=4)
    write_png_tree(tmp_path / "val", ["ant", "bee"], per_class=3, seed=1)
    dm = build_datamodule("imagefolder", data_dir=str(tmp_path), img_size=8, patch_size=2)
    assert (dm.num_classes, dm.default_patch_size) == (2, 2)
    dm.setup()
    assert (dm.train_size, dm.val_size, dm.test_size) == (6, 2, 6)  # val/ is held out as the test split
    assert sorted(next(iter(dm.test_dataloader()))[1].tolist()) == [0, 0, 0, 1, 1, 1]
    assert sorted(next(iter(dm.val_dataloader()))[1].tolist()) == [0, 1]  # a seeded share of train/
    write_png_tree(tmp_path / "test", ["ant", "bee"], per_class=2, seed=2)  # all three folders: used as they are
    three = build_datamodule("imagefolder", data_dir=str(tmp_path), img_size=8, patch_size=2)
    three.setup()
    assert (three.train_size, three.val_size, three.test_size) == (8, 6, 4)


def test_imagefolder_errors_are_one_line_and_name_the_folder(tmp_path):
    def error_for(root: Path, *fragments: str) -> None:
        with pytest.raises(DataError) as excinfo:
            build_datamodule("imagefolder", data_dir=str(root))
        assert_one_line_error(excinfo, f"'{root}'", "train/<class>/<images>", *fragments)

    error_for(tmp_path / "nowhere", "does not exist")
    (tmp_path / "no_train").mkdir()
    error_for(tmp_path / "no_train", "has no train/ folder")
    (tmp_path / "no_classes" / "train").mkdir(parents=True)
    error_for(tmp_path / "no_classes", "has no class folders in train/")
    write_png_tree(tmp_path / "empty" / "train", ["ant"], per_class=2)
    (tmp_path / "empty" / "train" / "bee").mkdir()
    (tmp_path / "empty" / "train" / "bee" / "notes.txt").write_text("not an image")
    error_for(tmp_path / "empty", "has no images in train/bee/")
    write_png_tree(tmp_path / "mismatch" / "train", ["ant", "bee"], per_class=2)
    write_png_tree(tmp_path / "mismatch" / "val", ["ant"], per_class=2)
    error_for(tmp_path / "mismatch", "val/ class folders that differ")


# ----------------------------------------------------------------------------------------------------------------
# Lightning


@pytest.mark.parametrize(("name", "kwargs", "min_accuracy"), [("synthetic", {}, 0.6), ("digits", {}, 0.5)])
def test_lightning_fits_above_chance(name, kwargs, min_accuracy):
    torch.manual_seed(0)
    dm = build_datamodule(name, **kwargs)
    model = LinearClassifier(dm.in_chans * dm.img_size**2, dm.num_classes)
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=dm)
    assert trainer.global_step == len(dm.train_dataloader())

    with torch.no_grad():
        predictions, labels = zip(*((model(x).argmax(1), y) for x, y in dm.val_dataloader()), strict=True)
    accuracy = (torch.cat(predictions) == torch.cat(labels)).float().mean().item()
    chance = 1 / dm.num_classes
    assert accuracy > max(min_accuracy, 2 * chance)
    assert trainer.callback_metrics["val_acc"].item() == pytest.approx(accuracy, abs=0.02)
