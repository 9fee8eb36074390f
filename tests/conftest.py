"""Shared fixtures."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import torch
from pg import INSTALL, PostgresCluster, unavailable_reason
from prerequisites import missing

# Training's default stream_kernels "auto" compiles Hyper-Connections' and mHC's kernels on a CPU (25-50 s per
# process with a cold inductor cache): the suite's runs (and the CLIs it starts) use the eager ones, the same
# function; the tests that say stream_kernels="compiled" exercise the compiled path.
os.environ.setdefault("ABLATIONS_STREAM_KERNELS", "eager")
# A study's engine "auto" measures stacked vs plain steps on a CPU before its first stack (seconds per cell and
# results folder): the suite's studies (and the CLIs it starts) run plain Lightning trials; tests/test_engine.py
# passes --engine stacked where the stacked path is what it checks.
os.environ.setdefault("ABLATIONS_ENGINE", "plain")


@pytest.fixture(scope="module")
def postgres():
    """One throwaway PostgreSQL server per test module (tests use a fresh database each: ``create_database``).
    Where the server binaries are absent its tests skip, and fail under ``CI=true`` (.ci/run installs them)."""
    reason = unavailable_reason()
    if reason:
        missing(reason, INSTALL)
    cluster = PostgresCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request, tmp_path) -> Path | str:
    """A fresh study storage, once a SQLite file (a ``Path``), once a PostgreSQL database (its URL)."""
    if request.param == "sqlite":
        return tmp_path / "shared.db"
    return request.getfixturevalue("postgres").create_database(f"test_{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a module of tiny models or small ops: there torch's threads only add overhead, and two
    threads on two shared cores oversubscribe badly (10x on a busy machine). Use: ``pytestmark =
    pytest.mark.usefixtures("one_thread")``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
