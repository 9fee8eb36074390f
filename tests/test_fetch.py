"""``--download`` / ``python -m data.fetch``: torchvision's own downloaders against a throwaway HTTP server on
127.0.0.1 that serves tiny archives in the exact upstream formats (CIFAR's tar.gz of pickles, MNIST's and
Fashion-MNIST's gzipped idx files, SVHN's .mat files). The torchvision classes' URLs and md5 sums are pointed at the
server and at the tiny files' real md5 sums, so that the checksum path runs as it does upstream: a good archive
passes and loads, a damaged one is refused in one line with the data folder left clean, and a port nobody listens on
is "offline" in one line, exit 2."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import io
import pickle
import socket
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torchvision.datasets as tvd
from test_data import declare_files, idx_file_bytes, mnist_family_arrays, write_cifar, write_idx

from data import DATASETS, build_datamodule
from data.fetch import FETCHABLE, fetch, hosts, main, plan

SERVER_LIFETIME_S = 600  # the longest a test's server may live (a hung test cannot leave it serving)


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


@pytest.fixture
def server(tmp_path):
    """An HTTP server on 127.0.0.1 serving ``files`` (name -> bytes; a test fills it), in a daemon thread, stopped
    after the test or after :data:`SERVER_LIFETIME_S`, whichever comes first. Each request is logged in ``served`` (torchvision requests a URL twice: once to follow
    redirects, once to download)."""
    files: dict[str, bytes] = {}
    served: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            name = self.path.rsplit("/", 1)[-1]
            served.append(name)
            body = files.get(name)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.timeout = 5
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    deadline = threading.Timer(SERVER_LIFETIME_S, httpd.shutdown)  # bounded: it stops by itself, whatever happens
    deadline.daemon = True
    deadline.start()
    try:
        yield {"url": f"http://127.0.0.1:{httpd.server_address[1]}/", "files": files, "served": served}
    finally:
        deadline.cancel()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def closed_port_url() -> str:
    """A URL on 127.0.0.1 whose port nobody listens on (connection refused), as an offline machine sees a host."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/"


# --- tiny archives in the upstream formats, and the torchvision classes pointed at them -----------------------------
def cifar10_archive(tmp_path: Path) -> tuple[bytes, dict[str, str]]:
    """cifar-10-python.tar.gz as upstream packs it (a cifar-10-batches-py folder of pickles), and the extracted
    files' md5 sums (torchvision checks those too)."""
    build = tmp_path / "build-cifar"
    written = write_cifar(build, 10, n_train=20, n_test=10)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(written["folder"], arcname="cifar-10-batches-py")
    return out.getvalue(), {p.name: md5(p.read_bytes()) for p in written["folder"].iterdir()}


def serve_cifar10(monkeypatch, server, tmp_path, archive: bytes | None = None) -> bytes:
    good, sums = cifar10_archive(tmp_path)
    server["files"]["cifar-10-python.tar.gz"] = good if archive is None else archive
    monkeypatch.setattr(tvd.CIFAR10, "url", server["url"] + "cifar-10-python.tar.gz")
    monkeypatch.setattr(tvd.CIFAR10, "tgz_md5", md5(good))
    monkeypatch.setattr(tvd.CIFAR10, "train_list", [[n, sums[n]] for n, _ in tvd.CIFAR10.train_list])
    monkeypatch.setattr(tvd.CIFAR10, "test_list", [[n, sums[n]] for n, _ in tvd.CIFAR10.test_list])
    monkeypatch.setattr(tvd.CIFAR10, "meta", {**tvd.CIFAR10.meta, "md5": sums["batches.meta"]})
    return good


def idx_gz(array: np.ndarray, tmp_path: Path, name: str) -> bytes:
    path = tmp_path / "build-idx" / name
    write_idx(path, array)
    return gzip.compress(path.read_bytes(), mtime=0)


def serve_mnist_family(monkeypatch, server, tmp_path, cls, n_train: int = 30, n_test: int = 10) -> None:
    """Serve tiny gzipped idx files as torchvision's ``cls`` downloads them; the dataset's DataModule expects
    those files (their counts and md5s) and searches no system folder (this machine's Fashion-MNIST package stays
    out of the test)."""
    arrays = mnist_family_arrays(n_train, n_test, seed=1)
    name = {"MNIST": "mnist", "FashionMNIST": "fashion_mnist"}[cls.__name__]
    declare_files(monkeypatch, name, arrays)
    monkeypatch.setattr(DATASETS[name], "system_dirs", ())
    resources = []
    for name, array in arrays.items():
        body = idx_gz(array, tmp_path, f"{cls.__name__}-{name}")
        server["files"][f"{name}.gz"] = body
        resources.append((f"{name}.gz", md5(body)))
    monkeypatch.setattr(cls, "mirrors", [server["url"]])
    monkeypatch.setattr(cls, "resources", resources)


def svhn_mat(n: int, seed: int) -> bytes:
    """A .mat file as SVHN's: X (32, 32, 3, N) uint8, y (N, 1) with the digit 0 labelled 10."""
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    y = (np.arange(n) % 10 + 1).reshape(n, 1).astype(np.uint8)  # 1..10
    scipy.io.savemat(out, {"X": rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8), "y": y})
    return out.getvalue()


def serve_svhn(monkeypatch, server) -> None:
    split_list = {}
    for split, n, seed in (("train", 30, 2), ("test", 10, 3)):
        body, name = svhn_mat(n, seed), f"{split}_32x32.mat"
        server["files"][name] = body
        split_list[split] = [server["url"] + name, name, md5(body)]
    monkeypatch.setattr(tvd.SVHN, "split_list", {**tvd.SVHN.split_list, **split_list})


def error_line(err: str) -> str:
    """The CLI's one ``error:`` line (the last line of stderr; torchvision's progress bar may come before it)."""
    assert "Traceback" not in err and err.count("error:") == 1 and err.endswith("\n")
    line = err.rstrip("\n").split("\n")[-1]
    assert line.startswith("error: ")
    return line


def leftovers(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


# --- a good archive: downloaded, verified, in place, loaded ---------------------------------------------------------
def test_cifar10_downloads_verifies_and_loads(monkeypatch, server, tmp_path, capsys):
    serve_cifar10(monkeypatch, server, tmp_path)
    target = tmp_path / "data"
    assert main(["cifar10", "--data-dir", str(target)]) == 0
    requests = len(server["served"])
    assert requests >= 1
    assert sorted(p.name for p in target.iterdir()) == ["cifar-10-batches-py"]  # no archive, no staging folder left
    dm = build_datamodule("cifar10", data_dir=str(target))
    dm.setup()
    assert (dm.train_size, dm.val_size, dm.test_size) == (16, 4, 10)

    # already complete: nothing is downloaded again
    assert main(["cifar10", "--data-dir", str(target)]) == 0
    assert len(server["served"]) == requests
    assert "nothing to download" in capsys.readouterr().out


@pytest.mark.parametrize(("name", "cls", "folder"), [("mnist", tvd.MNIST, "MNIST"),
                                                     ("fashion_mnist", tvd.FashionMNIST, "FashionMNIST")])
def test_mnist_family_downloads_verifies_and_loads(monkeypatch, server, tmp_path, name, cls, folder):
    serve_mnist_family(monkeypatch, server, tmp_path, cls)
    target = tmp_path / "data"
    assert fetch(name, target, log=lambda _: None) is True
    assert sorted(p.name for p in target.iterdir()) == [folder]
    dm = build_datamodule(name, data_dir=str(target))
    dm.setup()
    assert (dm.num_classes, dm.in_chans, dm.img_size) == (10, 1, 28)
    assert (dm.train_size, dm.val_size, dm.test_size) == (24, 6, 10)


def test_svhn_downloads_verifies_and_loads_with_labels_10_as_0(monkeypatch, server, tmp_path):
    serve_svhn(monkeypatch, server)
    target = tmp_path / "svhn"
    assert fetch("svhn", target, log=lambda _: None) is True
    assert sorted(p.name for p in target.iterdir()) == ["test_32x32.mat", "train_32x32.mat"]
    dm = build_datamodule("svhn", data_dir=str(target), batch_size=8)
    dm.setup()
    assert (dm.num_classes, dm.in_chans, dm.img_size) == (10, 3, 32)
    assert (dm.train_size, dm.val_size, dm.test_size) == (24, 6, 10)
    assert sorted(set(dm.splits.test_labels.tolist())) == list(range(10))  # 10 became 0
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 3, 32, 32)


# --- a damaged archive: refused in one line, the folder left clean ---------------------------------------------------
def test_damaged_archive_is_refused_and_nothing_is_left(monkeypatch, server, tmp_path, capsys):
    good = serve_cifar10(monkeypatch, server, tmp_path)
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0xFF  # one wrong byte: the md5 no longer matches
    server["files"]["cifar-10-python.tar.gz"] = bytes(damaged)
    target = tmp_path / "data"
    target.mkdir()
    (target / "notes.txt").write_text("the user's own file")
    assert main(["cifar10", "--data-dir", str(target)]) == 2
    err = error_line(capsys.readouterr().err)
    assert "cifar10" in err and "corrupt" in err and "checksum" in err and "127.0.0.1" in err
    assert leftovers(target) == ["notes.txt"]  # no archive, no half-extracted folder, no staging folder
    with pytest.raises(ValueError, match="missing cifar-10-batches-py"):
        build_datamodule("cifar10", data_dir=str(target))


def test_damaged_mnist_file_is_refused_and_nothing_is_left(monkeypatch, server, tmp_path, capsys):
    serve_mnist_family(monkeypatch, server, tmp_path, tvd.MNIST)
    server["files"]["t10k-images-idx3-ubyte.gz"] = b"\x1f\x8b not the file"  # the last file is wrong
    target = tmp_path / "data"
    assert main(["mnist", "--data-dir", str(target)]) == 2
    err = error_line(capsys.readouterr().err)
    assert "mnist" in err and "corrupt" in err
    assert leftovers(target) == []  # the three good files were not kept either


# --- offline: one line naming the dataset, the host and what to do; exit 2 ----------------------------------------
@pytest.mark.parametrize("name", ["cifar10", "mnist", "svhn"])
def test_offline_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys, name):
    url = closed_port_url()
    monkeypatch.setattr(tvd.CIFAR10, "url", url + "cifar-10-python.tar.gz")
    monkeypatch.setattr(tvd.MNIST, "mirrors", [url])
    monkeypatch.setattr(tvd.SVHN, "split_list", {s: [url + f, f, m] for s, (_, f, m) in tvd.SVHN.split_list.items()})
    target = tmp_path / "data"
    assert main([name, "--data-dir", str(target)]) == 2
    err = error_line(capsys.readouterr().err)
    assert f"cannot download {name} from 127.0.0.1:" in err
    assert "offline" in err and "refused" in err.lower() and f"copy the files to {target} by hand" in err
    assert not target.exists()  # the folder it made for the download is gone again


def test_incomplete_existing_folder_is_not_overwritten(tmp_path, capsys):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    (folder / "data_batch_1").write_bytes(b"mine")
    assert main(["cifar10", "--data-dir", str(tmp_path)]) == 2
    err = error_line(capsys.readouterr().err)
    assert "exists but is incomplete" in err
    assert (folder / "data_batch_1").read_bytes() == b"mine"
    assert "exists but is incomplete: the download would refuse" in plan("cifar10", tmp_path)


def test_plan_and_dry_run_download_nothing(tmp_path, capsys):
    assert main(["svhn", "--data-dir", str(tmp_path / "svhn"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would download" in out and "ufldl.stanford.edu" in out and "train_32x32.mat" in out
    assert not (tmp_path / "svhn").exists()
    assert "nothing to download" in plan("digits", None)
    assert hosts("mnist")[0] == "ossci-datasets.s3.amazonaws.com"
    assert set(FETCHABLE) == {"cifar10", "cifar100", "mnist", "fashion_mnist", "svhn"}


def test_unknown_name_is_one_line(capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(["imagenet", "--data-dir", "x"])
    assert excinfo.value.code == 2
    err = error_line(capsys.readouterr().err)
    assert "invalid choice" in err


def test_pickle_helper_matches_torchvision_keys(tmp_path):
    """The tiny CIFAR archive's pickles are read by torchvision as upstream's are (str keys, latin1)."""
    archive, _ = cifar10_archive(tmp_path)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        member = tar.extractfile("cifar-10-batches-py/test_batch")
        entry = pickle.load(member, encoding="latin1")
    assert set(entry) >= {"data", "labels"} and entry["data"].shape == (10, 3072)


# --- --download in ablations.train and ablations.run -----------------------------------------------------------------
def test_train_download_fetches_then_trains(monkeypatch, server, tmp_path, capsys):
    from ablations.train import main as train_main

    serve_mnist_family(monkeypatch, server, tmp_path, tvd.FashionMNIST)
    data_dir = tmp_path / "data"
    code = train_main(["--dataset", "fashion_mnist", "--data-dir", str(data_dir), "--download", "--max-epochs", "1",
                       "--depth", "1", "--embed-dim", "8", "--num-heads", "2", "--batch-size", "16", "--precision",
                       "32-true", "--no-progress-bar", "--log-dir", str(tmp_path / "runs"), "--json"])
    assert code == 0
    out = capsys.readouterr()
    assert "fashion_mnist: verified and in place" in out.err
    assert (data_dir / "FashionMNIST" / "raw" / "train-images-idx3-ubyte").is_file()
    assert '"best_val_acc"' in out.out.strip().splitlines()[-1]


def test_download_of_a_dataset_the_system_package_holds_fetches_nothing(monkeypatch, server, tmp_path, capsys):
    """``--download`` where Debian's Fashion-MNIST folder holds the files: nothing is requested, one line names the
    folder the run reads; ``python -m data.fetch`` still fetches into the --data-dir it is given."""
    from data.fetch import ensure

    serve_mnist_family(monkeypatch, server, tmp_path, tvd.FashionMNIST)
    system = tmp_path / "usr-share-datasets-fashion-mnist"
    system.mkdir()
    for file_name, array in mnist_family_arrays(30, 10, seed=1).items():
        (system / f"{file_name}.gz").write_bytes(gzip.compress(idx_file_bytes(array)))
    monkeypatch.setattr(DATASETS["fashion_mnist"], "system_dirs", (str(system),))
    empty = tmp_path / "empty"
    empty.mkdir()
    lines = []
    ensure("fashion_mnist", None, log=lines.append)
    ensure("fashion_mnist", empty, log=lines.append)
    assert lines == [f"fashion_mnist: already in {system}; nothing to download"] * 2
    assert plan("fashion_mnist", empty) == lines[0]
    assert server["served"] == [] and list(empty.iterdir()) == []

    assert main(["fashion_mnist", "--data-dir", str(empty)]) == 0  # asked for a copy in --data-dir: fetched
    assert server["served"] and sorted(p.name for p in empty.iterdir()) == ["FashionMNIST"]
    assert build_datamodule("fashion_mnist", data_dir=str(empty)).folder == empty / "FashionMNIST" / "raw"
    assert "fashion_mnist: verified and in place" in capsys.readouterr().out


def test_run_download_dry_run_explains_and_fetches_nothing(tmp_path, capsys):
    """What ``--study residual_variants --budget paper --data-dir DIR --download --dry-run`` prints, on a tiny study
    of the same dataset (the paper budget's dry run prices 30 ViT-S models: minutes here)."""
    from helpers import write_study

    from ablations.run import main as run_main

    study = write_study(tmp_path / "on_cifar.yaml", base={"dataset": "cifar10", "dataset_options": {}, "patch_size": 4})
    args = ["--study", str(study), "--download", "--dry-run", "--results-dir", str(tmp_path / "results")]
    assert run_main([*args, "--data-dir", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert (f"--download: cifar10: would download 163 MiB from www.cs.toronto.edu (torchvision's CIFAR10, "
            f"md5-checked) into {tmp_path / 'd' / 'cifar-10-batches-py'}") in out
    assert not (tmp_path / "d").exists()

    write_cifar(tmp_path / "full", 10)  # a complete folder: nothing to fetch
    assert run_main([*args, "--data-dir", str(tmp_path / "full")]) == 0
    assert f"--download: cifar10: already in {tmp_path / 'full' / 'cifar-10-batches-py'}; nothing to download" in (
        capsys.readouterr().out)
    assert run_main([*args]) == 0  # no --data-dir: said, not guessed
    assert "--download: cifar10: cannot download without --data-dir" in capsys.readouterr().out


def test_run_download_offline_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys):
    from helpers import write_study

    from ablations.run import main as run_main

    monkeypatch.setattr(tvd.MNIST, "mirrors", [closed_port_url()])
    study = write_study(tmp_path / "needs_mnist.yaml", base={"dataset": "mnist", "dataset_options": {},
                                                                  "patch_size": 7})
    code = run_main(["--study", str(study), "--data-dir", str(tmp_path / "d"), "--download", "--storage",
                     f"sqlite:///{tmp_path / 's.db'}", "--results-dir", str(tmp_path / "results")])
    assert code == 2
    err = error_line(capsys.readouterr().err)
    assert "cannot download mnist from 127.0.0.1:" in err and "offline" in err
    assert not (tmp_path / "s.db").exists()  # refused before anything was stored


def test_missing_files_of_the_new_datasets_are_one_line(tmp_path, monkeypatch):
    from data.common import DataError

    with pytest.raises(DataError, match=r"missing train_32x32\.mat, test_32x32\.mat; expected .*SVHN format"):
        build_datamodule("svhn", data_dir=str(tmp_path))
    monkeypatch.setattr(DATASETS["fashion_mnist"], "system_dirs", (str(tmp_path / "not-installed"),))
    with pytest.raises(DataError, match=r"no fashion_mnist files in .*FashionMNIST/raw, .*--data-dir DIR.*"
                                        r"apt-get install dataset-fashion-mnist.*--download"):
        build_datamodule("fashion_mnist", data_dir=str(tmp_path))


def test_download_help_names_every_fetchable_dataset():
    from ablations.run import build_parser as run_parser
    from ablations.train import build_parser as train_parser

    for parser in (run_parser(), train_parser()):
        text = " ".join(next(a.help for a in parser._actions if a.dest == "download").split())
        assert all(name in text for name in FETCHABLE), text


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_run_download_fetches_then_runs_the_study(monkeypatch, server, tmp_path, capsys):
    from helpers import trials_of, write_study

    from ablations.run import main as run_main

    serve_mnist_family(monkeypatch, server, tmp_path, tvd.MNIST)
    study = write_study(tmp_path / "on_mnist.yaml", base={"dataset": "mnist", "dataset_options": {}, "patch_size": 7})
    data_dir = tmp_path / "d"
    code = run_main(["--study", str(study), "--data-dir", str(data_dir), "--download", "--storage",
                     f"sqlite:///{tmp_path / 's.db'}", "--results-dir", str(tmp_path / "results"), "--no-progress",
                     "--workers", "1"])  # in this process: the DataModule expects the tiny files (declare_files)
    assert code == 0
    assert "mnist: verified and in place" in capsys.readouterr().err
    assert sorted(p.name for p in data_dir.iterdir()) == ["MNIST"]
    trials = trials_of(tmp_path / "s.db", "on_mnist")
    assert len(trials) == 2 and all(t.state.name == "COMPLETE" for t in trials)


def test_a_missing_file_on_the_server_is_one_line(monkeypatch, server, tmp_path, capsys):
    serve_cifar10(monkeypatch, server, tmp_path)
    del server["files"]["cifar-10-python.tar.gz"]  # HTTP 404: the host answers, the file is not there
    assert main(["cifar10", "--data-dir", str(tmp_path / "d")]) == 2
    err = error_line(capsys.readouterr().err)
    assert "the server answered HTTP 404" in err and "by hand" in err
    assert not (tmp_path / "d").exists()
