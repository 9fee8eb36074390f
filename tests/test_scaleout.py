"""Scale-out and fault tolerance: studies in PostgreSQL shared by workers, crash recovery, DDP trials.

Real components on loopback, no mocks: one throwaway PostgreSQL server for the module (the ``postgres`` fixture,
tests/conftest.py; a fresh database per test), the CLI in subprocesses, tiny ViTs on the synthetic dataset, DDP
over gloo on the CPU. The crash scenarios are the SQLite ones of test_studies.py (tests/helpers.py), run here
against PostgreSQL.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import optuna
import pytest
from helpers import (
    CLI_TIMEOUT_S,
    LONG_TRIAL_EPOCHS,
    STUDY_TEST_MARKS,
    TWO_VARIANTS,
    assert_grid_complete_once,
    assert_one_line_error,
    check_bad_checkpoints_restart_their_trials,
    check_killed_trial_is_retried_and_resumes,
    check_two_workers_complete_each_point_once,
    finish,
    run_cli,
    run_dir_name,
    snapshot,
    start_cli,
    stop_group,
    trials_of,
    url_of,
    wait_for,
    write_study,
)
from optuna.trial import TrialState

from ablations.spec import load_spec
from ablations.storage import open_storage

pytestmark = STUDY_TEST_MARKS

TINY_TRAIN = ("--dataset", "synthetic", "--dataset-option", "num_samples=128", "--dataset-option", "img_size=8",
              "--embed-dim", "8", "--num-heads", "2", "--depth", "1", "--patch-size", "4", "--batch-size", "16",
              "--max-epochs", "1", "--threads", "1")
#: Training images of TINY_TRAIN's dataset (128 samples, 20% held out for validation).
TINY_TRAIN_IMAGES = 128 - round(0.2 * 128)


# --- workers sharing one PostgreSQL study -----------------------------------------------------------------------
@pytest.mark.slow
def test_two_workers_on_postgresql_run_every_grid_point_exactly_once(postgres, tmp_path):
    check_two_workers_complete_each_point_once(tmp_path, postgres.create_database("workers"))


# --- crash recovery on PostgreSQL (the same scenarios as on SQLite) ----------------------------------------------
@pytest.mark.slow
def test_killed_worker_on_postgresql_its_trial_is_retried_and_resumes_its_epochs(postgres, tmp_path):
    check_killed_trial_is_retried_and_resumes(tmp_path, postgres.create_database("killed"))


def test_corrupt_or_missing_checkpoints_on_postgresql_restart_their_trials(postgres, tmp_path):
    check_bad_checkpoints_restart_their_trials(tmp_path, postgres.create_database("corrupt"))


@pytest.mark.slow
def test_server_stopped_mid_study_worker_exits_with_one_line_and_rerun_finishes(postgres, tmp_path):
    """The server goes away while trial 0 trains: the worker stops within a heartbeat, with one line and status 1.
    The server restarts on the same data folder; the rerun retries trial 0 from its checkpoint and finishes."""
    max_epochs = LONG_TRIAL_EPOCHS  # the server stops right after epoch 1's checkpoint
    write_study(tmp_path / "outage.yaml", base={"max_epochs": max_epochs})
    spec = load_spec(str(tmp_path / "outage.yaml"))
    url = postgres.create_database("outage")
    args = ("--study", "outage.yaml", "--storage", url, "--results-dir", "results", "--heartbeat", "1",
            "--grace", "2", "--no-progress")
    last_ckpt = tmp_path / "results" / "runs" / "outage" / run_dir_name(spec, "standard") / "checkpoints" / "last.ckpt"
    proc = start_cli(*args, cwd=tmp_path)
    try:
        wait_for(last_ckpt.is_file, proc, "trial 0 wrote a checkpoint")
        postgres.stop()
        started = time.monotonic()
        lost = finish(proc, timeout=120)
        stopped_after = time.monotonic() - started
    finally:
        stop_group(proc)
        postgres.start()
    lines = lost.stderr.strip().splitlines()  # the start banner, then one error line
    assert lost.returncode == 1 and len(lines) == 2 and lines[0].startswith("study 'outage'"), lost.stderr
    assert lines[1].startswith(f"error: lost storage '{url}': ") and "rerun the same command" in lines[1]
    assert "Traceback" not in lost.stdout + lost.stderr and stopped_after < 30, stopped_after
    assert [t.state for t in trials_of(url, "outage")] == [TrialState.RUNNING, TrialState.WAITING]
    time.sleep(3)  # > grace

    rerun = run_cli(*args, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    complete = assert_grid_complete_once(url, spec)
    trials = trials_of(url, "outage")
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    retry = complete[tuple(sorted(trials[0].params.items()))]
    assert retry.user_attrs["retry_of"] == 0 and retry.user_attrs["resumed_from_checkpoint"] is True
    assert retry.user_attrs["epochs_completed"] == max_epochs


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

    result = run_cli("--study", "twin.yaml", "--storage", url, "--results-dir", "results", "--no-progress",
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
    (lambda pg: "postgresql://postgres@127.0.0.1:notaport/db", ("is not valid", "notaport")),
    (lambda pg: "postgresql://postgres@no-such-host.invalid/db", ("cannot reach storage", "no-such-host.invalid")),
    (lambda pg: "mysql://user@127.0.0.1/db", ("needs a database driver that is not installed",)),
    (lambda pg: "nosuchdb://user@127.0.0.1/db", ("unknown database kind", "nosuchdb")),
    (lambda pg: "results/optuna.db", ("is not a URL", "sqlite:///")),
], ids=["missing-database", "unknown-role", "password-redacted", "bad-port", "unknown-host", "missing-driver",
        "unknown-scheme", "not-a-url"])
def test_bad_storage_url_is_one_line_value_error(postgres, url_of_cluster, fragments):
    with pytest.raises(ValueError) as info:
        open_storage(url_of_cluster(postgres))
    message = str(info.value)
    assert "\n" not in message and "s3cret" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_postgres_scheme_is_read_as_postgresql(postgres):
    open_storage(postgres.url().replace("postgresql://", "postgres://")).get_all_studies()


# --- DDP -----------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_train_cli_ddp_on_two_cpu_ranks_prints_one_summary(tmp_path):
    """``--devices 2 --strategy ddp`` on the CPU (gloo): Lightning re-runs the CLI for rank 1; both ranks train
    their half of the data and rank 0 alone prints the --json summary; every process exits 0."""
    result = subprocess.run(
        [sys.executable, "-m", "ablations.train", *TINY_TRAIN, "--accelerator", "cpu", "--devices", "2",
         "--strategy", "ddp", "--json", "--log-dir", "runs", "--run-name", "ddp"],
        cwd=tmp_path, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    assert "MEMBER: 2/2" in result.stderr  # rank 1 joined the process group
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("{")]
    summary = json.loads(line)
    assert summary["epochs_completed"] == 1 and 0.0 <= summary["best_val_acc"] <= 1.0
    assert summary["images_seen"] == TINY_TRAIN_IMAGES // 2  # rank 0's shard of the epoch
    assert summary["log_dir"] == "runs/ddp" and list((tmp_path / "runs" / "ddp").glob("events.out.tfevents.*"))
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_study_trial_on_two_devices_stays_one_optuna_trial(postgres, tmp_path):
    """Trials that ask for 2 devices with strategy ddp run under ddp_spawn (with a warning): the ranks train
    inside the worker's trial, so the study holds exactly one trial per grid point, with the ranks' summary."""
    write_study(tmp_path / "ddp.yaml", base={"accelerator": "cpu", "devices": 2, "strategy": "ddp"},
                variants=TWO_VARIANTS[:1])  # one point: with plain ddp, its two ranks would make two trials
    spec = load_spec(str(tmp_path / "ddp.yaml"))
    url = postgres.create_database("ddp")
    result = run_cli("--study", "ddp.yaml", "--storage", url, "--results-dir", "results", "--threads", "1",
                     "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "each trial runs with strategy 'ddp_spawn'" in result.stderr
    trials = trials_of(url, "ddp")
    assert len(trials) == spec.size == 1
    assert_grid_complete_once(url, spec)
    for t in trials:
        assert t.user_attrs["config"]["strategy"] == "ddp_spawn" and t.user_attrs["config"]["devices"] == 2
        assert t.user_attrs["epochs_completed"] == 1 and t.user_attrs["images_seen"] == TINY_TRAIN_IMAGES // 2
        assert t.value == pytest.approx(t.user_attrs["best_val_acc"])
        assert sorted(t.intermediate_values) == [0]  # reported by rank 0 into the storage


def test_study_refuses_a_multi_device_strategy_that_relaunches_the_script(tmp_path):
    write_study(tmp_path / "fsdp.yaml", base={"accelerator": "cpu", "devices": 2, "strategy": "fsdp"})
    result = run_cli("--study", "fsdp.yaml", "--storage", url_of(tmp_path / "o.db"), cwd=tmp_path)
    assert_one_line_error(result, "strategy 'fsdp' with devices=2 cannot run inside a study", "ddp_spawn")
    assert not (tmp_path / "o.db").exists()
