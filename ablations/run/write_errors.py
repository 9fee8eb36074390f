"""What stops a study with one line instead of failing its trials one by one: a results folder that takes no more
writes (:class:`ResultsWriteError`, :func:`write_error`), and an error as one line (:func:`one_line`). Shared by the
plain worker's trial guard (:mod:`ablations.run.workers`) and the stacked trials (:mod:`ablations.run.stacked`)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: OS errors that say the results folder takes no more writes (a full disk or quota, a read-only mount, a file size
#: limit): the study stops with one line instead of failing every remaining trial the same way. EACCES / EPERM count
#: only for a path inside the results folder (a permission problem elsewhere, e.g. the data, is not about it).
FULL_OR_READ_ONLY = frozenset(getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EROFS", "EFBIG")
                              if hasattr(errno, name))


NO_PERMISSION = frozenset({errno.EACCES, errno.EPERM})


class ResultsWriteError(Exception):
    """A trial could not write its files (checkpoint, event files) into the results folder: one line, exit 1."""


def write_error(exc: BaseException, results_dir: Path | None = None) -> OSError | None:
    """The OSError behind ``exc`` (anywhere in its cause/context chain) that says the results folder takes no more
    writes (:data:`FULL_OR_READ_ONLY`; EACCES / EPERM for a path inside ``results_dir``); None for anything else."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL_OR_READ_ONLY:
            return exc
        if isinstance(exc, OSError) and exc.errno in NO_PERMISSION and results_dir is not None:
            inside = [f for f in (exc.filename, exc.filename2) if f is not None and _inside(f, results_dir)]
            if inside:
                return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _inside(path, folder: Path) -> bool:
    try:
        return Path(os.fsdecode(path)).resolve().is_relative_to(folder.resolve())
    except (OSError, TypeError, ValueError):
        return False


def one_line(exc: BaseException) -> str:
    """An exception as one line; an OSError as ``[Errno N] reason: 'path'`` (a bytes path decoded)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        text = f"[Errno {exc.errno}] {exc.strerror or os.strerror(exc.errno)}"
        paths = [f"'{os.fsdecode(f) if isinstance(f, (str, bytes, os.PathLike)) else f}'"
                 for f in (exc.filename, exc.filename2) if f is not None]
        return " ".join((text + (": " + " -> ".join(paths) if paths else "")).split())
    return " ".join(str(exc).split()) or type(exc).__name__
