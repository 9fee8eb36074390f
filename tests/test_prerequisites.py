"""A missing prerequisite skips a test on a developer's machine and fails it under ``CI=true`` (tests/prerequisites.py),
with one line naming what is missing and what to install."""

from __future__ import annotations

import pytest
from _pytest.outcomes import Failed, Skipped
from pg import INSTALL
from prerequisites import missing


@pytest.mark.parametrize("ci", ["true", "True"])
def test_under_ci_a_missing_prerequisite_fails_with_one_line(monkeypatch, ci):
    monkeypatch.setenv("CI", ci)
    with pytest.raises(Failed) as info:
        missing("PostgreSQL server binaries (initdb, postgres) not found", INSTALL)
    assert info.value.msg == ("missing prerequisite under CI=true: PostgreSQL server binaries (initdb, postgres) not "
                              f"found; install: {INSTALL}") and "\n" not in info.value.msg
    assert info.value.pytrace is False  # the line alone, no traceback
    assert "apt-get install postgresql" in INSTALL


@pytest.mark.parametrize("ci", [None, "", "false"])
def test_elsewhere_a_missing_prerequisite_skips(monkeypatch, ci):
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(Skipped, match="user namespaces; install: a kernel that allows them"):
        missing("user namespaces", "a kernel that allows them")
