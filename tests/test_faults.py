"""Faults a study must survive, each produced for real with the CLI in a subprocess (docs/reliability.md lists them
all, with the tests of the other faults): SIGTERM (one process, and ``--workers 2`` with the signal to the process
group or to the main process only), a results folder that fills up or turns read-only mid-trial, a damaged SQLite
storage file, and a study file edited between runs.

Signals and faults are triggered on an observed event (a checkpoint written, a trial RUNNING), never on a timer:
the CLI's process group is frozen (SIGSTOP) while the event still holds, the fault is made, and the group resumes,
so the fault always lands mid-trial however loaded the machine is. The full or read-only disk is a real filesystem:
a small tmpfs mounted in a private mount namespace (``unshare --user --map-root-user --mount``, no root needed where
user namespaces are allowed); the CLI runs inside that namespace (``nsenter``) and the test reaches the tmpfs
through ``/proc/<pid>/root`` of the process holding the namespace.
"""

from __future__ import annotations

import errno
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from helpers import (
    LIVE_WORKERS,
    LONG_TRIAL_EPOCHS,
    STUDY_TEST_MARKS,
    TWO_VARIANTS,
    assert_grid_complete_once,
    assert_one_line_error,
    assert_resumed_from,
    finish,
    freeze_when,
    mid_run_checkpoint,
    one_worker_unless_told,
    run_cli,
    run_dir_name,
    run_in_process,
    saved_checkpoint,
    signal_mid_trial,
    snapshot,
    start_cli,
    stop_group,
    storage_unlocked,
    thaw,
    trial_states,
    trials_of,
    url_of,
    write_study,
)
from optuna.trial import TrialState
from prerequisites import missing

from ablations.studies.spec import load_spec

pytestmark = STUDY_TEST_MARKS

SIGTERM_LINE = "interrupted (SIGTERM): completed trials are kept; rerun the same command to continue"


# --- helpers of this module --------------------------------------------------------------------------------------
def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(module: str, *args, cwd: Path, prefix: tuple = (), env: dict | None = None) -> subprocess.Popen:
    """``python -m MODULE ARGS`` (after ``prefix``, e.g. an nsenter) in a process group of its own, output piped."""
    args = one_worker_unless_told(args) if module == "ablations.run" else [str(a) for a in args]
    return subprocess.Popen([*prefix, sys.executable, "-m", module, *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=_default_sigint, env=env)


def _assert_no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    assert " failed with parameters" not in result.stderr, result.stderr  # optuna's per-trial warning


def _complete_once(storage: Path, spec) -> dict[tuple, optuna.trial.FrozenTrial]:
    """Every grid point of ``spec`` COMPLETE exactly once (trials of points no longer in the file may be COMPLETE
    too); returns the COMPLETE trial per point."""
    found: dict[tuple, list] = {}
    for t in trials_of(storage, spec.study_name):
        if t.state == TrialState.COMPLETE:
            found.setdefault(tuple(sorted(t.params.items())), []).append(t)
    grid = [tuple(sorted(p.items())) for p in spec.grid()]
    assert all(len(found.get(key, [])) == 1 for key in grid), {k: [t.number for t in found.get(k, [])] for k in grid}
    return {key: found[key][0] for key in grid}


def _assert_resumed(retry, original: int, max_epochs: int) -> None:
    attrs = retry.user_attrs
    assert attrs["retry_of"] == original and attrs["resumed_from_checkpoint"] is True, attrs
    assert attrs["epochs_completed"] == max_epochs  # counted on from the checkpoint, not restarted


class SmallDisk:
    """A tmpfs of ``size_mb`` on ``mount_point``, in a mount namespace of its own held by a ``sleep`` process.

    The CLI runs inside the namespace (:meth:`prefix`); the test reads and writes the tmpfs through
    ``/proc/<holder>/root`` (:meth:`outside`). Killing the holder unmounts it: nothing is left behind, even when a
    test fails. The filesystem is real: a full one answers ENOSPC, a read-only one EROFS, to root as well."""

    def __init__(self, mount_point: Path, size_mb: int = 16) -> None:
        if shutil.which("unshare") is None or shutil.which("nsenter") is None:
            missing("util-linux's unshare and nsenter are not installed", "apt-get install util-linux")
        mount_point.mkdir(parents=True, exist_ok=True)
        self.mount_point, self.size = mount_point, size_mb * 2**20
        self.holder = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs -o size="$1"m tmpfs "$0" && echo mounted && exec sleep 3600', str(mount_point),
             str(size_mb)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if self.holder.stdout.readline().strip() != "mounted":
            self.holder.kill()
            reason = (self.holder.stderr.read().strip().splitlines() or ["no output"])[-1]
            self.holder.wait()
            missing(f"cannot mount a tmpfs in a user + mount namespace here ({reason})",
                    "a kernel that allows unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
                    "user.max_user_namespaces > 0; a container needs them allowed by its runtime)")
        stats = os.statvfs(self.outside(mount_point))
        assert stats.f_blocks * stats.f_frsize <= self.size, "not the small tmpfs"  # never fill a real disk

    def outside(self, path: Path) -> Path:
        """``path`` (absolute, as the CLI sees it) as the test reaches it."""
        return Path(f"/proc/{self.holder.pid}/root") / Path(path).relative_to("/")

    def nsenter(self) -> tuple:
        return ("nsenter", f"--target={self.holder.pid}", "--user", "--mount", "--preserve-credentials", "--")

    def prefix(self, cwd: Path) -> tuple:
        """Command prefix that runs a command inside the namespace, in ``cwd`` (nsenter leaves the working
        directory at the namespace's root: ``cd`` again inside it)."""
        return (*self.nsenter(), "sh", "-c", 'cd "$0" && exec "$@"', str(cwd))

    def fill(self) -> Path:
        """Write a file until the disk answers ENOSPC; returns the file (remove it to free the space)."""
        filler = self.outside(self.mount_point) / "filler"
        chunk = b"\0" * 65536
        with open(filler, "wb", buffering=0) as f:
            for _ in range(self.size // len(chunk) + 2):
                try:
                    f.write(chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    return filler
        raise AssertionError("the disk never filled up")

    def remount(self, mode: str, busy_ok: bool = False) -> bool:
        """``ro`` or ``rw``: the mount turns read-only (or writable again) under the running CLI. False (with
        ``busy_ok``) when a file on it is open for writing at this moment, which the kernel refuses with EBUSY."""
        done = subprocess.run([*self.nsenter(), "mount", "-o", f"remount,bind,{mode}", str(self.mount_point)],
                              capture_output=True, text=True)
        if done.returncode != 0 and not (busy_ok and "busy" in done.stderr.lower()):
            raise AssertionError(f"remount {mode} failed: {done.stderr}")
        return done.returncode == 0

    def remove(self) -> None:
        self.holder.kill()
        self.holder.wait()


@pytest.fixture
def small_disk(tmp_path):
    disk = SmallDisk(tmp_path / "results")
    yield disk
    disk.remove()


# --- (a) SIGTERM, the scheduler's stop signal, is handled like Ctrl-C ---------------------------------------------
@pytest.mark.slow
def test_sigterm_mid_trial_exits_143_keeps_completed_trials_and_the_rerun_resumes(tmp_path, storage):
    """SIGTERM to the process group (SLURM, Kubernetes, systemd) while trial 1 trains, after trial 0 completed:
    exit 143 with one line and no traceback, trial 1 FAILs with its checkpoint kept (Lightning's own SIGTERM handler
    runs first during fit, then the CLI's), trial 0 stays as it was; the rerun retries trial 1 from its checkpoint.
    On SQLite and on PostgreSQL (the signal may land inside a storage call of either driver)."""
    max_epochs = LONG_TRIAL_EPOCHS
    write_study(tmp_path / "term.yaml", base={"max_epochs": max_epochs}, variants=[
        {"label": "short", "residual": "standard", "overrides": {"max_epochs": 1}},
        {"label": "long", "residual": "layerscale"}])
    spec = load_spec(str(tmp_path / "term.yaml"))
    db = storage
    args = ("--study", "term.yaml", "--storage", url_of(db), "--results-dir", "results", "--no-progress")
    last_ckpt = tmp_path / "results" / "runs" / "term" / run_dir_name(spec, "long") / "checkpoints" / "last.ckpt"

    stopped = signal_mid_trial(args, tmp_path, lambda: mid_run_checkpoint(last_ckpt, max_epochs), signal.SIGTERM,
                               "trial 1 saved a checkpoint")  # trial 1's checkpoint: trial 0 is COMPLETE
    assert stopped.returncode == 143, stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == SIGTERM_LINE
    _assert_no_traceback(stopped)
    before = trials_of(db, "term")
    assert [t.state for t in before] == [TrialState.COMPLETE, TrialState.FAIL]
    assert before[0].datetime_complete < before[1].datetime_start and before[1].user_attrs["stopped_by"] == "SIGTERM"
    saved = saved_checkpoint(last_ckpt)
    assert 1 <= len(before[1].intermediate_values) < max_epochs and saved is not None

    rerun = run_cli(*args, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert "retrying failed trial(s) 1" in rerun.stderr
    complete = assert_grid_complete_once(db, spec)
    after = trials_of(db, "term")
    assert snapshot(after[:2]) == snapshot(before)  # the completed and the interrupted trial are untouched
    retry = complete[(("variant", "long"),)]
    assert retry.user_attrs["retry_of"] == 1
    assert_resumed_from(retry, saved, max_epochs, tmp_path)


@pytest.mark.slow
def test_a_time_budget_stops_the_study_cleanly_and_the_rerun_continues_it(tmp_path):
    """``--time-budget 10`` on a study whose one trial trains far longer (1,000 epochs, about 40 s on a 2-core CPU):
    at 10 s the CLI stops itself as SIGTERM
    would (exit 143, the budget's line, no traceback, no trial left RUNNING); the same command without the budget
    then completes the study, resuming the stopped trial from the checkpoint it kept. (A budget is a timer, so on a
    machine slow enough to spend the 10 s starting up, the stop comes before the first checkpoint and the rerun
    trains the trial from its start.)"""
    max_epochs = 1000
    write_study(tmp_path / "budget.yaml", base={"max_epochs": max_epochs}, variants=[
        {"label": "long", "residual": "standard"}])
    spec = load_spec(str(tmp_path / "budget.yaml"))
    db = tmp_path / "budget.db"
    args = ("--study", "budget.yaml", "--storage", url_of(db), "--results-dir", "results", "--no-progress")
    last_ckpt = tmp_path / "results" / "runs" / "budget" / run_dir_name(spec, "long") / "checkpoints" / "last.ckpt"

    stopped = run_cli(*args, "--time-budget", "10", cwd=tmp_path)
    assert stopped.returncode == 143, stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == ("time budget of 10 s reached: completed trials are kept; "
                                                       "rerun the same command to continue")
    _assert_no_traceback(stopped)
    before = trials_of(db, "budget") if db.exists() else []
    assert all(t.state == TrialState.FAIL and t.user_attrs["stopped_by"] == "SIGTERM" for t in before), before
    saved = saved_checkpoint(last_ckpt)

    rerun = run_cli(*args, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    retry = assert_grid_complete_once(db, spec)[(("variant", "long"),)]
    assert retry.user_attrs["epochs_completed"] == max_epochs
    if saved is not None:
        assert_resumed_from(retry, saved, max_epochs, tmp_path)


FINALIZER_SCRIPT = """
import os, signal, sys, time
from ablations.studies import stopping

stopping.stop_on_signals()

class Finalized:
    def __del__(self):  # the signal arrives while garbage is being collected
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)

try:
    Finalized()
    deadline = time.monotonic() + 300  # a hang limit: the signal is delivered again 0.05 s after the finalizer
    while time.monotonic() < deadline:
        pass
except KeyboardInterrupt:
    sys.exit(stopping.interrupted())
print("the signal was lost")
"""


def test_a_stop_signal_that_lands_in_a_finalizer_still_stops_the_process():
    """A KeyboardInterrupt raised inside a ``__del__`` is only printed by Python ("Exception ignored in ..."), and
    the process runs on (seen with Lightning's ``Profiler.__del__`` in a worker). The CLI delivers the signal again
    once the finalizer is done: the process stops with its one line and status 143."""
    result = subprocess.run([sys.executable, "-c", FINALIZER_SCRIPT], capture_output=True, text=True, timeout=600)
    assert result.returncode == 143, result.stdout + result.stderr
    assert result.stderr.strip() == SIGTERM_LINE and result.stdout == ""


WORKER_SCRIPT = """
import signal, sys, time
from ablations.studies import stopping

if sys.argv[1] == "ignores":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    stopping.stop_on_signals()
try:  # "ready" inside the try: the signal may come as soon as it is read, while the print is still returning
    print("ready", flush=True)
    time.sleep(3600)
except KeyboardInterrupt:
    print("stopped by", signal.Signals(stopping.stop_signal()).name, flush=True)
    sys.exit(stopping.interrupted())
"""


def test_the_main_process_passes_a_stop_signal_on_to_its_workers_and_kills_one_that_ignores_it(monkeypatch):
    """The fast check of the ``--workers N`` stop (the end-to-end runs below are in the slow tier): the main
    process's ``_stop_workers`` sends SIGTERM to every worker still running and waits for them; each stops with its
    one line and status 143. A worker that ignores the signal is killed once ``WORKER_STOP_S`` has passed (it can
    end no other way: it sleeps for an hour)."""
    from ablations.run import workers as run

    def start(kind: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, kind], text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdout.readline().strip() == "ready"  # its handlers are installed
        return proc

    workers = [start("stops"), start("stops")]
    try:
        run._stop_workers(workers)
        outputs = [(p.returncode, p.stdout.read().strip(), p.stderr.read().strip()) for p in workers]
    finally:
        for p in workers:
            p.kill()
            p.wait()
    assert outputs == [(143, "stopped by SIGTERM", SIGTERM_LINE)] * 2, outputs

    monkeypatch.setattr(run, "WORKER_STOP_S", 0.1)
    stubborn = start("ignores")
    try:
        run._stop_workers([stubborn])
        assert stubborn.returncode == -signal.SIGKILL
    finally:
        stubborn.kill()
        stubborn.wait()


def test_the_main_process_fails_the_trials_its_stopped_workers_left_running(tmp_path, capsys):
    """The fast check of the main process's clean-up after Ctrl-C / SIGTERM (the slow tier kills a stuck worker
    end to end): once its workers have ended, a trial that one of them left RUNNING (``worker`` = this host and
    that pid) is marked FAIL with ``stopped_by``, so the rerun retries it at once; a RUNNING trial of a worker on
    another machine or of another process of this one, and a finished trial, are left as they are."""
    from ablations.run import workers as run
    from ablations.run.objective import worker_id
    from ablations.studies.storage import open_storage

    storage = open_storage(url_of(tmp_path / "o.db"))
    study = optuna.create_study(study_name="s", storage=storage)
    owners = {"ours": worker_id(4242), "other host": "elsewhere:4242", "other pid": worker_id(4343)}
    for owner in owners.values():
        trial = study.ask()
        trial.set_user_attr("worker", owner)
    done = study.ask()
    done.set_user_attr("worker", owners["ours"])
    study.tell(done, 1.0)

    run._fail_left_running([SimpleNamespace(pid=4242)], storage, "s")
    trials = study.get_trials(deepcopy=False)
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING, TrialState.COMPLETE]
    assert trials[0].user_attrs["stopped_by"] == "SIGINT"  # no signal came in this test: Ctrl-C is the default
    assert "stopped_by" not in trials[1].user_attrs and "stopped_by" not in trials[3].user_attrs
    assert capsys.readouterr().err.splitlines() == [
        f"trial(s) 0: left running by a worker that ended without marking it failed (killed {run.WORKER_STOP_S} s "
        "after the signal, or gone before it); marked failed here (checkpoints kept: the rerun resumes it)"]

    run._fail_left_running([SimpleNamespace(pid=4242)], storage, "s")  # nothing left: nothing done, nothing said
    assert capsys.readouterr().err == ""


def test_a_retry_does_not_inherit_the_worker_of_the_attempt_it_retries(tmp_path):
    """The retry callback of the study's storage copies a failed trial's user attrs but ``worker``: a retry that
    another process claims must not name the dead attempt's worker, or the main process of that worker would fail
    it as one its stopped workers left running."""
    from ablations.run import workers as run
    from ablations.run.objective import worker_id
    from ablations.studies.storage import open_storage

    storage = open_storage(url_of(tmp_path / "o.db"))
    study = optuna.create_study(study_name="s", storage=storage)
    trial = study.ask({"x": optuna.distributions.IntDistribution(0, 3)})
    trial.set_user_attr("worker", worker_id(4242))
    trial.set_user_attr("run_name", "standard/seed=0")
    study.tell(trial, state=TrialState.FAIL)
    storage.get_heartbeat_stale_trial_callback()(study, study.trials[0])
    retry = study.trials[1]
    assert retry.state == TrialState.WAITING and retry.system_attrs["failed_trial"] == 0
    assert retry.user_attrs == {"run_name": "standard/seed=0"} and retry.params == {"x": trial.params["x"]}
    claimed = study.ask()  # another process takes the retry; until it sets its own worker, it names none
    assert claimed.number == 1 and "worker" not in claimed.user_attrs
    run._fail_left_running([SimpleNamespace(pid=4242)], storage, "s")
    assert study.trials[1].state == TrialState.RUNNING
    # a DDP rank unpickles the storage, and the callback with it
    again = pickle.loads(pickle.dumps(storage))
    assert type(again.get_heartbeat_stale_trial_callback()) is type(storage.get_heartbeat_stale_trial_callback())


def _live_workers(pid: int) -> list[int]:
    """The worker processes of the CLI ``pid`` still running (not yet exited; an exited one stays listed as a zombie
    until the main process reaps it)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    live = []
    for child in map(int, children):
        try:
            state = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            live.append(child)
    return live


#: The two-worker SIGTERM tests' trial states while both workers train a long trial.
BOTH_LONG_RUNNING = {0: TrialState.COMPLETE, 1: TrialState.COMPLETE, 2: TrialState.RUNNING, 3: TrialState.RUNNING}


def _two_worker_study(tmp_path: Path, max_epochs: int, long_a: int | None = None, long_b: int | None = None):
    """The two-worker SIGTERM tests' study ``workers``: trials 0 and 1 train one epoch, trials 2 (``long_a``) and 3
    (``long_b``) ``max_epochs`` unless given. Returns the spec, the SQLite file and the long trials' last.ckpt."""
    def long(label: str, residual: str, epochs: int | None) -> dict:
        return {"label": label, "residual": residual, **({"overrides": {"max_epochs": epochs}} if epochs else {})}

    write_study(tmp_path / "workers.yaml", base={"max_epochs": max_epochs}, variants=[
        {"label": "short_a", "residual": "standard", "overrides": {"max_epochs": 1}},
        {"label": "short_b", "residual": "rezero", "overrides": {"max_epochs": 1}},
        long("long_a", "layerscale", long_a), long("long_b", "skipinit", long_b)])
    spec = load_spec(str(tmp_path / "workers.yaml"))
    runs = tmp_path / "results" / "runs" / "workers"
    return spec, tmp_path / "o.db", [runs / run_dir_name(spec, label) / "checkpoints" / "last.ckpt"
                                     for label in ("long_a", "long_b")]


def _finish_timed(proc: subprocess.Popen) -> tuple[subprocess.CompletedProcess, float]:
    """The stopped CLI's result and the seconds it took to end, from now (its workers just thawed)."""
    started = time.monotonic()
    stopped = finish(proc, timeout=600)
    return stopped, time.monotonic() - started


def _why(stopped: subprocess.CompletedProcess, stop_s: float, trials) -> str:
    """An assertion message: the exit, the stop's duration, the trials' timeline and the end of stderr; a string,
    so that pytest shows it whole (it shortens the repr of anything else)."""
    timeline = "\n".join(f"trial {t.number} {t.state.name} {t.params['variant']} {t.datetime_start} -> "
                         f"{t.datetime_complete} worker {t.user_attrs.get('worker')} stopped_by "
                         f"{t.user_attrs.get('stopped_by')}" for t in trials)
    return f"exit {stopped.returncode} {stop_s:.1f} s after the signal\n{timeline}\nstderr:\n{stopped.stderr[-4000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("to", ["process group", "main process", "one worker", "the last worker"])
def test_sigterm_with_two_workers_fails_the_running_trials_with_their_checkpoints_and_they_resume(tmp_path, to):
    """``--workers 2``: trials 0 and 1 (one epoch) completed, each worker trains a long trial (2 and 3) past its
    first checkpoint. SIGTERM goes to

    - the whole process group (SLURM signals every process of the job): both trials FAIL with their checkpoints
      kept, the main process waits for its workers and exits 143, and the rerun resumes both;
    - the main process only (Kubernetes signals the container's first process): it passes the signal on to its
      workers, and the same follows;
    - one worker only (one of many machines preempted): its trial FAILs, and the study completes (exit 0) without a
      rerun: the other worker takes the stopped trial over from its checkpoint once its own is done or, when it had
      already left (nothing was waiting), the main process starts a worker for it;
    - the last worker (trial 2 is short here: the worker that trained it found nothing waiting and left): the main
      process starts a worker for the stopped trial, which resumes it, and the study completes (exit 0). In CI the
      stopped worker once took two minutes to mark its trial failed, the other left meanwhile, and the study ended
      with one trial failed and exit 1."""
    # the workers start their long trials a second or so apart, and the signal must land while both still train:
    # 2 x LONG_TRIAL_EPOCHS tiny epochs took ~2 s here, within reach of the main process's storage calls (a
    # signal that lands in one is held until it returns), so the long trials are twice that long
    max_epochs = 4 * LONG_TRIAL_EPOCHS
    last = to == "the last worker"
    long_b_epochs = 2 * max_epochs if last else max_epochs  # it outlasts the short trial 2 by seconds
    spec, db, ckpts = _two_worker_study(tmp_path, max_epochs, *((2, long_b_epochs) if last else ()))
    args = ("--study", "workers.yaml", "--workers", "2", "--storage", url_of(db), "--results-dir", "results",
            "--no-progress", *LIVE_WORKERS)
    expected = dict(BOTH_LONG_RUNNING)

    proc = start_cli(*args, cwd=tmp_path)
    try:
        if last:
            expected[2] = TrialState.COMPLETE
            freeze_when(lambda: trial_states(db, "workers") == expected and saved_checkpoint(ckpts[1])
                        and len(_live_workers(proc.pid)) == 1, proc, "trial 2's worker left, trial 3 checkpointed")
        else:
            freeze_when(lambda: trial_states(db, "workers") == expected and all(map(saved_checkpoint, ckpts)), proc,
                        "both long trials saved a checkpoint")
        if to == "process group":
            os.killpg(proc.pid, signal.SIGTERM)
        elif to == "main process":
            os.kill(proc.pid, signal.SIGTERM)
        else:
            workers = _live_workers(proc.pid)
            assert len(workers) == (1 if last else 2)
            os.kill(workers[0], signal.SIGTERM)
        thaw(proc)
        stopped, stop_s = _finish_timed(proc)
    finally:
        stop_group(proc)
    _assert_no_traceback(stopped)
    trials = trials_of(db, "workers")
    why = _why(stopped, stop_s, trials)
    assert [t.state for t in trials[:2]] == [TrialState.COMPLETE] * 2
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert all(t.user_attrs["stopped_by"] == "SIGTERM" for t in failed), why

    if to in ("one worker", "the last worker"):
        assert stopped.returncode == 0, why
        assert SIGTERM_LINE in stopped.stderr.splitlines()  # the stopped worker's line
        assert len(failed) == 1 and failed[0].number in ((3,) if last else (2, 3)), why
        assert f"retrying failed trial(s) {failed[0].number} (same parameters)" in stopped.stderr
    else:
        assert stopped.returncode == 143, why
        assert stopped.stderr.strip().splitlines()[-1] == SIGTERM_LINE, why
        assert [t.number for t in failed] == [2, 3] and len(trials) == 4, why
        assert all(map(saved_checkpoint, ckpts))
        rerun = run_cli(*args, cwd=tmp_path)
        assert rerun.returncode == 0, rerun.stderr
        assert snapshot(trials_of(db, "workers")[:4]) == snapshot(trials)  # nothing finished was touched
    complete = assert_grid_complete_once(db, spec)
    for interrupted in failed:
        epochs = long_b_epochs if interrupted.params["variant"] == "long_b" else max_epochs
        _assert_resumed(complete[(("variant", interrupted.params["variant"]),)], interrupted.number, epochs)


@pytest.mark.slow
def test_a_worker_that_does_not_stop_in_time_is_killed_and_the_main_process_fails_its_trial(tmp_path):
    """``--workers 2``, SIGTERM to the main process while one worker cannot answer it (frozen by SIGSTOP: a worker
    stuck where the signal does not reach it; in CI a stopped worker once took two minutes to mark its trial
    failed). The main process passes the signal on; the other worker fails its trial and leaves; after
    WORKER_STOP_S the main process kills the stuck worker and marks its trial failed itself, with one line, so
    that the rerun resumes it at once from its checkpoint (not after the heartbeat's grace) and exits 0."""
    from ablations.run.workers import WORKER_STOP_S

    max_epochs = 4 * LONG_TRIAL_EPOCHS
    spec, db, ckpts = _two_worker_study(tmp_path, max_epochs)
    # a grace far beyond the test: only the main process's own marking can fail the stuck worker's trial in time
    args = ("--study", "workers.yaml", "--workers", "2", "--storage", url_of(db), "--results-dir", "results",
            "--no-progress", "--heartbeat", "1", "--grace", "3600")

    proc = start_cli(*args, cwd=tmp_path)
    try:
        freeze_when(lambda: trial_states(db, "workers") == BOTH_LONG_RUNNING and all(map(saved_checkpoint, ckpts))
                    and storage_unlocked(db), proc, "both long trials saved a checkpoint, the storage unlocked")
        stuck, other = _live_workers(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)
        for pid in (proc.pid, other):  # the stuck worker stays frozen
            os.kill(pid, signal.SIGCONT)
        stopped, stop_s = _finish_timed(proc)
    finally:
        stop_group(proc)
    _assert_no_traceback(stopped)
    trials = trials_of(db, "workers")
    by_worker = {t.user_attrs.get("worker", "").rsplit(":", 1)[-1]: t.number for t in trials[2:]}
    why = f"stuck worker {stuck}; " + _why(stopped, stop_s, trials)
    assert stopped.returncode == 143, why
    assert stop_s >= WORKER_STOP_S, why  # the main process waited for the stuck worker before it killed it
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL] * 2, why
    assert all(t.user_attrs["stopped_by"] == "SIGTERM" for t in trials[2:]), why
    killed = by_worker[str(stuck)]
    assert (f"trial(s) {killed}: left running by a worker that ended without marking it failed (killed "
            f"{WORKER_STOP_S} s after the signal, or gone before it); marked failed here (checkpoints kept: the rerun "
            "resumes it)") in stopped.stderr.splitlines(), why
    assert stopped.stderr.strip().splitlines()[-1] == SIGTERM_LINE, why
    assert all(map(saved_checkpoint, ckpts))

    rerun = run_cli(*args, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert "retrying failed trial(s) 2, 3 (same parameters)" in rerun.stderr, rerun.stderr
    assert snapshot(trials_of(db, "workers")[:4]) == snapshot(trials)  # nothing finished was touched
    complete = assert_grid_complete_once(db, spec)
    for interrupted in trials[2:]:
        _assert_resumed(complete[(("variant", interrupted.params["variant"]),)], interrupted.number, max_epochs)


# --- (b) the results folder fills up or turns read-only mid-study --------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("fault", ["disk full", "read-only"])
def test_results_folder_full_or_read_only_mid_trial_fails_it_with_one_line_and_the_rerun_finishes(
        tmp_path, small_disk, monkeypatch, fault):
    """results/ is a 16 MB tmpfs; the storage is beside it. Trial 0 completes, trial 1 saves a checkpoint, then the
    disk is filled to the last byte (TMPDIR on the same disk, as where /tmp and the results share the root disk:
    Lightning writes a checkpoint to a temporary file and renames it into place) or remounted read-only. Trial 1
    FAILs and the CLI stops with one line naming the trial's folder and the OS error; trial 0 stays COMPLETE. Once
    space is freed (the mount is writable again), the rerun retries trial 1 from its intact checkpoint."""
    max_epochs = LONG_TRIAL_EPOCHS
    write_study(tmp_path / "disk.yaml", base={"max_epochs": max_epochs}, variants=[
        {"label": "short", "residual": "standard", "overrides": {"max_epochs": 1}},
        {"label": "long", "residual": "layerscale"}])
    spec = load_spec(str(tmp_path / "disk.yaml"))
    db = tmp_path / "o.db"  # not on the small disk: the storage must record what happened
    args = ("--study", "disk.yaml", "--storage", url_of(db), "--results-dir", "results", "--no-progress")
    run_dir = Path("results") / "runs" / "disk" / run_dir_name(spec, "long")
    last_ckpt = small_disk.outside(tmp_path / run_dir / "checkpoints" / "last.ckpt")
    error = {"disk full": "[Errno 28] No space left on device", "read-only": "[Errno 30] Read-only file system"}[fault]
    if fault == "disk full":
        (small_disk.outside(small_disk.mount_point) / "tmp").mkdir()
        monkeypatch.setenv("TMPDIR", str(small_disk.mount_point / "tmp"))

    proc = _start("ablations.run", *args, cwd=tmp_path, prefix=small_disk.prefix(tmp_path))
    try:
        while True:
            freeze_when(lambda: trial_states(db, "disk") == {0: TrialState.COMPLETE, 1: TrialState.RUNNING}
                         and saved_checkpoint(last_ckpt), proc, "trial 1 saved a checkpoint")
            if fault == "disk full":
                filler = small_disk.fill()
                break
            if small_disk.remount("ro", busy_ok=True):
                break
            thaw(proc)  # frozen in the middle of a write (the mount is busy): try again at the next moment
        thaw(proc)
        failed = finish(proc, timeout=300)
    finally:
        stop_group(proc)
    lines = failed.stderr.strip().splitlines()
    assert failed.returncode == 1, failed.stderr
    assert lines[-1].startswith(f"error: trial 1 cannot write its files in '{run_dir}': "), failed.stderr
    assert error in lines[-1] and "rerun the same command" in lines[-1]
    assert [line for line in lines if line.startswith("error:")] == lines[-1:]
    _assert_no_traceback(failed)
    before = trials_of(db, "disk")
    assert [t.state for t in before] == [TrialState.COMPLETE, TrialState.FAIL]
    assert saved_checkpoint(last_ckpt)  # the write that failed did not damage the last checkpoint

    if fault == "disk full":
        filler.unlink()
    else:
        small_disk.remount("rw")
    rerun = finish(_start("ablations.run", *args, cwd=tmp_path, prefix=small_disk.prefix(tmp_path)))
    assert rerun.returncode == 0, rerun.stderr
    assert "retrying failed trial(s) 1" in rerun.stderr
    complete = assert_grid_complete_once(db, spec)
    assert snapshot(trials_of(db, "disk")[:2]) == snapshot(before)
    _assert_resumed(complete[(("variant", "long"),)], 1, max_epochs)


@pytest.mark.parametrize("error, expected", [
    (OSError(errno.ENOSPC, "No space left on device", "runs/x/checkpoints/last.ckpt.tmp"),
     "[Errno 28] No space left on device: 'runs/x/checkpoints/last.ckpt.tmp'"),
    (OSError(errno.EROFS, "Read-only file system", "runs/x/events"), "[Errno 30] Read-only file system: 'runs/x/events'"),
    (OSError(errno.EACCES, "Permission denied", "runs/x/events"), "[Errno 13] Permission denied: 'runs/x/events'"),
    (OSError(errno.EACCES, "Permission denied", "/elsewhere/data.npz"), None),  # not the results folder
    (ValueError("a bug of the trial's own"), None),
], ids=["disk full", "read-only", "no permission inside", "no permission elsewhere", "other error"])
def test_a_results_folder_that_takes_no_more_writes_fails_the_trial_with_one_line(tmp_path, monkeypatch, error,
                                                                                 expected):
    """The fast check of the disk faults (the real full and read-only tmpfs runs are in the slow tier): an OS
    error that says the results folder takes no more writes, wherever it is in the exception chain, becomes the
    trial's one-line ``ResultsWriteError`` naming its folder; any other error is the trial's own and is raised as
    it is."""
    from ablations.run import workers as run

    monkeypatch.chdir(tmp_path)
    log_root = Path("runs")
    trial = SimpleNamespace(number=7, user_attrs={"log_dir": "runs/x"}, set_user_attr=lambda *a: None)

    def objective(_trial):
        try:
            raise error
        except Exception as exc:
            raise RuntimeError("Lightning wrapped it") from exc

    guarded = run._guarded(objective, log_root)
    if expected is None:
        with pytest.raises(RuntimeError, match="Lightning wrapped it"):
            guarded(trial)
        return
    with pytest.raises(run.ResultsWriteError) as info:
        guarded(trial)
    assert str(info.value) == (
        f"trial 7 cannot write its files in 'runs/x': {expected}; the trial is marked failed and completed trials "
        "are kept: free space or make the folder writable, then rerun the same command (the trial resumes from its "
        "last checkpoint)")


# --- (c) a damaged SQLite storage file ---------------------------------------------------------------------------
def _real_storage(path: Path) -> None:
    """A SQLite storage holding a study with 40 finished trials (a few hundred KB, many pages)."""
    study = optuna.create_study(storage=url_of(path), study_name="tiny", direction="maximize")
    dist = {"variant": optuna.distributions.CategoricalDistribution(["standard", "rezero"])}
    for i in range(40):
        study.add_trial(optuna.trial.create_trial(params={"variant": ["standard", "rezero"][i % 2]},
                                                  distributions=dist, value=0.5, user_attrs={"pad": "x" * 2000}))


DAMAGE = {
    "garbage": "random bytes where the database should be",
    "truncated": "a real storage cut to 60 % of its size",
    "overwritten_page": "a real storage with its third page overwritten by random bytes",
}


#: The damage that ``ablations.run`` and ``ablations.report`` meet as real processes (side by side: exit status and
#: stderr of a fresh process); on the others each tool's ``main`` runs in this process (the same code, no imports).
DAMAGE_IN_A_PROCESS = "garbage"


@pytest.fixture(scope="module")
def damaged_storages(tmp_path_factory):
    """Each damaged file, with ``ablations.run`` and ``ablations.report`` run on it."""
    from ablations.report.cli import main as report_main

    root = tmp_path_factory.mktemp("damaged")
    write_study(root / "tiny.yaml")
    rng = random.Random(0)
    _real_storage(root / "real.db")
    real = (root / "real.db").read_bytes()
    contents = {"garbage": rng.randbytes(64 * 1024), "truncated": real[:len(real) * 6 // 10],
                "overwritten_page": real[:8192] + rng.randbytes(4096) + real[12288:]}
    for name, data in contents.items():
        (root / f"{name}.db").write_bytes(data)
    def args(name: str, tool: str) -> tuple:
        return ("--study", "tiny.yaml", "--storage", f"sqlite:///{name}.db", "--results-dir", "results",
                "--no-progress" if tool == "run" else "--no-figures")

    procs = {}
    try:
        for tool in ("run", "report"):
            procs[DAMAGE_IN_A_PROCESS, tool] = _start(f"ablations.{tool}", *args(DAMAGE_IN_A_PROCESS, tool), cwd=root)
        results = {key: finish(proc) for key, proc in procs.items()}
    finally:
        for proc in procs.values():
            stop_group(proc)
    for name in contents.keys() - {DAMAGE_IN_A_PROCESS}:
        results[name, "run"] = run_in_process(*args(name, "run"), cwd=root)
        results[name, "report"] = run_in_process(*args(name, "report"), cwd=root, main=report_main)
    return SimpleNamespace(root=root, contents=contents, results=results)


@pytest.mark.parametrize("tool", ["run", "report"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_damaged_sqlite_storage_is_one_line_exit_2_and_left_byte_for_byte(damaged_storages, damage, tool):
    result = damaged_storages.results[damage, tool]
    assert_one_line_error(result, f"storage file '{damage}.db' is not a usable SQLite database",
                          "it was left as it is", status=2)
    assert (damaged_storages.root / f"{damage}.db").read_bytes() == damaged_storages.contents[damage]
    assert sorted(p.name for p in damaged_storages.root.glob(f"{damage}.db*")) == [f"{damage}.db"]  # no journal
    assert not (damaged_storages.root / "results").exists()  # nothing ran, nothing was written


# --- (d) the study file edited between runs ----------------------------------------------------------------------
@pytest.mark.slow
def test_edited_study_file_runs_only_new_points_and_keeps_removed_points_trials(tmp_path):
    """Seeds [0, 1] run (trials 0-3). The file then says seeds [1, 2]: the rerun runs only the two seed-2 points;
    the seed-0 trials stay COMPLETE in the storage (the CLI says so) and the report, which includes them, works.
    A WAITING trial of a point no longer in the file (a seed-7 point enqueued by an earlier file, never run) is
    set aside, not run; when seed 7 comes back to the file, its points run."""
    path = tmp_path / "edit.yaml"
    db = tmp_path / "o.db"
    args = ("--study", "edit.yaml", "--storage", url_of(db), "--results-dir", "results", "--no-progress")

    write_study(path, variants=TWO_VARIANTS, axes={"seed": [0, 1]})
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    done = trials_of(db, "edit")
    assert len(done) == 4 and all(t.state == TrialState.COMPLETE for t in done)

    write_study(path, variants=TWO_VARIANTS, axes={"seed": [1, 2]})
    second = run_cli(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    _assert_no_traceback(second)
    assert "2 completed trial(s) of grid points no longer in the study file stay in the storage" in second.stderr
    complete = _complete_once(db, load_spec(str(path)))
    trials = trials_of(db, "edit")
    assert snapshot(trials[:4]) == snapshot(done)  # nothing lost, nothing rerun
    assert len(trials) == 6 and sorted(t.params["seed"] for t in trials[4:]) == [2, 2]
    assert {complete[k].number for k in complete} == {2, 3, 4, 5}  # seed-major: trial 2 is seed 1's first

    report = finish(_start("ablations.report", "--study", "edit.yaml", "--storage", url_of(db), "--results-dir",
                           "results", "--no-figures", "--no-tensorboard", "--no-note", cwd=tmp_path))
    assert report.returncode == 0, report.stderr
    runs = (tmp_path / "results" / "edit" / "runs.csv").read_text().splitlines()
    assert len(runs) == 1 + 6  # header + every completed trial, the removed seed 0 included

    study = optuna.load_study(study_name="edit", storage=url_of(db))
    study.enqueue_trial({"variant": "standard", "seed": 7})  # left WAITING by an earlier version of the file
    third = run_cli(*args, cwd=tmp_path)
    assert third.returncode == 0, third.stderr
    assert "not running waiting trial(s) 6: their grid points are no longer in the study file" in third.stderr
    after_third = trials_of(db, "edit")
    assert len(after_third) == 7 and snapshot(after_third[:6]) == snapshot(trials)  # nothing else ran
    set_aside = after_third[6]
    assert set_aside.state == TrialState.PRUNED and set_aside.user_attrs["removed_from_study_file"] is True

    write_study(path, variants=TWO_VARIANTS, axes={"seed": [1, 2, 7]})
    fourth = run_cli(*args, cwd=tmp_path)
    assert fourth.returncode == 0, fourth.stderr
    _complete_once(db, load_spec(str(path)))
    trials = trials_of(db, "edit")
    assert snapshot(trials[:7]) == snapshot(after_third)
    assert sorted((t.params["variant"], t.params["seed"]) for t in trials[7:]) == [("rezero", 7), ("standard", 7)]


def test_study_file_edits_that_cannot_continue_the_stored_study_are_refused_up_front(tmp_path):
    """What an edited file can and cannot do to a stored study, checked before anything is written: new values of
    a numeric axis continue it; a changed variant list, or an axis that changes kind (a float axis turning
    log-scaled), cannot (optuna fixes a parameter's kind and a categorical's choices): one-line ValueError."""
    from ablations.run.objective import suggest
    from ablations.run.study import check_same_choices

    def stored(axes: dict, variants=TWO_VARIANTS):
        write_study(tmp_path / "s.yaml", variants=variants, axes=axes)
        spec = load_spec(str(tmp_path / "s.yaml"))
        study = optuna.create_study(direction="maximize", study_name="s")
        for params in spec.grid():
            study.enqueue_trial(params)
            trial = study.ask()
            suggest(trial, spec)
            study.tell(trial, 0.5)
        return study

    def spec_with(axes: dict, variants=TWO_VARIANTS):
        write_study(tmp_path / "s.yaml", variants=variants, axes=axes)
        return load_spec(str(tmp_path / "s.yaml"))

    study = stored({"seed": [0, 1], "lr": [0.001, 0.002]})
    check_same_choices(study, spec_with({"seed": [0, 1, 2, 5], "lr": [0.001, 0.002, 0.004]}))  # continues
    with pytest.raises(ValueError, match=r"run with variant = \['standard', 'rezero'\], the study file has"):
        check_same_choices(study, spec_with({"seed": [0, 1], "lr": [0.001, 0.002]},
                                             variants=[*TWO_VARIANTS, {"label": "skip", "residual": "skipinit"}]))
    with pytest.raises(ValueError, match=r"run with lr as a number in \[0.001, 0.002\], the study file makes it a "
                                         r"number in \[0.001, 0.5\] on a log scale .*--study-name NEW_NAME"):
        check_same_choices(study, spec_with({"seed": [0, 1], "lr": [0.001, 0.5]}))
