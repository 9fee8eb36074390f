"""The repository's committed files, for the tests that read committed results: what git tracks, never what a
user's run or report left beside them (outside a git checkout: every file that matches)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def committed(pattern: str) -> list[Path]:
    """The tracked files matching ``pattern`` (a git pathspec glob relative to the repository, e.g.
    ``results/*/runs.csv``: ``*`` stops at a ``/`` as in ``Path.glob``, so ``results/in_progress/<study>/runs.csv``
    is not one), sorted; outside a git checkout every file ``Path.glob`` finds."""
    try:
        listed = subprocess.run(["git", "ls-files", "--", f":(glob){pattern}"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return sorted(REPO.glob(pattern))
    return sorted(REPO / line for line in listed if (REPO / line).is_file())
