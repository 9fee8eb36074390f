"""Shared fixtures."""

from __future__ import annotations

import pytest
from pg import PostgresCluster, unavailable_reason


@pytest.fixture(scope="module")
def postgres():
    """One throwaway PostgreSQL server per test module (tests use a fresh database each: ``create_database``);
    skipped only where the server binaries are absent (CI installs them, see .ci/run)."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    cluster = PostgresCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.remove()
