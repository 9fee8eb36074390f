"""Download a folder dataset with torchvision's own downloaders, checksums verified, into ``--data-dir``.

    python -m data.fetch cifar10 --data-dir ~/data          # ~/data/cifar-10-batches-py/
    python -m data.fetch svhn --data-dir ~/data/svhn --dry-run

``python -m ablations.train ... --download`` and ``python -m ablations.run ... --download`` call the same code for
the datasets their runs need. Fetchable: cifar10, cifar100, mnist, fashion_mnist, svhn (:data:`FETCHABLE`).

Guarantees:

- a folder that already holds the dataset's files is left alone: nothing is downloaded; so is a dataset a run
  already finds outside ``--data-dir`` when ``--download`` asks for it (Fashion-MNIST from Debian's
  ``dataset-fashion-mnist`` package), while ``python -m data.fetch`` still fetches it into ``--data-dir``;
- the files are downloaded and extracted into a temporary folder next to the target (``DIR/.fetch-NAME-*``), checked
  by torchvision (the md5 of every archive and, for CIFAR, of every extracted file) and parsed once (both splits);
  only then are they moved into place. Any failure (offline, a refused connection, a checksum mismatch, Ctrl-C)
  removes the temporary folder: the target never holds a half-written dataset that looks complete;
- failures are one line (:class:`FetchError`, a ValueError): offline or unreachable names the dataset, the host it
  tried and what to do instead; a corrupt download says so. The CLI prints ``error: ...`` and exits with status 2.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlparse

import data
from data.common import DataError

# Imported where they are used, not here: torchvision. Each takes from a tenth of a second to seconds to import, and
# the command-line tools start without them.


class FetchError(ValueError):
    """A download failed (offline, unreachable, corrupt) or cannot start: one line."""


@dataclass(frozen=True)
class Fetchable:
    """How torchvision downloads one dataset: its class (by name, so that a test can point the class's URLs
    elsewhere), the constructor arguments of each split, and what the download leaves under the root that makes
    the dataset (folders or files, moved into place together)."""

    torchvision_name: str
    splits: tuple[dict, ...]
    entries: tuple[str, ...]
    size: str  # the download's size, as the upstream files are

    def torchvision_class(self):
        import torchvision.datasets

        return getattr(torchvision.datasets, self.torchvision_name)

    def urls(self) -> list[str]:
        """The URLs torchvision will try, read from the class now (a test may have changed them)."""
        tv = self.torchvision_class()
        if hasattr(tv, "mirrors"):  # MNIST family: every file from the first mirror that answers
            return [f"{mirror}{name}" for mirror in tv.mirrors for name, _ in tv.resources]
        if hasattr(tv, "split_list"):  # SVHN: one file per split
            return [tv.split_list[s["split"]][0] for s in self.splits]
        return [tv.url]  # CIFAR: one archive


_TRAIN_TEST = ({"train": True}, {"train": False})
FETCHABLE: dict[str, Fetchable] = {
    "cifar10": Fetchable("CIFAR10", _TRAIN_TEST, ("cifar-10-batches-py",), "163 MiB"),
    "cifar100": Fetchable("CIFAR100", _TRAIN_TEST, ("cifar-100-python",), "161 MiB"),
    "mnist": Fetchable("MNIST", _TRAIN_TEST, ("MNIST",), "11 MiB"),
    "fashion_mnist": Fetchable("FashionMNIST", _TRAIN_TEST, ("FashionMNIST",), "29 MiB"),
    "svhn": Fetchable("SVHN", ({"split": "train"}, {"split": "test"}), ("train_32x32.mat", "test_32x32.mat"),
                      "235 MiB"),
}


def hosts(name: str) -> list[str]:
    """The hosts the download of ``name`` tries, in order."""
    return list(dict.fromkeys(urlparse(url).netloc for url in FETCHABLE[name].urls()))


def found_in(name: str, data_dir: str | Path | None) -> Path | None:
    """The folder a run of ``name`` would read its files from, or None when it finds none (what the DataModule
    checks when built): ``data_dir``, or a folder searched after it (Fashion-MNIST: the Debian package's)."""
    try:
        dm = data.build_datamodule(name, data_dir=None if data_dir is None else str(data_dir))
    except DataError:
        return None
    return getattr(dm, "folder", None) or Path(data_dir).expanduser()


def _inside(folder: Path, data_dir: str | Path | None) -> bool:
    if data_dir is None:
        return False
    root = Path(data_dir).expanduser().resolve()
    return root == folder.resolve() or root in folder.resolve().parents


def is_complete(name: str, data_dir: str | Path) -> bool:
    """Whether ``data_dir`` itself already holds every file the dataset's DataModule needs."""
    folder = found_in(name, data_dir)
    return folder is not None and _inside(folder, data_dir)


def _found_elsewhere(name: str, data_dir: str | Path | None) -> Path | None:
    """The folder outside ``data_dir`` that a run would read ``name`` from (a system package's), or None."""
    folder = found_in(name, data_dir)
    return None if folder is None or _inside(folder, data_dir) else folder


def plan(name: str, data_dir: str | Path | None) -> str:
    """One line saying what :func:`fetch` would do (for dry runs); downloads nothing."""
    if name not in FETCHABLE:
        return f"{name}: nothing to download ({_why_not(name)})"
    if (elsewhere := _found_elsewhere(name, data_dir)) is not None:
        return f"{name}: already in {elsewhere}; nothing to download"
    if data_dir is None:
        return f"{name}: cannot download without --data-dir"
    target = Path(data_dir).expanduser()
    entries = ", ".join(str(target / e) for e in FETCHABLE[name].entries)
    if is_complete(name, target):
        return f"{name}: already in {entries}; nothing to download"
    present = [str(target / e) for e in FETCHABLE[name].entries if (target / e).exists()]
    if present:
        return f"{name}: {', '.join(present)} exists but is incomplete: the download would refuse (move it away)"
    return (f"{name}: would download {FETCHABLE[name].size} from {', '.join(hosts(name))} (torchvision's "
            f"{FETCHABLE[name].torchvision_name}, md5-checked) into {entries}")


def _why_not(name: str) -> str:
    if name == "imagefolder":
        return "a folder of your own images; torchvision has no downloader for it"
    if name in data.DATASETS:
        return "embedded or generated: no files needed"
    return "unknown dataset"


def ensure(name: str, data_dir: str | Path | None, *, log=print) -> None:
    """``--download`` of a run's dataset: :func:`fetch` it when torchvision can download it; a dataset that needs no
    files (embedded, generated) is skipped silently, a folder of one's own (imagefolder) with a line saying so, and
    one the run finds outside ``data_dir`` (Fashion-MNIST from the Debian package) with a line naming its folder."""
    if name in FETCHABLE and (elsewhere := _found_elsewhere(name, data_dir)) is not None:
        log(f"{name}: already in {elsewhere}; nothing to download")
    elif name in FETCHABLE:
        fetch(name, data_dir, log=log)
    elif name == "imagefolder":
        log(f"{name}: nothing to download ({_why_not(name)})")


def ensure_all(datasets: Sequence[tuple[str, str | Path | None]], *, dry_run: bool = False) -> None:
    """``--download`` of a study: :func:`ensure` each (dataset, data_dir) once, progress on stderr; with
    ``dry_run``, one ``--download: ...`` line each on stdout (:func:`plan`) and nothing fetched."""
    for name, data_dir in dict.fromkeys(datasets):
        if dry_run:
            print(f"--download: {plan(name, data_dir)}")
        else:
            ensure(name, data_dir, log=lambda line: print(line, file=sys.stderr))


def fetch(name: str, data_dir: str | Path | None, *, log=print) -> bool:
    """Make ``data_dir`` hold dataset ``name`` (see the module's guarantees). Returns False when it was already
    there (nothing downloaded), True after a download. Raises :class:`FetchError` with one line."""
    if name not in FETCHABLE:
        raise FetchError(f"{name} cannot be downloaded: {_why_not(name)}; downloadable: {', '.join(FETCHABLE)}")
    if data_dir is None:
        raise FetchError(f"downloading {name} needs a data folder (--data-dir DIR)")
    spec, target = FETCHABLE[name], Path(data_dir).expanduser()
    if is_complete(name, target):
        log(f"{name}: already in {target}; nothing to download")
        return False
    present = [e for e in spec.entries if (target / e).exists()]
    if present:
        raise FetchError(f"{name}: {', '.join(str(target / e) for e in present)} exists but is incomplete; move it "
                         "away (or delete it) and rerun, or complete it by hand")
    created = not target.exists()
    try:
        target.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".fetch-{name}-", dir=target))
    except OSError as exc:
        raise FetchError(f"cannot write the data folder '{target}' for {name}: {exc.strerror or exc}") from None
    done = False
    try:
        log(f"{name}: downloading {spec.size} from {', '.join(hosts(name))} into {target}")
        _download(name, spec, staging, target)
        for entry in spec.entries:
            (staging / entry).rename(target / entry)  # same file system: each move is atomic
        done = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created and not done and not any(target.iterdir()):
            target.rmdir()  # a failed download leaves no trace, not even the folder it made
    log(f"{name}: verified and in place: " + ", ".join(str(target / e) for e in spec.entries))
    return True


def _download(name: str, spec: Fetchable, staging: Path, target: Path) -> None:
    """torchvision's download (md5-checked) and parse of every split into ``staging``; one-line FetchError."""
    tv = spec.torchvision_class()
    try:
        for split in spec.splits:
            tv(str(staging), download=True, **split)  # downloads, checks the md5s, then parses the split
    except Exception as exc:  # noqa: BLE001 - torchvision raises RuntimeError, URLError, OSError, tarfile errors...
        raise _failure(name, spec, target, exc) from None


def _failure(name: str, spec: Fetchable, target: Path, exc: BaseException) -> FetchError:
    """Offline / unreachable, or a download that failed its checks, as one line."""
    module = data.DATASETS[name]
    layout = module.layout_text() if hasattr(module, "layout_text") else module.layout
    by_hand = f"copy the files to {target} by hand: {layout}"
    reason = _network_reason(exc)
    if reason is not None and reason.startswith("HTTP "):  # the host answered, but not with the file
        return FetchError(f"cannot download {name} from {', '.join(hosts(name))}: the server answered {reason}; "
                          f"torchvision's URL may have moved (a newer torchvision may know the new one), or {by_hand}")
    if reason is not None:
        return FetchError(f"cannot download {name} from {', '.join(hosts(name))} ({reason}): the machine is offline "
                          f"or the host is unreachable; rerun where the internet is reachable, or {by_hand}")
    if isinstance(exc, OSError) and exc.errno is not None and exc.filename is not None:  # e.g. a full disk
        return FetchError(f"cannot write the download of {name} into {target}: [Errno {exc.errno}] {exc.strerror}; "
                          "nothing was left there: free space or make the folder writable, then rerun")
    detail = " ".join(str(exc).split()) or type(exc).__name__
    return FetchError(f"the download of {name} from {', '.join(hosts(name))} is corrupt or incomplete ({detail}): "
                      f"it failed torchvision's checksum check and was discarded, nothing was written to {target}; "
                      f"rerun to try again, or {by_hand}")


def _network_reason(exc: BaseException) -> str | None:
    """Why the network failed (e.g. ``Connection refused``), or None when ``exc`` is not a network failure.
    torchvision's MNIST wraps each mirror's URLError in a RuntimeError's text: that is recognised too."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, urllib.error.HTTPError):
            return f"HTTP {exc.code} {exc.reason}"
        if isinstance(exc, urllib.error.URLError):
            reason = exc.reason
            return " ".join(str(getattr(reason, "strerror", None) or reason).split())
        if isinstance(exc, (ConnectionError, TimeoutError)):
            return " ".join(str(exc.strerror or exc).split())
        text = str(exc)  # MNIST: "Error downloading F: Tried MIRROR, got: <urlopen error [Errno 111] ...>"
        if "<urlopen error" in text:
            return " ".join(text.split("<urlopen error", 1)[1].split(">", 1)[0].split())
        if "HTTP Error" in text:
            return " ".join(("HTTP" + text.split("HTTP Error", 1)[1]).split())
        exc = exc.__cause__ or exc.__context__
    return None


class OneLineParser(argparse.ArgumentParser):
    """argparse whose error is one ``error: ...`` line on stderr and exit status 2, as the ``ablations`` tools' (the
    data layer imports nothing above it)."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: {' '.join(str(message).split())}\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    parser = OneLineParser(prog="python -m data.fetch", description=doc.split("\n\n")[0],
                           formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc.split("\n\n", 1)[1])
    parser.add_argument("name", choices=tuple(FETCHABLE), metavar="NAME",
                        help="the dataset: " + ", ".join(f"{n} ({s.size})" for n, s in FETCHABLE.items()))
    parser.add_argument("--data-dir", required=True, metavar="DIR",
                        help="the data folder (the --data-dir of ablations.train / ablations.run)")
    parser.add_argument("--dry-run", action="store_true", help="say what would be downloaded, download nothing")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.dry_run:
            print(plan(args.name, args.data_dir))
        else:
            fetch(args.name, args.data_dir)
    except FetchError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; nothing was left in the data folder", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
