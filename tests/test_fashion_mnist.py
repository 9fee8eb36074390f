"""Fashion-MNIST (and full MNIST) from their idx files: where the files are found (``--data-dir`` in torchvision's
layout or flat, then Debian's package folder), raw or gzip read directly, the checks on headers, counts and
checksums, the one-line errors, and a run with no ``--data-dir``.

One test reads the real files of Debian's ``dataset-fashion-mnist`` package (skipped without it, a failure under
``CI=true``); the others write tiny files in the same format, and point the DataModule's expected counts and md5s
at them (``declare_files``) and its system folder at a temporary one.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from prerequisites import missing
from test_data import assert_one_line_error, declare_files, idx_file_bytes, mnist_family_arrays

from data import DATASETS, DataError, build_datamodule
from data.mnist import IDX_FILES, parse_idx

FASHION = DATASETS["fashion_mnist"]
DEBIAN_FOLDER = Path("/usr/share/datasets/fashion-mnist")


def write_files(folder: Path, arrays: dict[str, np.ndarray], *, gz: bool, level: int = 9) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        body = idx_file_bytes(array)
        if gz:
            (folder / f"{name}.gz").write_bytes(gzip.compress(body, compresslevel=level, mtime=0))
        else:
            (folder / name).write_bytes(body)


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    """Tiny Fashion-MNIST files (30 train / 10 test) the DataModule expects; its system folder is
    ``tmp_path/system`` (empty until a test writes there)."""
    arrays = mnist_family_arrays(30, 10, seed=4)
    declare_files(monkeypatch, "fashion_mnist", arrays)
    system = tmp_path / "system"
    monkeypatch.setattr(FASHION, "system_dirs", (str(system),))
    return {"arrays": arrays, "system": system}


def loaded(dm) -> dict[str, torch.Tensor]:
    dm.setup()
    s = dm.splits
    return {"train": torch.cat([s.train_images, s.val_images]), "test": s.test_images,
            "test_labels": s.test_labels}


# --- the idx format --------------------------------------------------------------------------------------------------
def test_parse_idx_reads_the_header_and_refuses_what_does_not_fit():
    data = bytes([0, 0, 8, 2, 0, 0, 0, 2, 0, 0, 0, 3, 1, 2, 3, 4, 5, 250])  # a 2x3 array of unsigned bytes
    assert parse_idx(data).tolist() == [[1, 2, 3], [4, 5, 250]]
    assert parse_idx(bytes([0, 0, 8, 1, 0, 0, 0, 2, 7, 9])).tolist() == [7, 9]
    with pytest.raises(ValueError, match=r"17 bytes where the header \(2, 3\) needs 18"):
        parse_idx(data[:-1])
    with pytest.raises(ValueError, match=r"19 bytes where the header \(2, 3\) needs 18"):
        parse_idx(data + b"\0")
    with pytest.raises(ValueError, match="not an idx file of unsigned bytes"):
        parse_idx(bytes([0, 0, 0x0D, 1, 0, 0, 0, 1, 0, 0, 0, 0]))  # 0x0D: floats
    with pytest.raises(ValueError, match="not an idx file"):
        parse_idx(b"\x1f\x8b\x08\x00")  # a gzip file read as raw


# --- where the files are found ---------------------------------------------------------------------------------------
def test_data_dir_in_torchvision_layout_gzip_read_directly(tiny, tmp_path):
    write_files(tmp_path / "d" / "FashionMNIST" / "raw", tiny["arrays"], gz=True)
    dm = build_datamodule("fashion_mnist", data_dir=str(tmp_path / "d"), batch_size=8)
    assert dm.folder == tmp_path / "d" / "FashionMNIST" / "raw"
    assert all(p.name.endswith(".gz") for p in dm.paths.values())
    got = loaded(dm)
    assert (dm.train_size, dm.val_size, dm.test_size) == (24, 6, 10)
    assert torch.equal(got["test"][:, 0], torch.from_numpy(tiny["arrays"]["t10k-images-idx3-ubyte"].astype(np.uint8)))
    assert got["test_labels"].tolist() == [i % 10 for i in range(10)]
    train = tiny["arrays"]["train-images-idx3-ubyte"].astype(np.uint8)
    assert sorted(map(bytes, got["train"][:, 0].numpy())) == sorted(map(bytes, train))  # train + val = all 30
    assert not any(p.name.endswith("-ubyte") for p in (tmp_path / "d").rglob("*"))  # nothing was unpacked


def test_flat_raw_folder_and_raw_preferred_over_gzip(tiny, tmp_path):
    write_files(tmp_path / "flat", tiny["arrays"], gz=False)
    dm = build_datamodule("fashion_mnist", data_dir=str(tmp_path / "flat"))
    assert dm.folder == tmp_path / "flat"
    write_files(tmp_path / "flat", tiny["arrays"], gz=True)  # both, as torchvision's download leaves them
    dm = build_datamodule("fashion_mnist", data_dir=str(tmp_path / "flat"))
    assert sorted(p.name for p in dm.paths.values()) == sorted(IDX_FILES)
    assert loaded(dm)["test"].shape == (10, 1, 28, 28)


def test_without_data_dir_the_system_folder_and_data_dir_first(tiny, tmp_path, monkeypatch):
    other = mnist_family_arrays(30, 10, seed=5)  # other pixels than the fixture's
    declare_files(monkeypatch, "fashion_mnist", other)
    write_files(tiny["system"], other, gz=True)
    dm = build_datamodule("fashion_mnist")
    assert dm.folder == tiny["system"]
    assert torch.equal(loaded(dm)["test"][:, 0], torch.from_numpy(other["t10k-images-idx3-ubyte"].astype(np.uint8)))

    mine = tmp_path / "mine"
    write_files(mine, other, gz=False)
    assert build_datamodule("fashion_mnist", data_dir=str(mine)).folder == mine  # --data-dir comes first
    empty = tmp_path / "empty"
    empty.mkdir()
    assert build_datamodule("fashion_mnist", data_dir=str(empty)).folder == tiny["system"]


def test_missing_files_are_one_line_naming_all_three_ways(tiny, tmp_path):
    (tmp_path / "empty").mkdir()
    for data_dir in (None, str(tmp_path / "empty")):
        with pytest.raises(DataError) as excinfo:
            build_datamodule("fashion_mnist", data_dir=data_dir)
        assert_one_line_error(excinfo, "no fashion_mnist files in", str(tiny["system"]), "--data-dir DIR holding",
                              "`apt-get install dataset-fashion-mnist`", "--download with --data-dir DIR")
    assert f"{tmp_path / 'empty' / 'FashionMNIST' / 'raw'}, {tmp_path / 'empty'}, {tiny['system']}" in str(
        excinfo.value)

    with pytest.raises(DataError) as excinfo:
        build_datamodule("fashion_mnist", data_dir=str(tmp_path / "typo"))
    assert_one_line_error(excinfo, f"'{tmp_path / 'typo'}'", "does not exist")

    partial = tmp_path / "partial"
    write_files(partial, tiny["arrays"], gz=True)
    (partial / "t10k-images-idx3-ubyte.gz").unlink()
    write_files(tiny["system"], tiny["arrays"], gz=True)  # a complete copy after it is not used instead
    with pytest.raises(DataError) as excinfo:
        build_datamodule("fashion_mnist", data_dir=str(partial))
    assert_one_line_error(excinfo, f"'{partial}'", "is missing t10k-images-idx3-ubyte (raw or .gz)")


def test_mnist_has_no_system_folder(tmp_path):
    with pytest.raises(DataError) as excinfo:
        build_datamodule("mnist")
    assert_one_line_error(excinfo, "no data folder given for mnist", "--data-dir")
    (tmp_path / "d").mkdir()
    with pytest.raises(DataError) as excinfo:
        build_datamodule("mnist", data_dir=str(tmp_path / "d"))
    assert_one_line_error(excinfo, "no mnist files in", "--download with --data-dir DIR")
    assert "apt-get" not in str(excinfo.value)


# --- checks on the contents ------------------------------------------------------------------------------------------
def test_a_copy_gzipped_again_passes_the_checksum(tiny, tmp_path):
    """A packager's gzip of the same bytes (another level, another header) is a different .gz file, the same data."""
    write_files(tmp_path / "a", tiny["arrays"], gz=True, level=9)
    write_files(tmp_path / "b", tiny["arrays"], gz=True, level=1)
    gz = "train-images-idx3-ubyte.gz"
    assert (tmp_path / "a" / gz).read_bytes() != (tmp_path / "b" / gz).read_bytes()
    a, b = (loaded(build_datamodule("fashion_mnist", data_dir=str(tmp_path / x))) for x in "ab")
    assert torch.equal(a["train"], b["train"]) and torch.equal(a["test"], b["test"])


@pytest.mark.parametrize(("damage", "message"), [
    ("pixel", "train-images-idx3-ubyte.gz's uncompressed bytes have md5"),
    ("truncated_gzip", "train-images-idx3-ubyte.gz is not a complete gzip file"),
    ("truncated_raw", "bytes where the header (30, 28, 28) needs 23,536 (truncated or padded)"),
    ("count", "train-images-idx3-ubyte.gz holds 29 items, the dataset has 30"),
])
def test_damaged_files_are_refused_in_one_line(tiny, tmp_path, damage, message):
    folder = tmp_path / "d"
    write_files(folder, tiny["arrays"], gz=True)
    images = tiny["arrays"]["train-images-idx3-ubyte"].copy()
    path = folder / "train-images-idx3-ubyte.gz"
    if damage == "pixel":
        images[3, 10, 10] ^= 1  # one pixel: the same header and size, another md5
        path.write_bytes(gzip.compress(idx_file_bytes(images)))
    elif damage == "truncated_gzip":
        path.write_bytes(path.read_bytes()[:-100])
    elif damage == "truncated_raw":
        path.unlink()
        (folder / "train-images-idx3-ubyte").write_bytes(idx_file_bytes(images)[:-10])
    else:
        path.write_bytes(gzip.compress(idx_file_bytes(images[:29])))
    dm = build_datamodule("fashion_mnist", data_dir=str(folder))  # the files exist: read and checked at setup
    with pytest.raises(DataError) as excinfo:
        dm.setup()
    assert_one_line_error(excinfo, f"'{folder}'", "could not be read", message)


# --- runs with no --data-dir -----------------------------------------------------------------------------------------
def test_train_finds_the_system_folder_without_data_dir(tiny, tmp_path, capsys):
    from ablations.train import main as train_main

    write_files(tiny["system"], tiny["arrays"], gz=True)
    code = train_main(["--dataset", "fashion_mnist", "--max-epochs", "1", "--depth", "1", "--embed-dim", "8",
                       "--num-heads", "2", "--patch-size", "7", "--batch-size", "8", "--precision", "32-true",
                       "--threads", "1", "--no-progress-bar", "--log-dir", str(tmp_path / "runs"), "--json"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["epochs_completed"] == 1 and len(summary["test_acc_curve"]) == 1
    assert 0.0 <= summary["test_acc"] <= 1.0


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_study_on_fashion_mnist_runs_without_data_dir(tiny, tmp_path):
    from helpers import trials_of, write_study

    from ablations.run import main as run_main

    write_files(tiny["system"], tiny["arrays"], gz=True)
    study = write_study(tmp_path / "on_fashion.yaml", base={"dataset": "fashion_mnist", "dataset_options": {},
                                                           "patch_size": 7})
    code = run_main(["--study", str(study), "--storage", f"sqlite:///{tmp_path / 's.db'}", "--results-dir",
                     str(tmp_path / "results"), "--no-progress", "--workers", "1"])  # in this process: the fixture's
    # tiny files and system folder are what the DataModule expects and searches
    assert code == 0
    trials = trials_of(tmp_path / "s.db", "on_fashion")
    assert len(trials) == 2 and all(t.state.name == "COMPLETE" for t in trials)


# --- the real files of Debian's package ------------------------------------------------------------------------------
def test_the_debian_package_files_are_the_published_fashion_mnist():
    if not all((DEBIAN_FOLDER / f"{name}.gz").is_file() for name in IDX_FILES):
        missing(f"Fashion-MNIST's files are not in {DEBIAN_FOLDER}", "apt-get install dataset-fashion-mnist")
    headers = {}
    for name in IDX_FILES:
        with gzip.open(DEBIAN_FOLDER / f"{name}.gz") as f:
            magic, count = struct.unpack(">II", f.read(8))
            headers[name] = (magic, count, *(struct.unpack(">II", f.read(8)) if magic == 2051 else ()))
    assert headers == {"train-images-idx3-ubyte": (2051, 60000, 28, 28), "train-labels-idx1-ubyte": (2049, 60000),
                       "t10k-images-idx3-ubyte": (2051, 10000, 28, 28), "t10k-labels-idx1-ubyte": (2049, 10000)}
    # md5 of the uncompressed test labels: the published file's (its .gz, md5 bb300cfd..., decompresses to these)
    test_labels = gzip.decompress((DEBIAN_FOLDER / "t10k-labels-idx1-ubyte.gz").read_bytes())
    assert hashlib.md5(test_labels).hexdigest() == "15d484375f8d13e6eb1aabb0c3f46965"

    dm = build_datamodule("fashion_mnist")  # no data_dir: found in the package's folder, every md5 checked
    assert dm.folder == DEBIAN_FOLDER
    dm.setup()
    assert (dm.train_size, dm.val_size, dm.test_size) == (48000, 12000, 10000)
    s = dm.splits
    assert torch.bincount(torch.cat([s.train_labels, s.val_labels])).tolist() == [6000] * 10  # balanced classes
    assert torch.bincount(s.val_labels).tolist() == [1200] * 10  # stratified 20 %
    assert torch.bincount(s.test_labels).tolist() == [1000] * 10
    # the often-quoted pixel statistics of the 60,000 training images (mean 0.2860, std 0.3530), here of the 48,000
    assert dm.mean[0] == pytest.approx(0.2860, abs=2e-3) and dm.std[0] == pytest.approx(0.3530, abs=2e-3)
