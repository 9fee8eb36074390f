"""``--storage`` when not given: ``$ABLATIONS_STORAGE``, else the SQLite file of ``--results-dir``, so that moving
the results folder moves a study's storage with its runs and reports (both tools read the same default)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ablations.cli import make_storage_folder
from ablations.layout import DEFAULT_STORAGE
from ablations.report.cli import build_parser as report_parser
from ablations.run.cli import build_parser as run_parser


def test_the_storage_follows_the_results_folder_unless_given(tmp_path, monkeypatch):
    monkeypatch.delenv("ABLATIONS_STORAGE", raising=False)
    where = tmp_path / "elsewhere"
    for parser in (run_parser(), report_parser()):
        assert parser.parse_args(["--study", "residual_variants"]).storage == DEFAULT_STORAGE == (
            "sqlite:///outputs/optuna.db")
        moved = parser.parse_args(["--study", "residual_variants", "--results-dir", str(where)])
        assert moved.storage == f"sqlite:///{where}/optuna.db" and not where.exists()  # a run makes it, not this
        given = parser.parse_args(["--study", "x", "--results-dir", str(where), "--storage", "sqlite:///a.db"])
        assert given.storage == "sqlite:///a.db"
        monkeypatch.setenv("ABLATIONS_STORAGE", "postgresql://u@h/db")
        assert parser.parse_args(["--study", "x", "--results-dir", str(where)]).storage == "postgresql://u@h/db"
        monkeypatch.delenv("ABLATIONS_STORAGE")


def test_a_results_dir_that_cannot_be_a_folder_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ABLATIONS_STORAGE", raising=False)
    (tmp_path / "afile").write_text("earlier results\n")
    for parser in (run_parser(), report_parser()):
        with pytest.raises(SystemExit) as stop:
            parser.parse_args(["--study", "x", "--results-dir", str(tmp_path / "afile")])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1 and err.startswith(
            f"error: --results-dir '{tmp_path / 'afile'}' cannot hold the study's storage: File exists")
    assert (tmp_path / "afile").read_text() == "earlier results\n"  # nothing it held is lost



def test_a_dry_run_leaves_no_folder_and_a_run_makes_the_one_its_storage_needs(tmp_path, monkeypatch):
    """A dry run into a new results folder prints its plan and creates nothing; the folder is made when a run opens
    the folder's own storage, never for a storage given by URL (a missing folder there stays the storage's error)."""
    monkeypatch.delenv("ABLATIONS_STORAGE", raising=False)
    where = tmp_path / "new" / "results"
    done = subprocess.run([sys.executable, "-m", "ablations.run", "--study", "completep_depth", "--dry-run",
                           "--results-dir", str(where)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "study completep_depth: grid, 60 trials" in done.stdout and not (tmp_path / "new").exists()
    make_storage_folder(f"sqlite:///{tmp_path}/other/optuna.db", where)
    assert not where.exists()
    make_storage_folder(f"sqlite:///{where}/optuna.db", where)
    assert where.is_dir() and list(where.iterdir()) == []
