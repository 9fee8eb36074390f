"""What the command-line tools share: argparse that reports a bad argument as one line and exit status 2, the
arguments that name one stored study (``ablations.run`` runs it, ``ablations.report`` reads it), the one Markdown
table renderer of everything they print or write, the typed reading of a value given on the command line
(``parse_value``: ``--set``, ``--residual-option``, ``--init-value``) and of a duration (``--time-budget``)."""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from .layout import DEFAULT_STORAGE, OUTPUT_DIR, storage_url

# Imported where they are used, not here: PyYAML and tabulate. Each takes from a tenth of a second to seconds to
# import, and the command-line tools start without them.

#: the words a command line writes for "no value"
NONE_WORDS = ("None", "none", "null", "~", "")


def program(module: str) -> str:
    """The name a tool was called by, for its usage line: its console command (``ablations-run``, installed by
    ``pip install``) when started as one, else ``python -m <module>``."""
    called = os.path.basename(sys.argv[0] or "")
    return called if called.startswith("ablations-") else f"python -m {module}"


class OneLineParser(argparse.ArgumentParser):
    """argparse without the usage dump: an error is one ``error: ...`` line on stderr and exit status 2; an
    unrecognized flag names the closest one this tool has (``--workers`` -> ``--num-workers``). A tool with both
    ``--storage`` and ``--results-dir`` stores in the results folder unless told otherwise (:func:`default_storage`)."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if getattr(namespace, "storage", "") is None:
            results_dir = getattr(namespace, "results_dir", OUTPUT_DIR)
            try:
                namespace.storage = default_storage(results_dir)
            except OSError as exc:  # a file of that name, or a folder that cannot be made
                self.error(f"--results-dir '{results_dir}' cannot hold the study's storage: {exc.strerror}")
        return namespace, extras

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            import difflib

            flags = [f for action in self._actions for f in action.option_strings if f.startswith("--")]
            given = [word.split("=")[0] for word in message.split(":", 1)[1].split() if word.startswith("--")]
            close = [m for word in given for m in difflib.get_close_matches(word, flags, n=1, cutoff=0.6)]
            if close:
                message += f"; did you mean {' or '.join(dict.fromkeys(close))}?"
        fail(message)


def default_storage(results_dir: str | Path) -> str:
    """``--storage`` when not given: ``$ABLATIONS_STORAGE``, else the SQLite file of the results folder
    (``sqlite:///<results-dir>/optuna.db``), so that ``--results-dir`` moves a study's storage with its runs and
    reports. Nothing is made here (a dry run leaves no folder behind): a run makes the folder when it opens the
    storage (:func:`make_storage_folder`). FileExistsError when a file of that name stands where the folder goes."""
    url = os.environ.get("ABLATIONS_STORAGE") or storage_url(results_dir)
    if folder_storage(url, results_dir) and Path(results_dir).exists() and not Path(results_dir).is_dir():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(results_dir))
    return url


def folder_storage(storage: str, results_dir: str | Path) -> bool:
    """Whether ``storage`` is the results folder's own SQLite file (:func:`default_storage`), whose folder a run
    makes (:func:`make_storage_folder`) rather than one a URL names, whose missing folder is an error."""
    return storage == storage_url(results_dir)


def make_storage_folder(storage: str, results_dir: str | Path) -> None:
    """Make the results folder before a run opens ``storage`` when it is that folder's own (:func:`folder_storage`);
    a storage given by URL is left as it is (a missing folder there is the storage's one-line error)."""
    if folder_storage(storage, results_dir):
        Path(results_dir).mkdir(parents=True, exist_ok=True)


def fail(message: str) -> NoReturn:
    sys.stderr.write(f"error: {one_line(message)}\n")
    sys.exit(2)


def one_line(message: object) -> str:
    """An error message as one line. An error raised in a DataLoader worker process carries the worker's
    traceback in its text ("Caught DataError in DataLoader worker process 0. Original Traceback ..."): its last
    line, the error's own message, is what it says."""
    text = str(message).strip()
    if "Original Traceback" in text:
        text = text.splitlines()[-1].split(": ", 1)[-1]
    return " ".join(text.split())


def add_study_arguments(parser: argparse.ArgumentParser, *, report: bool = False) -> None:
    """``--study``, ``--budget``, ``--storage``, ``--study-name`` and ``--set``: the study file, its size, where it
    is stored and the overrides that name its stored study. The report's ``--study`` is required (but for its
    ``--ledger``) and its ``--set`` only finds the study; the run's ``--set`` changes what runs."""
    parser.add_argument("--study", help="a study name (see python -m ablations.run --list) or a path to a study .yaml "
                                        "file" + (" (required, but with --ledger)" if report else ""))
    parser.add_argument("--budget", default="default",
                        help="study size" + (" the study was run at" if report else "")
                             + ": smoke (CI, < 1 min), quick (minutes), default, gpu (Fashion-MNIST on one GPU), paper (CIFAR-10, GPUs)")
    parser.add_argument("--storage", default=None,
                        help=f"Optuna storage URL (default $ABLATIONS_STORAGE, else <results-dir>/optuna.db: "
                             f"{DEFAULT_STORAGE})")
    parser.add_argument("--study-name", help="name in the storage (default: the study's name, suffixed by the "
                                             "budget and the --set overrides)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="sets", help=(
        "the --set overrides the study was run with (python -m ablations.run ... --set ...): they name its stored "
        "study" if report else
        "override a RunConfig field of the study's base (repeatable; the value read as YAML, e.g. --set "
        "precision=32-true --set max_epochs=30); a field that changes results runs as its own stored study, "
        "<study>+FIELD=VALUE+... (fields sorted; threads and data_dir exempt)"))


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str | None = None,
                   pad: bool = False) -> str:
    """A Markdown pipe table of ``rows`` (cells as given: no number parsing), one ``l``/``r`` per column in
    ``align`` (default: all left). ``pad``: columns padded to one width (tabulate's ``pipe``), as the study reports
    write them; otherwise one space around each cell, as the CLIs print them."""
    align = align or "l" * len(headers)
    if pad and rows:
        from tabulate import tabulate

        return tabulate(rows, headers=headers, tablefmt="pipe", disable_numparse=True,
                        colalign=[{"l": "left", "r": "right"}[a] for a in align])
    rule = "|".join("---:" if a == "r" and not pad else "---" for a in align)
    return "\n".join(["| " + " | ".join(headers) + " |", f"|{rule}|", *("| " + " | ".join(r) + " |" for r in rows)])


def parse_value(text: str) -> Any:
    """A CLI value with a type: YAML scalars/lists (``true``, ``3``, ``[1, 2]``, ``null``), plus ``None``/``none``
    as null and ``1e-5`` as a float (YAML 1.1 would keep it a string); anything else stays a string."""
    stripped = text.strip()
    if stripped in NONE_WORDS:
        return None
    import yaml

    try:
        value = yaml.safe_load(stripped)
    except yaml.YAMLError:
        return stripped
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")


def duration(text: str) -> float:
    """Seconds from a duration written as seconds (``5400``), or with units (``90m``, ``1.5h``, ``2h30m``, ``45s``):
    argparse's ``type`` of ``--time-budget``."""
    match = _DURATION.fullmatch(text.strip().lower())
    if not text.strip() or match is None or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (seconds, or e.g. 90m, 1.5h, 2h30m)")
    hours, minutes, seconds = (float(g or 0) for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a time budget must be more than 0 s")
    return total
