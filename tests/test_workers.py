"""Independent workers, as on separate machines: several ``python -m ablations.run`` processes (not one CLI with
``--workers N``) on the same study, in SQLite and in PostgreSQL.

Each process enqueues the grid itself and races the others for its points. The tests make the race's outcome
checkable without relying on timing:

- a process counts as *working* once the storage holds a RUNNING trial whose ``worker`` attribute is that
  process (``<host>:<pid>``); the first processes are frozen (SIGSTOP) while they hold one, until the last one
  holds one too, so every process is seen training at least one point;
- the grid is enqueued twice before any process starts: the state two machines leave when they enqueue the same
  grid at the same instant (``skip_if_exists`` cannot see the other's insert). Every second copy must be pruned
  as ``duplicate_of`` its twin, never trained.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import optuna
import pytest
from helpers import (
    LIVE_GRACE_S,
    LIVE_WORKERS,
    STUDY_TEST_MARKS,
    THREE_VARIANTS,
    assert_grid_complete_once,
    assert_resumed_from,
    finish,
    freeze_when,
    mid_run_checkpoint,
    point,
    saved_checkpoint,
    start_cli,
    stop_group,
    storage_unlocked,
    thaw,
    trials_of,
    url_of,
    write_study,
)
from optuna.trial import TrialState

from ablations.studies.spec import load_spec
from ablations.studies.storage import open_storage

pytestmark = [*STUDY_TEST_MARKS, pytest.mark.slow]
PROCESSES = 3
SEEDS = [0, 1]  # x 3 variants: 6 points, more than the 3 processes can hold at once (each is frozen on its first)


def worker_of(proc) -> str:
    return f"{socket.gethostname()}:{proc.pid}"


def running_in(storage, study: str, proc) -> optuna.trial.FrozenTrial | None:
    """The trial ``proc`` is training now (RUNNING, its ``worker`` attribute), or None."""
    try:
        trials = trials_of(storage, study)
    except Exception:  # noqa: BLE001 - no study yet
        return None
    return next((t for t in trials if t.state == TrialState.RUNNING and t.user_attrs.get("worker") == worker_of(proc)),
                None)


def run_name(spec, variant: str, seed: int) -> str:
    return f"{variant}/depth={spec.run_config({'variant': variant, 'seed': seed}).depth}/seed={seed}"


def enqueue_grid_twice(storage, spec) -> None:
    study = optuna.create_study(storage=open_storage(url_of(storage)), study_name=spec.study_name,
                                direction=spec.direction)
    for _ in range(2):
        for params in spec.grid():
            study.enqueue_trial(params)


def start_staggered(args, tmp_path: Path, storage, study: str, logs: list[Path]) -> list:
    """Start the processes one after another; each is frozen while it trains its first point until the next one
    trains too, so that none of them can finish the grid alone. A process is frozen as soon as a new TensorBoard
    event file shows it training (the others are frozen: the file is its), a file check between polls: a storage
    read per poll (about a second on PostgreSQL, which opens the storage as the CLI does) let the first processes
    finish several of the tiny points before the freeze and leave the last one none.
    Frozen, it stays so only if the storage shows it RUNNING a point outside a storage call
    (:func:`storage_unlocked`: frozen inside one, it would hold SQLite's write lock and lock the next process out);
    else it runs on a moment and the check is repeated. Returns them all running."""
    runs = tmp_path / "results" / "runs"

    def event_files() -> int:
        return sum(1 for _ in runs.rglob("events.out.tfevents*")) if runs.is_dir() else 0

    procs = []
    try:
        for i in range(PROCESSES):
            before = event_files()
            with open(logs[i], "w") as log:
                proc = start_cli(*args, cwd=tmp_path, log=log)
            procs.append(proc)
            freeze_when(lambda before=before: event_files() > before, proc, f"process {i} trains a point", logs[i],
                        frozen_check=lambda proc=proc: running_in(storage, study, proc) and storage_unlocked(storage))
        return procs
    except BaseException:
        for proc in procs:
            stop_group(proc)
        raise


def assert_duplicates_resolved(storage, spec) -> None:
    """Every second copy of a point was pruned as a duplicate of the copy that trained, and trained nothing."""
    trials = trials_of(storage, spec.study_name)
    complete = {point(t.params): t for t in trials if t.state == TrialState.COMPLETE}
    duplicates = [t for t in trials if "duplicate_of" in t.user_attrs]
    assert len(duplicates) >= spec.size, [(t.number, t.state, t.user_attrs) for t in trials]
    for t in duplicates:
        assert t.state == TrialState.PRUNED
        twin = trials[t.user_attrs["duplicate_of"]]
        assert twin.params == t.params and twin.number != t.number
        assert "epochs_completed" not in t.user_attrs and "run_name" not in t.user_attrs  # never trained
        assert complete[point(t.params)].state == TrialState.COMPLETE


def test_independent_processes_run_every_point_once_and_each_trains(tmp_path, storage):
    """3 separate CLIs on one grid of 6 points enqueued twice: every point COMPLETE exactly once, every process
    trained at least one point (its ``worker``), every duplicate copy pruned, and all three exit 0."""
    write_study(tmp_path / "shared.yaml", variants=THREE_VARIANTS, axes={"seed": SEEDS})  # 1 epoch (TINY_BASE)
    spec = load_spec(str(tmp_path / "shared.yaml"))
    assert spec.size == 6
    enqueue_grid_twice(storage, spec)
    args = ("--study", "shared.yaml", "--storage", url_of(storage), "--results-dir", "results", "--no-progress",
            "--threads", "1", "--grace", "600")  # the frozen processes must not look dead to the others
    logs = [tmp_path / f"worker{i}.log" for i in range(PROCESSES)]
    procs = start_staggered(args, tmp_path, storage, "shared", logs)
    try:
        for proc in procs:
            thaw(proc)
        results = [finish(proc) for proc in procs]
    finally:
        for proc in procs:
            stop_group(proc)
    for log, result in zip(logs, results, strict=True):
        assert result.returncode == 0, log.read_text()[-3000:]
    complete = assert_grid_complete_once(storage, spec)
    trained_by = {t.user_attrs["worker"] for t in complete.values()}
    assert trained_by == {worker_of(p) for p in procs}, trained_by
    assert_duplicates_resolved(storage, spec)
    assert not [t for t in trials_of(storage, "shared") if t.state in (TrialState.FAIL, TrialState.RUNNING,
                                                                        TrialState.WAITING)]


def test_independent_processes_survive_a_kill_9_of_one_of_them(tmp_path, storage):
    """One process takes the first point (60 epochs) and is SIGKILLed mid-trial (frozen right after the trial
    wrote a checkpoint). Once its heartbeat is stale, two more processes start: the first of them to look fails
    the dead trial and queues its retry; together they run the other 5 points and the retry, which continues the
    dead trial's run folder from its checkpoint. Every point COMPLETE exactly once, both processes exit 0. (If both
    find the dead trial at once, each queues a retry: the later copy is pruned as a duplicate, never trained.)"""
    max_epochs = 60  # long enough that a loaded machine cannot finish it between two polls of the file
    variants = [{**THREE_VARIANTS[0], "overrides": {"max_epochs": max_epochs}}, *THREE_VARIANTS[1:]]
    write_study(tmp_path / "shared.yaml", variants=variants, axes={"seed": SEEDS})  # 1 epoch (TINY_BASE)
    spec = load_spec(str(tmp_path / "shared.yaml"))
    args = ("--study", "shared.yaml", "--storage", url_of(storage), "--results-dir", "results", "--no-progress",
            "--threads", "1", *LIVE_WORKERS)  # the survivors judge each other's live trials: see LIVE_GRACE_S
    logs = [tmp_path / f"worker{i}.log" for i in range(PROCESSES)]
    with open(logs[0], "w") as log:
        victim = start_cli(*args, cwd=tmp_path, log=log)
    others = []
    try:
        last_ckpt = tmp_path / "results" / "runs" / "shared" / run_name(spec, "standard", 0) / "checkpoints" / "last.ckpt"
        # polled on the file alone (a storage read per poll let a loaded machine finish the trial between polls);
        # the storage is read once the process is frozen, and only a checkpoint before the last epochs counts
        def mid_run() -> bool:
            return mid_run_checkpoint(last_ckpt, max_epochs) is not None

        freeze_when(mid_run, victim, "the victim's trial wrote a checkpoint", logs[0],
                    frozen_check=lambda: mid_run() and running_in(storage, "shared", victim))
        saved = saved_checkpoint(last_ckpt)
        dead = running_in(storage, "shared", victim)
        assert dead.number == 0 and dead.params == {"variant": "standard", "seed": 0}
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        time.sleep(LIVE_GRACE_S + 1)  # no heartbeat can come any more: after this the trial is stale for everyone
        for i in (1, 2):
            with open(logs[i], "w") as log:
                others.append(start_cli(*args, cwd=tmp_path, log=log))
        results = [finish(proc) for proc in others]
    finally:
        for proc in (victim, *others):
            stop_group(proc)
    for log, result in zip(logs[1:], results, strict=True):
        assert result.returncode == 0, log.read_text()[-3000:]
    complete = assert_grid_complete_once(storage, spec)
    trials = trials_of(storage, "shared")
    assert trials[0].state == TrialState.FAIL
    # both processes may find the dead trial at the same moment and queue a retry each: the later copy is pruned
    for t in trials[1:]:
        assert t.state == TrialState.COMPLETE or t.user_attrs.get("duplicate_of") is not None, (t.number, t.state)
    retry = complete[point(dead.params)]
    assert retry.user_attrs["retry_of"] == 0 and retry.user_attrs["run_name"] == dead.user_attrs["run_name"]
    assert retry.user_attrs["worker"] in {worker_of(p) for p in others}
    assert {t.user_attrs["worker"] for t in complete.values()} <= {worker_of(p) for p in others}
    assert_resumed_from(retry, saved, max_epochs, tmp_path)
