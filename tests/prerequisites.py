"""A test whose prerequisite is missing (PostgreSQL's server binaries, user namespaces for the disk faults, Debian's
Fashion-MNIST package for the test of the real files): skipped on a developer's machine, a failure under
``CI=true``, so that CI can never pass with a scenario left out.

.ci/run installs what the tests need; only the CUDA tests (``-m cuda``) may skip in CI.
"""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def missing(reason: str, install: str) -> None:
    """Skip (fail under ``CI=true``) with one line: what is missing and what to install."""
    line = f"{reason}; install: {install}"
    if in_ci():
        pytest.fail(f"missing prerequisite under CI=true: {line}", pytrace=False)
    pytest.skip(line)
