"""Running a study's trials: one worker's loop (``work``), the worker processes and their progress bar, each
trial's guard (a failed write to the results folder stops the run with one line) and the end-of-run summary."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState
from tqdm import tqdm

from .. import layout
from ..dashboard import write_study_hparams
from ..report.aggregate import STUDY_METRICS
from ..report.aggregate import refresh as refresh_aggregates
from ..studies.advice import below_floor_line
from ..studies.spec import parent_name
from ..studies.stopping import check_stopping, stop_signal
from ..studies.storage import redact
from .imported import import_runs, retrain_rule
from .kept_modes import kept_lines, stored_kept
from .objective import Objective, worker_id
from .stacked import work_stacked
from .study import (
    STOPPED,
    count_done,
    create_study,
    follow_study_file,
    grid_keys,
    measure_modes,
    retry_failed_points,
    stored_choice,
)
from .write_errors import ResultsWriteError, one_line, write_error

#: Seconds the main process of ``--workers N`` gives its workers, after Ctrl-C or SIGTERM, to mark their trials
#: failed (checkpoints kept) before it kills them; a killed worker's trial is retried once its heartbeat is stale.
WORKER_STOP_S = 60


def _guarded(objective, log_root: Path):
    """The objective, with two kinds of failure that are not the trial's own told apart:

    - Ctrl-C / SIGTERM: the trial is marked :data:`STOPPED` before optuna marks it FAIL, so that the workers still
      running (on this machine or others) retry it at once (:func:`retry_failed_points`), as they retry a dead
      worker's trial once its heartbeat is stale;
    - a results folder that takes no more writes: :class:`ResultsWriteError`. Optuna marks the trial FAIL (its
      checkpoints are kept where they could be written: the rerun resumes it) and, as the error is not one it
      catches, stops the study; the CLI prints one line naming the trial's folder and the OS error."""

    def run(trial):
        try:
            if trial.user_attrs.get(STOPPED):  # a retry inherits its original's user attrs: it was not stopped
                trial.set_user_attr(STOPPED, None)
            return objective(trial)
        except KeyboardInterrupt:
            try:
                trial.set_user_attr(STOPPED, signal.Signals(stop_signal() or signal.SIGINT).name)
            except Exception:  # noqa: BLE001 - the storage may be what is failing; the trial FAILs all the same
                pass
            raise
        except Exception as exc:
            error = write_error(exc, log_root)
            if error is None:
                raise
            try:
                folder = trial.user_attrs.get("log_dir") or log_root
            except Exception:  # noqa: BLE001 - the storage is not the problem being reported here
                folder = log_root
            raise ResultsWriteError(
                f"trial {trial.number} cannot write its files in '{folder}': {one_line(error)}; the trial is marked "
                "failed and completed trials are kept: free space or make the folder writable, then rerun the same "
                "command (the trial resumes from its last checkpoint)") from exc

    return run


class _QuietStops(logging.Filter):
    """Drop optuna's "Trial N failed ... because of the following error" warnings (and their tracebacks) for a trial
    stopped by Ctrl-C / SIGTERM or by a results folder that takes no more writes: the CLI says that in one line."""

    def __init__(self) -> None:
        super().__init__()
        self.numbers: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        match = re.match(r"Trial (\d+) failed with", str(record.msg))
        if match is None:
            return True
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, (KeyboardInterrupt, ResultsWriteError)):
            self.numbers.add(match.group(1))
            return False
        return match.group(1) not in self.numbers  # the "failed with value None" line that follows


def run_grid(spec, storage, study_name: str, args, overrides: dict, *, stage: str = "report", study=None) -> int:
    """One stage of a study: create (or continue) it, enqueue its grid, and train it with ``--workers`` workers."""
    study = study or create_study(spec, storage, study_name, seed=0)
    tuned = None if stage in ("tune", "contend") else stored_choice(storage, parent_name(study_name))
    if spec.kind == "grid" and args.import_runs:
        import_runs(args.import_runs, spec, storage, study_name, overrides, tuned=tuned,
                    retrain=retrain_rule(args.retrain_without_per_image, tuple(args.retrain_mode)))
    write_study_hparams(layout.runs_dir(args.results_dir, study_name), spec, STUDY_METRICS)
    if spec.kind == "grid":
        for params in spec.grid():
            study.enqueue_trial(params, skip_if_exists=True)
        follow_study_file(study, spec, storage)
        retry_failed_points(study, spec, storage)
    total = spec.size if spec.kind == "grid" else (args.n_trials or spec.n_trials)
    part = stage_text(spec, stage)
    print(f"study '{study_name}' ({spec.kind}{f', {part}' if part else ''}: {total} trials) in "
          f"{redact(args.storage)}; TensorBoard: tensorboard --logdir {layout.runs_dir(args.results_dir, study_name)}",
          file=sys.stderr)
    measure_modes(spec, overrides, Path(args.results_dir))
    _say_kept_modes(spec, storage, study_name, args, overrides)
    started = time.time()
    desc = f"{study_name} [{part}]" if part else study_name
    if args.workers == 1:
        work(spec, storage, study_name, args, overrides, progress_total=None if args.no_progress else total,
              tuned=tuned, desc=desc)
    else:
        _spawn_workers(args, storage, study_name, total, grid_keys(spec), stage=stage, desc=desc)
        # A worker stopped on its own (one machine preempted) fails its trial while it saves; when the other workers
        # had already run out of points by then, nobody took it over: train it now, resuming from its checkpoint.
        while spec.kind == "grid":
            check_stopping()
            retried = retry_failed_points(study, spec, storage, only_stopped=True)
            if not retried:
                break
            _spawn_workers(args, storage, study_name, total, grid_keys(spec), stage=stage,
                           count=min(args.workers, len(retried)), desc=desc)
    return _finish(study_name, storage, spec, time.time() - started)


#: how a stage of a study with a tuning stage is named on its first line and progress bar
STAGE_NAMES = {"tune": "tuning stage", "report": "reported grid", "contend": "contending rates",
               "round": "second look"}


def stage_text(spec, stage: str) -> str:
    """Which stage of a study with a tuning stage runs (its progress bar and first line say it): the tuning stage
    first, then the reported grid, then any contending rates or second look; empty for a study without one."""
    if stage == "report" and spec.tune is None:
        return ""
    return STAGE_NAMES.get(stage, stage)


def _say_kept_modes(spec, storage, study_name: str, args, overrides: dict) -> None:
    """One line per model size whose runs so far fix the mode precision ``auto`` trains the rest in, where that is
    not this machine's own choice or the runs are mixed (:mod:`.kept_modes`)."""
    kept = stored_kept(storage, study_name, spec.stage, getattr(args, "retrain_mode", ()))
    if not kept:
        return
    configs = [spec.run_config(p, overrides) for p in spec.points()]
    threads = overrides.get("threads") or os.cpu_count() or 1
    for line in kept_lines(kept, configs, Path(args.results_dir), threads):
        print(line, file=sys.stderr)


def quiet() -> None:
    """Study output is the progress bar and one line per event: silence per-trial Lightning chatter."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optimize_log = logging.getLogger("optuna.study._optimize")
    if not any(isinstance(f, _QuietStops) for f in optimize_log.filters):
        optimize_log.addFilter(_QuietStops())
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message=r".*(LeafSpec|litlogger|does not have many workers).*")


def work(spec, storage, study_name: str, args, overrides: dict, progress_total: int | None = None,
          tuned: dict[str, float] | None = None, desc: str | None = None) -> int:
    """One worker: take enqueued grid points (or sample search points) until none are left."""
    index = args.worker_index or 0
    study = create_study(spec, storage, study_name, seed=index)  # a distinct sampler seed per worker
    log_root = layout.runs_dir(args.results_dir, study_name)
    objective = Objective(spec, log_root=log_root, overrides=overrides, keep_checkpoints=args.keep_checkpoints,
                          loggers=tuple(args.loggers), results_dir=args.results_dir, tuned=tuned,
                          kept_from=(storage, study_name, spec.stage, tuple(getattr(args, "retrain_mode", ()))))
    keep = objective.refresh_kept  # the study's mode as its completed runs have it, read before each trial or stack
    grid = grid_keys(spec)
    bar = _progress(study, progress_total, grid, desc)

    def between() -> None:  # before each stack of trials: stop signals, dead workers' trials, the mode, progress
        check_stopping()
        keep()
        optuna.storages.fail_stale_trials(study)
        retry_failed_points(study, spec, storage, only_stopped=True)  # e.g. a preempted worker's trial
        if bar is not None:
            bar.n = count_done(study, grid)
            bar.refresh()

    try:
        if spec.kind == "grid" and getattr(args, "engine", "plain") != "plain":  # stacks of a cell's trials first (ablations.engine)

            work_stacked(study, objective, args, between,
                         after=lambda: refresh_aggregates(study, spec, args.results_dir))
        objective = _guarded(objective, log_root)
        while True:
            check_stopping()
            optuna.storages.fail_stale_trials(study)
            if spec.kind == "grid":
                retry_failed_points(study, spec, storage, only_stopped=True)  # e.g. a preempted worker's trial
                if not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                    break
            elif _search_budget_spent(study, args.n_trials or spec.n_trials):
                break
            keep()
            study.optimize(objective, n_trials=1, gc_after_trial=True, catch=(RuntimeError,))
            refresh_aggregates(study, spec, args.results_dir)  # TensorBoard's seed aggregates, with this trial
            if bar is not None:
                bar.n = count_done(study, grid)
                bar.refresh()
    finally:
        if bar is not None:
            bar.close()
    return 0


def _search_budget_spent(study, n_trials: int) -> bool:
    """A search has its ``n_trials`` once that many trials are done, running, or failed for good, and no retry waits.
    A failed trial whose parameters were re-enqueued (a killed worker's, :func:`ablations.studies.storage.open_storage`'s
    retry callback) is replaced by its retry, so it does not use up a trial; one that failed by itself and was not
    retried does (never loop on failures)."""
    trials = study.get_trials(deepcopy=False)
    if any(t.state == TrialState.WAITING for t in trials):
        return False
    retried = {t.system_attrs.get("failed_trial") for t in trials}
    counted = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    return sum(t.state in counted or (t.state == TrialState.FAIL and t.number not in retried)
               for t in trials) >= n_trials


def _progress(study, total: int | None, grid: set[str] | None = None, desc: str | None = None):
    if total is None:
        return None

    return tqdm(total=total, initial=count_done(study, grid), desc=desc or study.study_name, unit="trial",
                dynamic_ncols=True)


def _spawn_workers(args, storage, study_name: str, total: int, grid: set[str] | None = None,
                   stage: str = "report", count: int | None = None, desc: str | None = None) -> None:
    """``count`` (default ``--workers``) local processes on the same study, each with its share of the cores and its
    own sampler seed. On Ctrl-C or SIGTERM the workers are stopped the same way (:func:`_stop_workers`) before this
    process exits."""
    argv = [a for a in args.argv if a != "--no-progress"]
    procs, bar = [], None
    try:
        for i in range(count or args.workers):
            procs.append(subprocess.Popen([sys.executable, "-m", "ablations.run", *argv, "--worker-index", str(i),
                                           "--no-progress", "--study-name", study_name, "--stage", stage]))
        if not args.no_progress:
            bar = _progress(optuna.load_study(study_name=study_name, storage=storage), total, grid, desc)
        while any(p.poll() is None for p in procs):
            check_stopping()
            time.sleep(2)
            if bar is not None:
                bar.n = count_done(optuna.load_study(study_name=study_name, storage=storage), grid)
                bar.refresh()
    except KeyboardInterrupt:
        _stop_workers(procs)
        _fail_left_running(procs, storage, study_name)
        raise
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        if bar is not None:
            bar.close()


def _stop_workers(procs: list) -> None:
    """Pass SIGTERM on to every worker still running (a worker that got the signal itself, from the terminal or the
    job's process group, ignores the repeat), give them :data:`WORKER_STOP_S` to mark their trials failed with their
    checkpoints kept, and kill any still running then (its trial is retried once its heartbeat is stale)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + WORKER_STOP_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for child in _descendants(p.pid):  # its ddp_spawn ranks: nothing else would stop them
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
            p.kill()
            p.wait()


def _descendants(pid: int) -> list[int]:
    """The processes started by ``pid`` and by them, on Linux (``/proc``); [] elsewhere or once it has ended."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []
    return [d for c in children for d in (c, *_descendants(c))]


def _fail_left_running(procs: list, storage, study_name: str) -> None:
    """After Ctrl-C / SIGTERM, once every worker has ended: mark failed (:data:`STOPPED`, checkpoints kept) the
    trials that a worker of this process left RUNNING, because it did not mark them within :data:`WORKER_STOP_S`
    and was killed (with its ``ddp_spawn`` ranks), or ended without marking them. Nothing else can still be
    training them (a retry does not inherit its attempt's ``worker``: ``storage.NOT_INHERITED``), so the rerun
    retries them at once from their last checkpoint instead of after the heartbeat's grace period, as it does a
    trial its worker stopped in time. Trials of workers elsewhere (other machines) are not touched. In CI a stopped
    worker once took two minutes to mark its trial failed. Only a scheduler that waits longer than
    :data:`WORKER_STOP_S` after its SIGTERM lets this happen (SLURM's KillWait and Kubernetes'
    terminationGracePeriodSeconds are 30 s by default); after a SIGKILL the heartbeat retries them."""
    ours = {worker_id(p.pid) for p in procs}
    stopped_by = signal.Signals(stop_signal() or signal.SIGINT).name
    marked = []
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
        left = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if t.user_attrs.get("worker") in ours]
        for t in left:
            try:
                storage.set_trial_user_attr(t._trial_id, STOPPED, stopped_by)
                storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            except UpdateFinishedTrialError:  # another machine's stale-heartbeat check failed it meanwhile
                continue
            marked.append(t.number)
    except Exception as exc:  # noqa: BLE001 - the storage may be what failed; the heartbeat retries them then
        print(f"could not mark the stopped workers' trials failed ({one_line(exc)}); the next run retries them once "
              "their heartbeat is stale", file=sys.stderr)
        return
    if marked:
        print(f"trial(s) {', '.join(map(str, marked))}: left running by a worker that ended without marking it "
              f"failed (killed {WORKER_STOP_S} s after the signal, or gone before it); marked failed here "
              "(checkpoints kept: the rerun resumes it)", file=sys.stderr)


#: Seconds between two looks at the points other workers are training (:func:`await_other_workers`)
AWAIT_POLL_S = 5.0


def await_other_workers(spec, storage, study_name: str, poll_s: float = AWAIT_POLL_S) -> bool:
    """Wait while the last points of grid ``spec`` train in other workers (other processes or machines on the same
    storage), so that what follows reads every point's result (the tuning stage's choice: a mean over fewer seeds
    than the stage's would pick another rate). True: nothing of the stage runs elsewhere any more; False: a point
    is WAITING again (a dead worker's trial, retried once its heartbeat went stale): this worker trains it."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    grid, said = grid_keys(spec), False
    while True:
        check_stopping()
        optuna.storages.fail_stale_trials(study)
        retry_failed_points(study, spec, storage, only_stopped=True)
        if study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return False
        running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        if not running or count_done(study, grid) >= spec.size:
            return True
        if not said:
            print(f"study '{study_name}': waiting for {running} point(s) running in other workers before going on",
                  file=sys.stderr)
            said = True
        time.sleep(poll_s)


def _say_below_floor(study, spec, study_name: str) -> None:
    """One line when completed trials ended below the study's floor (they count as failed to train), with the
    likely causes (:mod:`ablations.studies.advice`)."""
    if spec.floor is None:
        return
    done = [t.user_attrs for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    failed = [(attrs, attrs.get("config") or {}) for attrs in done
              if spec.floor.failed(attrs.get(spec.floor.metric),
                                   attrs.get("num_classes") or (attrs.get("config") or {}).get("num_classes"))]
    line = below_floor_line(failed, len(done), spec.floor, what=f"completed trials of '{study_name}'")
    if line:
        print(line, file=sys.stderr)


def _finish(study_name: str, storage, spec, elapsed: float) -> int:
    study = optuna.load_study(study_name=study_name, storage=storage)
    counts = {s.name.lower(): len(study.get_trials(deepcopy=False, states=(s,))) for s in TrialState}
    print(f"study '{study_name}': {counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed, "
          f"{counts['running']} running, {counts['waiting']} waiting; {elapsed:.0f} s this run", file=sys.stderr)
    _say_below_floor(study, spec, study_name)
    missing = counts["waiting"] + (spec.size - count_done(study, grid_keys(spec)) if spec.kind == "grid" else 0)
    if 0 < missing <= counts["running"] and not counts["waiting"]:
        # Independent workers (other machines, a SLURM array): the last points are being trained by the others.
        # Nothing is left for this one to do; if one of those workers has died, the next run retries its trial.
        print(f"study '{study_name}': the {missing} point(s) left are running in other workers", file=sys.stderr)
        return 0
    return 0 if missing <= 0 else 1
