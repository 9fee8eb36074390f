"""Shared fixtures."""

from __future__ import annotations

import pytest
from pg import INSTALL, PostgresCluster, unavailable_reason
from prerequisites import missing


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
