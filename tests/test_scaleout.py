"""Scale-out and fault tolerance: studies in PostgreSQL shared by workers, crash recovery (DDP: test_ddp.py).

Real components on loopback, no mocks: one throwaway PostgreSQL server for the module (the ``postgres`` fixture,
tests/conftest.py; a fresh database per test), the CLI in subprocesses (in this process where the process is not
what is tested: the twin storages), tiny ViTs on the synthetic dataset. The crash scenarios are the SQLite ones of
test_studies.py (tests/helpers.py), run here against PostgreSQL.
"""

from __future__ import annotations

import subprocess
import sys
import time

import optuna
import pytest
from helpers import (
    LONG_TRIAL_EPOCHS,
    STUDY_TEST_MARKS,
    assert_grid_complete_once,
    assert_one_line_error,
    assert_resumed_from,
    check_bad_checkpoints_restart_their_trials,
    check_killed_trial_is_retried_and_resumes,
    check_two_workers_complete_each_point_once,
    finish,
    freeze_when,
    run_cli,
    run_dir_name,
    run_in_process,
    saved_checkpoint,
    snapshot,
    start_cli,
    stop_group,
    thaw,
    trials_of,
    url_of,
    write_study,
)
from optuna.trial import TrialState

from ablations.studies.spec import load_spec
from ablations.studies.storage import open_storage

pytestmark = STUDY_TEST_MARKS


# --- workers sharing one PostgreSQL study -----------------------------------------------------------------------
@pytest.mark.slow
def test_two_workers_on_postgresql_run_every_grid_point_exactly_once(postgres, tmp_path):
    check_two_workers_complete_each_point_once(tmp_path, postgres.create_database("workers"))


# --- crash recovery on PostgreSQL (the same scenarios as on SQLite) ----------------------------------------------
@pytest.mark.slow
def test_killed_worker_on_postgresql_its_trial_is_retried_and_resumes_its_epochs(postgres, tmp_path):
    check_killed_trial_is_retried_and_resumes(tmp_path, postgres.create_database("killed"))


@pytest.mark.slow
def test_corrupt_or_missing_checkpoints_on_postgresql_restart_their_trials(postgres, tmp_path):
    check_bad_checkpoints_restart_their_trials(tmp_path, postgres.create_database("corrupt"))


@pytest.mark.slow
def test_server_stopped_mid_study_worker_exits_with_one_line_and_rerun_finishes(postgres, tmp_path):
    """The server goes away while trial 0 trains (the worker is frozen from its first checkpoint until the server
    is down): the worker stops by itself with one line and status 1. The server restarts on the same data folder;
    the rerun retries trial 0, which starts at the dead attempt's checkpoint, and finishes."""
    max_epochs = LONG_TRIAL_EPOCHS  # the server stops right after a checkpoint, long before the last epoch
    write_study(tmp_path / "outage.yaml", base={"max_epochs": max_epochs})
    spec = load_spec(str(tmp_path / "outage.yaml"))
    url = postgres.create_database("outage")
    args = ("--study", "outage.yaml", "--storage", url, "--results-dir", "results", "--heartbeat", "1",
            "--grace", "2", "--no-progress")
    last_ckpt = tmp_path / "results" / "runs" / "outage" / run_dir_name(spec, "standard") / "checkpoints" / "last.ckpt"
    proc = start_cli(*args, cwd=tmp_path)
    try:
        freeze_when(lambda: saved_checkpoint(last_ckpt), proc, "trial 0 wrote a checkpoint")
        first = saved_checkpoint(last_ckpt)
        postgres.stop()
        thaw(proc)
        lost = finish(proc)  # the hang limit only: the worker must notice the outage by itself
    finally:
        stop_group(proc)
        postgres.start()
    # The worker trains on until its next call to the server fails (the epoch's report): later epochs may have saved
    # checkpoints by then. The retry must start at the last one the dead attempt wrote.
    saved = saved_checkpoint(last_ckpt)
    assert saved["global_step"] >= first["global_step"] and saved["epoch"] < max_epochs - 1, (first, saved)
    # the start banner (after the data line, and precision auto's line if it measured this machine's modes first),
    # then one error line
    lines = [ln for ln in lost.stderr.strip().splitlines() if not ln.startswith(("precision auto,", "data: "))]
    assert lost.returncode == 1 and len(lines) == 2 and lines[0].startswith("study 'outage'"), lost.stderr
    assert lines[1].startswith(f"error: lost storage '{url}': ") and "rerun the same command" in lines[1]
    assert "Traceback" not in lost.stdout + lost.stderr
    assert [t.state for t in trials_of(url, "outage")] == [TrialState.RUNNING, TrialState.WAITING]
    time.sleep(3)  # > grace

    rerun = run_cli(*args, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    complete = assert_grid_complete_once(url, spec)
    trials = trials_of(url, "outage")
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    retry = complete[tuple(sorted(trials[0].params.items()))]
    assert retry.user_attrs["retry_of"] == 0
    assert_resumed_from(retry, saved, max_epochs, tmp_path)


LOST_HEARTBEAT_SCRIPT = """
import threading, time
import sqlalchemy.exc
from ablations.studies.storage import exit_when_heartbeat_fails

exit_when_heartbeat_fails("postgresql://postgres:s3cret@db.example:5432/study")

def heartbeat():
    try:
        raise sqlalchemy.exc.OperationalError("UPDATE trial_heartbeats ...", {}, Exception(
            "server closed the connection unexpectedly\\n\\tThis probably means the server terminated abnormally"))
    except Exception as exc:
        raise RuntimeError("the heartbeat thread failed") from exc

threading.Thread(target=heartbeat).start()
time.sleep(3600)  # training on: the hook must end the process at once
print("trained on without heartbeats")
"""


def test_a_heartbeat_that_loses_the_storage_ends_the_worker_with_one_line():
    """The fast check of the outage (the real server stopped mid-study is in the slow tier): a heartbeat that fails
    on a database error ends the worker at once with exit status 1 and the lost-storage line, the password hidden,
    instead of a thread traceback and a trial that trains on without heartbeats."""
    result = subprocess.run([sys.executable, "-c", LOST_HEARTBEAT_SCRIPT], capture_output=True, text=True,
                            timeout=600)  # a hang limit only
    assert result.returncode == 1 and result.stdout == "", result.stderr
    assert result.stderr.strip() == (
        "error: lost storage 'postgresql://postgres:***@db.example:5432/study': server closed the connection "
        "unexpectedly; completed trials are kept and a trial that was running is retried from its last checkpoint: "
        "rerun the same command once the database is reachable again")


def test_same_study_name_in_two_storages_are_independent_studies(postgres, tmp_path):
    """A study named 'twin' already holds a finished trial in a SQLite file; running 'twin' against a PostgreSQL
    database creates a study of its own there (own trial numbers, own grid) and leaves the SQLite one as it was."""
    write_study(tmp_path / "twin.yaml")
    spec = load_spec(str(tmp_path / "twin.yaml"))
    sqlite = tmp_path / "twin.db"
    other = optuna.create_study(storage=url_of(sqlite), study_name="twin", direction="maximize")
    other.add_trial(optuna.trial.create_trial(
        params={"variant": "rezero"}, value=0.5,
        distributions={"variant": optuna.distributions.CategoricalDistribution(["standard", "rezero"])}))
    before = snapshot(trials_of(sqlite, "twin"))
    url = postgres.create_database("twin")

    result = run_in_process("--study", "twin.yaml", "--storage", url, "--results-dir", "results", "--no-progress",
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [t.number for t in assert_grid_complete_once(url, spec).values()] == [0, 1]
    assert len(trials_of(url, "twin")) == 2
    assert snapshot(trials_of(sqlite, "twin")) == before and before[0][2] == {"variant": "rezero"}


# --- bad storage URLs (unreachable ports and missing SQLite folders: test_studies.py) ----------------------------
@pytest.mark.parametrize("url_of_cluster, fragments", [
    (lambda pg: pg.url("no_such_db"), ("cannot reach storage", 'database "no_such_db" does not exist')),
    (lambda pg: f"postgresql://nobody@127.0.0.1:{pg.port}/postgres", ('role "nobody" does not exist',)),
    (lambda pg: f"postgresql://postgres:s3cret@127.0.0.1:{pg.port}/no_such_db",
     ("'postgresql://postgres:***@127.0.0.1:",)),
], ids=["missing-database", "unknown-role", "password-redacted"])
def test_bad_storage_url_on_a_live_server_is_one_line_value_error(postgres, url_of_cluster, fragments):
    _assert_one_line_value_error(url_of_cluster(postgres), fragments)


@pytest.mark.parametrize("url, fragments", [
    ("postgresql://postgres@127.0.0.1:notaport/db", ("is not valid", "notaport")),
    ("postgresql://postgres@no-such-host.invalid/db", ("cannot reach storage", "no-such-host.invalid")),
    ("mysql://user@127.0.0.1/db", ("needs a database driver that is not installed",)),
    ("nosuchdb://user@127.0.0.1/db", ("unknown database kind", "nosuchdb")),
    ("results/optuna.db", ("is not a URL", "sqlite:///")),
], ids=["bad-port", "unknown-host", "missing-driver", "unknown-scheme", "not-a-url"])
def test_bad_storage_url_is_one_line_value_error(url, fragments):
    """URLs that fail before any server is asked: no PostgreSQL needed (never skipped)."""
    _assert_one_line_value_error(url, fragments)


def _assert_one_line_value_error(url: str, fragments: tuple) -> None:
    with pytest.raises(ValueError) as info:
        open_storage(url)
    message = str(info.value)
    assert "\n" not in message and "s3cret" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_postgres_scheme_is_read_as_postgresql(postgres):
    open_storage(postgres.url().replace("postgresql://", "postgres://")).get_all_studies()


# --- DDP (the multi-process checks, with real ranks, are in test_ddp.py) ----------------------------------------------
def test_study_refuses_a_multi_device_strategy_that_relaunches_the_script(tmp_path):
    write_study(tmp_path / "fsdp.yaml", base={"accelerator": "cpu", "devices": 2, "strategy": "fsdp"})
    result = run_cli("--study", "fsdp.yaml", "--storage", url_of(tmp_path / "o.db"), cwd=tmp_path)
    assert_one_line_error(result, "strategy 'fsdp' with devices=2 cannot run inside a study", "ddp_spawn")
    assert not (tmp_path / "o.db").exists()


@pytest.mark.parametrize("url, fragments", [
    ("postgresql://postgres@127.0.0.1:notaport/db", ("is not valid", "notaport")),
    ("mysql://user@127.0.0.1/db", ("needs a database driver that is not installed",)),
    ("nosuchdb://user@127.0.0.1/db", ("unknown database kind", "nosuchdb")),
    ("results/optuna.db", ("is not a URL", "sqlite:///")),
], ids=["bad-port", "missing-driver", "unknown-scheme", "not-a-url"])
def test_a_dry_run_refuses_the_storage_urls_a_run_refuses(tmp_path, url, fragments):
    """A dry run reads what is stored to say what is left, and prices the whole study when the storage cannot be
    reached; a URL that the run would refuse before asking any server is refused by the dry run too, in one line."""
    write_study(tmp_path / "tiny.yaml")
    result = run_in_process("--study", "tiny.yaml", "--storage", url, "--dry-run", cwd=tmp_path)
    assert_one_line_error(result, *fragments)
    ok = run_in_process("--study", "tiny.yaml", "--storage", "postgresql://postgres@no-such-host.invalid/db",
                        "--dry-run", cwd=tmp_path)  # well-formed but unreachable: priced whole, exit 0
    assert ok.returncode == 0 and "trials" in ok.stdout + ok.stderr
