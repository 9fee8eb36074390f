"""Helpers shared by the study tests (test_studies.py: SQLite; test_scaleout.py: PostgreSQL).

A *storage* here is a SQLite database file (a ``Path``) or a storage URL (a ``str``, e.g. a PostgreSQL database of
the test cluster). The ``check_*`` functions are whole scenarios, run by each test module against its storage.
The CLI runs in a subprocess with the test's tmp folder as its working directory, started with start_new_session (its own process group), so a test
that fails or times out kills the whole process group.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from ablations.run.objective import suggest
from ablations.studies.spec import load_spec
from ablations.studies.storage import SQLITE_LOCK_TIMEOUT_S, open_storage

optuna.logging.set_verbosity(optuna.logging.WARNING)
#: ``pytestmark`` of the study test modules: Optuna's experimental-feature and heartbeat warnings are expected there.
STUDY_TEST_MARKS = [pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning"),
                    pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")]

#: Epochs of a trial that a test interrupts after a checkpoint. The test freezes the worker (SIGSTOP) as soon as it
#: sees the checkpoint (:func:`freeze_when`), so the signal, kill or outage lands mid-trial however loaded the
#: machine is: the epochs only have to outlast one 0.1 s poll.
EXAMPLE_SEARCH = str(Path(__file__).resolve().parents[1] / "examples" / "init_search.yaml")  # the search study
LONG_TRIAL_EPOCHS = 30
CLI_TIMEOUT_S = 900  # generous: the CPU cores are shared; the timeout only stops a hung run
#: ``--heartbeat`` / ``--grace`` of runs in which live workers judge each other's trials (stale heartbeat = dead).
#: A live worker's heartbeat can wait SQLite's whole lock timeout behind other processes' writes (a longer wait
#: ends the worker: lost storage), or be starved of the CPU as long: the grace outlasts that by five heartbeats, so
#: a loaded machine never makes a live trial look dead. (A run alone on its storage may use a short grace.)
HEARTBEAT_S = 1
LIVE_GRACE_S = SQLITE_LOCK_TIMEOUT_S + 5 * HEARTBEAT_S
LIVE_WORKERS = ("--heartbeat", str(HEARTBEAT_S), "--grace", str(LIVE_GRACE_S))
#: The tiny study runs train in fp32 with fused attention (``precision: 32-true``): under ``auto`` on a CPU that no
#: modes table matches, every run in a fresh results folder first measures its cell (seconds per CLI call; what
#: ``auto`` does is tested in test_modes.py and test_training.py, and by the ``tiny_study`` run of test_studies.py,
#: which sets ``auto`` again).
TINY_BASE = {"dataset": "synthetic", "dataset_options": {"num_samples": 128, "img_size": 8}, "embed_dim": 8,
             "num_heads": 2, "depth": 1, "max_epochs": 1, "patch_size": 4, "batch_size": 32, "precision": "32-true"}
TWO_VARIANTS = ({"label": "standard", "residual": "standard"}, {"label": "rezero", "residual": "rezero"})
THREE_VARIANTS = (*TWO_VARIANTS, {"label": "skipinit", "residual": "skipinit"})


def write_study(path: Path, *, variants=TWO_VARIANTS, base: dict | None = None, **keys) -> Path:
    """A study YAML at ``path`` (name: the file's stem): tiny synthetic runs, ``base`` overriding TINY_BASE."""
    doc = {"name": path.stem, "kind": "grid", **keys, "base": TINY_BASE | (base or {}), "variants": list(variants)}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


#: a tuning stage of two rates on three seeds, the grid its own bounds (no extension)
CLAIM_TUNE = {"lr": [1e-3, 2e-3], "seeds": [100, 101, 102], "bounds": [1e-3, 2e-3], "metric": "final_val_acc"}
#: one claim line: rezero against standard, higher
REZERO_CLAIM = {"id": "c", "claim": "rezero beats", "source": "test", "variant": "rezero", "baseline": "standard",
                "direction": "higher"}


def run_claim_study(tmp_path: Path, verdicts: dict) -> tuple[Path, Path, subprocess.CompletedProcess]:
    """(study file, storage, result) of ``ablations.run`` on 'cont': standard and rezero on seeds 0-1 after
    :data:`CLAIM_TUNE`, judged by :data:`REZERO_CLAIM` under ``verdicts``, run to its end in this process."""
    path = write_study(tmp_path / "cont.yaml", variants=TWO_VARIANTS, axes={"seed": [0, 1]}, tune=CLAIM_TUNE,
                       verdicts=verdicts, claims=[REZERO_CLAIM])
    db = tmp_path / "o.db"
    result = run_in_process("--study", str(path), "--storage", url_of(db), "--results-dir", "results",
                            "--no-progress", cwd=tmp_path)
    return path, db, result


def run_dir_name(spec, label: str) -> str:
    """The run folder (relative to the study's runs folder) of a variant of a study without grid axes."""
    config = spec.run_config({"variant": label})
    return f"{label}/depth={config.depth}/seed={config.seed}"


def url_of(storage: Path | str) -> str:
    """The storage URL of a SQLite file (a URL is returned as it is)."""
    return storage if isinstance(storage, str) else f"sqlite:///{storage}"


def one_worker_unless_told(args) -> list[str]:
    """The CLI's ``--workers`` defaults to one worker per core (``ablations.run.cli.default_workers``); the tests run
    one worker unless they give ``--workers`` themselves, so that a test's processes do not depend on the machine."""
    args = [str(a) for a in args]
    return args if "--workers" in args else [*args, "--workers", "1"]


def start_cli(*args, cwd: Path, log=None) -> subprocess.Popen:
    """``python -m ablations.run ARGS`` started with start_new_session (so its worker processes can be killed as one group);
    output piped, or both streams into the open file ``log``. Ctrl-C reaches it as in a terminal even when pytest
    itself was started with SIGINT ignored (a background job of a shell without job control), which a child would
    otherwise inherit: Python then installs no KeyboardInterrupt handler and a SIGINT does nothing. One worker
    unless ``args`` say otherwise (:func:`one_worker_unless_told`)."""
    return subprocess.Popen([sys.executable, "-m", "ablations.run", *one_worker_unless_told(args)], cwd=cwd, text=True,
                            stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT if log else subprocess.PIPE,
                            start_new_session=True, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of a CLI still running (never a group whose leader has been reaped)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=60)


def finish(proc: subprocess.Popen, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        stop_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_cli(*args, cwd: Path, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    return finish(start_cli(*args, cwd=cwd), timeout)


def run_in_process(*args, cwd: Path, main=None) -> subprocess.CompletedProcess:
    """``main(ARGS)`` (default ``ablations.run.main``; or e.g. ``ablations.report.cli.main``) in this process, in
    ``cwd``, its stdout and stderr captured: what the CLI prints and returns, without a process's seconds of imports.
    For the checks that are not about the process boundary; :func:`run_cli` runs the real process. (Log records go
    to pytest's log capture, not to the captured stderr.)"""
    import contextlib
    import io

    if main is None:
        from ablations.run import main

        args = one_worker_unless_told(args)
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.chdir(cwd)
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:  # argparse's own errors
            code = exc.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def run_cli_many(calls: dict[str, tuple], cwd: Path) -> dict[str, subprocess.CompletedProcess]:
    """Several CLI calls side by side (their start-up is mostly imports); results by key."""
    procs = {}
    try:
        for key, args in calls.items():
            procs[key] = start_cli(*args, cwd=cwd)
        return {key: finish(proc) for key, proc in procs.items()}
    finally:
        for proc in procs.values():
            stop_group(proc)


def trials_of(storage: Path | str, study_name: str) -> list[optuna.trial.FrozenTrial]:
    """The study's trials. A SQLite file is read through a read-only connection: a CLI frozen by a test in the middle of a transaction holds the write lock, which every transaction of
    ``open_storage`` takes (``BEGIN IMMEDIATE``) and a read-only reader does not need. Other URLs are read through
    ``open_storage``, as the CLI reads them (it picks the installed PostgreSQL driver for a bare ``postgresql://``)."""
    if isinstance(storage, Path):
        reader = optuna.storages.RDBStorage(f"sqlite:///file:{storage.resolve()}?mode=ro&uri=true",
                                            skip_table_creation=True, skip_compatibility_check=True)
    else:
        reader = open_storage(storage)
    try:
        return optuna.load_study(study_name=study_name, storage=reader).get_trials(deepcopy=False)
    finally:
        reader.engine.dispose()


def storage_unlocked(storage: Path | str) -> bool:
    """False while a SQLite ``storage``'s write lock is held (checked without waiting); always True for a URL.
    Every storage call of a CLI takes that lock (``BEGIN IMMEDIATE``), heartbeats and reads too, so a CLI frozen
    inside one holds it for as long as it stays frozen, and any other process that needs the storage meanwhile
    waits out ``SQLITE_LOCK_TIMEOUT_S`` and ends ("database is locked": lost storage). A test that keeps one CLI
    frozen while others run freezes it only at a moment where this holds."""
    if not isinstance(storage, Path):
        return True  # PostgreSQL locks rows, not the database, and waits for a row lock without a time limit
    connection = sqlite3.connect(storage, timeout=0, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:  # "database is locked"
        return False
    finally:
        connection.close()


def trial_states(storage: Path | str, study_name: str) -> dict[int, TrialState]:
    """Trial states by number; {} while the CLI is still creating the storage or the study, or while a frozen CLI
    holds SQLite's exclusive lock. Read as :func:`trials_of` reads (read-only for SQLite: it never creates tables,
    which would race with the CLI creating them)."""
    if isinstance(storage, Path) and not storage.is_file():
        return {}
    try:
        return {t.number: t.state for t in trials_of(storage, study_name)}
    except Exception:  # noqa: BLE001 - no tables / no study yet, or locked
        return {}


def point(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def trials_by_params(storage: Path | str, study_name: str, states=None) -> dict[tuple, list[optuna.trial.FrozenTrial]]:
    """The study's trials (of ``states``, default all) grouped by their parameters."""
    grouped: dict[tuple, list] = {}
    for t in trials_of(storage, study_name):
        if states is None or t.state in states:
            grouped.setdefault(point(t.params), []).append(t)
    return grouped


def snapshot(trials) -> list[tuple]:
    """What must never change once a trial has finished."""
    return [(t.number, t.state, t.params, t.values, t.datetime_complete, t.user_attrs) for t in trials]


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str, status: int = 2) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == status, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def assert_grid_complete_once(storage: Path | str, spec) -> dict[tuple, optuna.trial.FrozenTrial]:
    """Every grid point COMPLETE exactly once, nothing else COMPLETE; returns the COMPLETE trial per point."""
    complete = trials_by_params(storage, spec.study_name, states=(TrialState.COMPLETE,))
    assert sorted(complete) == sorted(point(p) for p in spec.grid())
    assert all(len(ts) == 1 for ts in complete.values()), {k: [t.number for t in ts] for k, ts in complete.items()}
    return {k: ts[0] for k, ts in complete.items()}


def wait_for(condition, proc: subprocess.Popen, what: str, log: Path | None = None) -> None:
    """Poll ``condition()`` until true; fail if the CLI ends first (with the tail of its ``log``) or on timeout."""
    deadline = time.monotonic() + CLI_TIMEOUT_S
    while not condition():
        if proc.poll() is not None:
            output = log.read_text()[-3000:] if log else proc.stderr.read()
            pytest.fail(f"the run ended before {what}:\n{output}")
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


def freeze_when(condition, proc: subprocess.Popen, what: str, log: Path | None = None, frozen_check=None) -> None:
    """Wait until ``condition()``, then stop the CLI's whole process group (SIGSTOP) and check ``frozen_check()``
    (default: the condition again) while it is frozen (resuming it a moment and waiting on if it does not hold): on
    return the workers are frozen at a moment where it holds. The caller sends its signal (or stops a server), then
    :func:`thaw` or kills. Keep ``condition`` cheap (a file, a read-only storage read): the workers run on while it
    is polled. A storage read belongs in ``condition`` or ``frozen_check`` (which a read that fails while a frozen
    worker holds SQLite's exclusive lock makes false, not stuck)."""
    while True:
        wait_for(condition, proc, what, log)
        os.killpg(proc.pid, signal.SIGSTOP)
        if (frozen_check or condition)():
            return
        thaw(proc)
        time.sleep(0.05)


def thaw(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGCONT)


def signal_mid_trial(args: tuple, cwd: Path, ready, sig: int, what: str) -> subprocess.CompletedProcess:
    """Run the CLI until ``ready()`` (cheap, e.g. a checkpoint file), freeze it, send ``sig`` to its process group
    (delivered as the group resumes: mid-trial, however loaded the machine is) and let it finish."""
    proc = start_cli(*args, cwd=cwd)
    try:
        freeze_when(ready, proc, what)
        os.killpg(proc.pid, sig)
        thaw(proc)
        return finish(proc)
    finally:
        stop_group(proc)


def saved_checkpoint(path: Path) -> dict | None:
    """(epoch, global_step) of a complete Lightning checkpoint file, None while it is missing or half-written."""
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
        return {"epoch": state["epoch"], "global_step": state["global_step"]}
    except Exception:  # noqa: BLE001 - missing, being written
        return None


def mid_run_checkpoint(path: Path, max_epochs: int) -> dict | None:
    """``saved_checkpoint`` of a run that is still training: not one of its last two epochs'. After its last epoch
    the trial writes its summary with the file still there, and a signal sent then lands once the trial has
    completed (seen under load: the trial COMPLETE, not FAIL)."""
    saved = saved_checkpoint(path)
    return saved if saved is not None and saved["epoch"] < max_epochs - 2 else None


def assert_resumed_from(retry: optuna.trial.FrozenTrial, saved: dict, max_epochs: int, cwd: Path) -> None:
    """(``cwd``: the CLI's working directory, which its ``log_dir`` attribute is relative to.) The retried trial *started at* the checkpoint the dead attempt saved, as Lightning restored it, and trained
    only the remaining epochs in its own process: its steps and images say so. A retry that ignored the checkpoint
    would start at epoch 0, step 0 and train every epoch again."""
    attrs = retry.user_attrs
    done = saved["epoch"] + 1  # saved at the end of (0-based) epoch `epoch`
    steps_per_epoch = saved["global_step"] // done
    images_per_epoch = attrs["images_seen"] // max_epochs
    assert attrs["resumed_from_checkpoint"] is True and attrs["resumed_checkpoint"].endswith("last.ckpt")
    assert (attrs["start_epoch"], attrs["start_global_step"]) == (done, saved["global_step"])
    assert attrs["epochs_this_process"] == max_epochs - done
    assert attrs["steps_this_process"] == (max_epochs - done) * steps_per_epoch
    assert attrs["images_this_process"] == (max_epochs - done) * images_per_epoch < attrs["images_seen"]
    assert attrs["epochs_completed"] == max_epochs  # the whole curve: the checkpoint's epochs plus this process's
    assert attrs["wall_time_this_process_s"] < attrs["wall_time_s"]  # the total includes the dead attempt's time
    events = event_scalars(cwd / attrs["log_dir"])
    assert events["resume/start_global_step"] == [(saved["global_step"], float(saved["global_step"]))]
    assert events["resume/start_epoch"] == [(saved["global_step"], float(done))]


def event_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a run's TensorBoard event files (all of them, as TensorBoard merges them)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            found.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return found


# --- scenarios ---------------------------------------------------------------------------------------------------
def kill_9_when(args: tuple, cwd: Path, ready, what: str) -> None:
    """Start the CLI, freeze it once ``ready()`` holds, and SIGKILL its process group: the worker dies mid-trial
    and no exception handler runs (its log: ``cwd/killed_run.log``)."""
    log = cwd / "killed_run.log"
    with open(log, "w") as log_file:
        proc = start_cli(*args, cwd=cwd, log=log_file)
        try:
            freeze_when(ready, proc, what, log)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=CLI_TIMEOUT_S)
        finally:
            stop_group(proc)


def check_killed_trial_is_retried_and_resumes(tmp_path: Path, storage: Path | str) -> None:
    """Trial 0 (1 epoch) completes; trial 1 (30 epochs) is SIGKILLed with its worker after its first checkpoint.
    The rerun fails it (stale heartbeat), retries it with the same parameters, and the retry continues from the
    checkpoint: its summary counts all 30 epochs, not only those run after the restart."""
    max_epochs = LONG_TRIAL_EPOCHS
    write_study(tmp_path / "crash.yaml", base={"max_epochs": max_epochs}, variants=[
        {"label": "short", "residual": "standard", "overrides": {"max_epochs": 1}},
        {"label": "long", "residual": "layerscale"},
    ])
    spec = load_spec(str(tmp_path / "crash.yaml"))
    args = ("--study", "crash.yaml", "--storage", url_of(storage), "--results-dir", "results", "--heartbeat", "1",
            "--grace", "2", "--no-progress")
    last_ckpt = tmp_path / "results" / "runs" / "crash" / run_dir_name(spec, "long") / "checkpoints" / "last.ckpt"

    # The storage is read in the condition too: frozen in the middle of a commit, the worker holds SQLite's
    # exclusive lock and a read fails; freeze_when then lets it run on and tries again.
    kill_9_when(args, tmp_path, lambda: mid_run_checkpoint(last_ckpt, max_epochs)
                and trial_states(storage, "crash").get(1) == TrialState.RUNNING, "trial 1 wrote a checkpoint")
    saved = saved_checkpoint(last_ckpt)  # the file the killed worker left

    before = trials_of(storage, "crash")
    assert [t.state for t in before] == [TrialState.COMPLETE, TrialState.RUNNING]
    killed_epochs = len(before[1].intermediate_values)
    assert 1 <= killed_epochs < max_epochs
    time.sleep(3)  # > grace: the killed trial's heartbeat is stale now

    rerun = run_cli(*args, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    complete = assert_grid_complete_once(storage, spec)
    after = trials_of(storage, "crash")
    assert len(after) == 3
    assert snapshot(after[:1]) == snapshot(before[:1])  # the completed trial is untouched
    killed, retry = after[1], after[2]
    assert killed.state == TrialState.FAIL
    assert retry.state == TrialState.COMPLETE and complete[point(retry.params)].number == retry.number
    assert retry.params == killed.params == {"variant": "long"}
    assert retry.system_attrs["failed_trial"] == 1 and retry.user_attrs["retry_of"] == 1
    assert retry.user_attrs["resume_checkpoint"] == str(last_ckpt.relative_to(tmp_path))
    assert_resumed_from(retry, saved, max_epochs, tmp_path)
    assert retry.user_attrs["log_dir"].endswith(run_dir_name(spec, "long"))  # the killed trial's folder, continued
    assert retry.user_attrs["run_name"] == killed.user_attrs["run_name"] == run_dir_name(spec, "long")
    assert retry.user_attrs["config"]["max_epochs"] == max_epochs
    assert retry.user_attrs["epochs_completed"] == max_epochs  # counted on from the checkpoint, not restarted
    curve = retry.user_attrs["val_acc_curve"]
    assert len(curve) == max_epochs and None not in curve
    assert curve[0] == pytest.approx(killed.intermediate_values[0])  # epoch 1 comes from the killed run
    assert sorted(retry.intermediate_values) == list(range(max_epochs))
    assert not last_ckpt.parent.exists()  # removed once the retry completed


def check_bad_checkpoints_restart_their_trials(tmp_path: Path, storage: Path | str) -> None:
    """Trials 0 and 1 lost their workers (RUNNING, stale heartbeat): trial 0 left garbage as last.ckpt, trial 1
    no checkpoint at all. The rerun retries both, warns, and trains them from scratch. Trial 2's would-be folder
    holds a checkpoint left by an earlier study of the same name (storage reset): a first attempt never resumes it."""
    write_study(tmp_path / "corrupt.yaml", base={"max_epochs": 2}, variants=THREE_VARIANTS)
    spec = load_spec(str(tmp_path / "corrupt.yaml"))
    rdb = open_storage(url_of(storage), heartbeat_s=1, grace_s=2)
    study = optuna.create_study(storage=rdb, study_name=spec.study_name, direction=spec.direction)
    for params in spec.grid():  # the state a rerun finds: the grid enqueued, as the CLI does it
        study.enqueue_trial(params, skip_if_exists=True)
    for _ in range(2):
        dead = study.ask()  # takes the next grid point and marks it RUNNING, like a worker would
        suggest(dead, spec)
        rdb.record_heartbeat(dead._trial_id)  # the worker was alive once, then died
    runs = tmp_path / "results" / "runs" / "corrupt"
    names = [run_dir_name(spec, v["label"]) for v in THREE_VARIANTS]
    for trial_dir in (names[0], names[2]):
        (runs / trial_dir / "checkpoints").mkdir(parents=True)
        (runs / trial_dir / "checkpoints" / "last.ckpt").write_bytes(b"\x00garbage, not a torch checkpoint")
    time.sleep(3)  # > grace

    result = run_cli("--study", "corrupt.yaml", "--storage", url_of(storage), "--results-dir", "results",
                     "--heartbeat", "1", "--grace", "2", "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"{names[0]}/checkpoints/last.ckpt is unusable" in result.stderr
    assert f"{names[1]}/checkpoints/last.ckpt to resume" in result.stderr
    # trial 2's folder holds an earlier study's files: it writes to a folder of its own, never resumes them
    assert f"{names[2]} exists (left by an earlier study" in result.stderr
    assert trials_of(storage, "corrupt")[2].user_attrs["log_dir"].endswith(f"{names[2]}/trial_0002")
    complete = assert_grid_complete_once(storage, spec)
    trials = trials_of(storage, "corrupt")
    assert [t.state for t in trials[:2]] == [TrialState.FAIL] * 2 and len(trials) == 5
    for dead in trials[:2]:
        retry = complete[point(dead.params)]
        assert retry.user_attrs["retry_of"] == dead.number
        assert retry.user_attrs["log_dir"].endswith(names[dead.number])
    for t in complete.values():  # trained from scratch, in full, in the rerun's process
        assert t.user_attrs["resumed_from_checkpoint"] is False and t.user_attrs["resume_checkpoint"] is None
        assert (t.user_attrs["start_epoch"], t.user_attrs["start_global_step"]) == (0, 0)
        assert t.user_attrs["epochs_completed"] == t.user_attrs["epochs_this_process"] == 2
        assert t.user_attrs["images_this_process"] == t.user_attrs["images_seen"]


def check_two_workers_complete_each_point_once(tmp_path: Path, storage: Path | str, study: str = "workers.yaml",
                                               budget: str = "default"):
    """``--workers 2`` on a grid (default: a 3-point tiny study file; or a named study such as residual_variants at
    budget smoke): every point COMPLETE exactly once, any other trial a surplus ask pruned before training.
    Returns the study's spec."""
    if study == "workers.yaml":
        write_study(tmp_path / study, variants=THREE_VARIANTS)
    spec = load_spec(str(tmp_path / study) if study.endswith(".yaml") else study, budget)
    result = run_cli("--study", study, "--budget", budget, "--workers", "2", "--storage", url_of(storage),
                     "--results-dir", "results", "--no-progress", *LIVE_WORKERS, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_grid_complete_once(storage, spec)
    for t in trials_of(storage, spec.study_name):
        assert t.state == TrialState.COMPLETE or {"surplus", "duplicate_of"} & set(t.user_attrs), t
        if t.state == TrialState.COMPLETE:
            assert t.user_attrs["config"]["threads"] == max(1, (os.cpu_count() or 1) // 2)
    return spec
