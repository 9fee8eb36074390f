"""Run an Optuna study of residual-variant ablations.

    python -m ablations.run --study residual_variants              # the headline grid (default size)
    python -m ablations.run --study residual_variants --budget smoke --workers 2
    python -m ablations.run --study path/to/my_study.yaml --storage postgresql://user@host/db
    python -m ablations.run --list | --study NAME --dry-run

Rerunning continues a study: completed trials never run again; a trial whose worker died is retried with the
same parameters and resumes from its last checkpoint. Grid points added to the study file run on the next run;
points removed from it keep their finished trials. Watch it with ``optuna-dashboard <storage URL>`` and
``tensorboard --logdir results/runs/<study>``.

Exit status: 0 every point done (or, for the last points, running in other workers on the same study); 1 trials
failed or are missing, or the storage or the results folder failed
(one "error:" line); 2 bad input; 130 Ctrl-C (SIGINT); 143 SIGTERM (SLURM, Kubernetes, systemd stopping the job).
After 130 or 143 the trials that were running are marked failed with their checkpoints kept: rerunning the same
command retries them from there. See docs/reliability.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import json
import logging
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import layout
from .cli import OneLineParser
from .dashboard import check_loggers
from .gpu_hours import DEFAULT_GPU, DEVICE_RESULTS, GPU_CLASSES
from .overrides import RUN_ONLY, apply_sets, check_stored, describe, parse_sets, value_text
from .stopping import check_stopping, interrupted, stop_on_signals, stop_signal
from .storage import (
    DEFAULT_STORAGE,
    GRACE_S,
    HEARTBEAT_S,
    lost_storage_error,
    lost_storage_message,
    unusable_storage_error,
    unusable_storage_message,
)

#: Seconds per trial not proportional to FLOPs (Trainer set-up, data, logging) and effective train-step
#: GFLOP/s of this 2-core CPU for the small default models; calibrated on the residual_variants default run
#: (25 GFLOP/s when the FLOP count left out the MLP ratio and priced its mlp_ratio 2.0 at 4.0, 1.45x too many
#: FLOPs; 25 / 1.45 gives that run the same estimate with the true count).
TRIAL_OVERHEAD_S = 3.0
EFFECTIVE_GFLOPS = 17.2
#: Seconds the main process of ``--workers N`` gives its workers, after Ctrl-C or SIGTERM, to mark their trials
#: failed (checkpoints kept) before it kills them; a killed worker's trial is retried once its heartbeat is stale.
WORKER_STOP_S = 60
#: OS errors that say the results folder takes no more writes (a full disk or quota, a read-only mount, a file size
#: limit): the study stops with one line instead of failing every remaining trial the same way. EACCES / EPERM count
#: only for a path inside the results folder (a permission problem elsewhere, e.g. the data, is not about it).
FULL_OR_READ_ONLY = frozenset(getattr(errno, name) for name in ("ENOSPC", "EDQUOT", "EROFS", "EFBIG")
                              if hasattr(errno, name))
NO_PERMISSION = frozenset({errno.EACCES, errno.EPERM})
REMOVED = "removed_from_study_file"  # user attr of a WAITING trial set aside because its point left the study file
STOPPED = "stopped_by"  # user attr of a trial failed by Ctrl-C or SIGTERM: SIGINT | SIGTERM


class ResultsWriteError(Exception):
    """A trial could not write its files (checkpoint, event files) into the results folder: one line, exit 1."""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m ablations.run", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--study", help="a study name (see --list) or a path to a study .yaml file")
    p.add_argument("--budget", default="default", help="study size: smoke (CI, < 1 min), quick (minutes), default, paper (GPU)")
    p.add_argument("--storage", default=os.environ.get("ABLATIONS_STORAGE", DEFAULT_STORAGE),
                   help=f"Optuna storage URL (default {DEFAULT_STORAGE}, or $ABLATIONS_STORAGE)")
    p.add_argument("--study-name", help="name in the storage (default: the study's name, suffixed by the budget "
                                        "and the --set overrides)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="sets",
                   help="override a RunConfig field of the study's base (repeatable; the value read as YAML, e.g. "
                        "--set precision=32-true --set max_epochs=30); a field that changes results runs as its own "
                        "stored study, <study>+FIELD=VALUE+... (fields sorted; threads and data_dir exempt)")
    p.add_argument("--workers", type=int, default=1, help="local worker processes sharing the study (cores split)")
    p.add_argument("--results-dir", default=layout.RESULTS_DIR,
                   help=f"where TensorBoard runs go (<dir>/{layout.RUNS}/<study>/)")
    p.add_argument("--data-dir", help="data folder for folder datasets (cifar10, imagefolder, ...)")
    p.add_argument("--download", action="store_true",
                   help="download the study's datasets into --data-dir first where they are not there (cifar10, "
                        "cifar100, mnist, fashion_mnist, svhn; md5-checked; with --dry-run: say what would be fetched)")
    p.add_argument("--threads", type=int, help="torch threads per worker (default: cores // workers)")
    p.add_argument("--n-trials", type=int, help="search studies: trials to run (default: the study's n_trials)")
    p.add_argument("--heartbeat", type=int, default=HEARTBEAT_S, help="trial heartbeat interval, seconds")
    p.add_argument("--grace", type=int, default=GRACE_S, help="seconds without heartbeat before a trial is retried")
    p.add_argument("--logger", action="append", default=[], metavar="NAME", dest="loggers",
                   help="an extra logger per trial besides TensorBoard (repeatable): csv (<run>/csv/metrics.csv) or "
                        "mlflow (local SQLite store <results-dir>/runs/<study>/mlflow.db)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each trial's last.ckpt after it completes")
    p.add_argument("--list", action="store_true", help="list the studies with their sizes and exit")
    p.add_argument("--dry-run", action="store_true",
                   help="print the grid or search space, the estimated time here and the GPU-hours on --gpu")
    p.add_argument("--gpu", default=DEFAULT_GPU, choices=tuple(GPU_CLASSES),
                   help=f"--dry-run: the GPU class of the GPU-hours estimate (default {DEFAULT_GPU}); its MFU is "
                        f"measured when <results-dir>/{DEVICE_RESULTS}/ holds a device check or bench of a GPU, "
                        "else assumed")
    p.add_argument("--no-progress", action="store_true", help="no study-level progress bar")
    p.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--stage", default="report", choices=("tune", "report"), help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what the worker processes are started with
    restore_signals = stop_on_signals()
    excepthook = threading.excepthook  # _main installs its own (lost storage, write errors): undone on return
    try:
        return _main(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (see ablations.stopping)
        return interrupted()
    except ResultsWriteError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `--list | head`: the reader left; no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # the database went away mid-study: one line, not optuna's chained tracebacks
        error = lost_storage_error(exc)
        if error is not None:
            print(f"error: {lost_storage_message(args.storage, error)}", file=sys.stderr)
            return 1
        damaged = unusable_storage_error(exc)
        if damaged is not None:
            print(f"error: {unusable_storage_message(args.storage, damaged)}", file=sys.stderr)
            return 1
        write = write_error(exc, Path(args.results_dir))
        if write is None:
            raise
        print(f"error: cannot write the results folder: {_one_line(write)}; completed trials are kept: free space "
              "or make the folder writable, then rerun the same command", file=sys.stderr)
        return 1
    finally:
        restore_signals()
        threading.excepthook = excepthook  # a caller's process (a test, a notebook) keeps its own hook


def write_error(exc: BaseException, results_dir: Path | None = None) -> OSError | None:
    """The OSError behind ``exc`` (anywhere in its cause/context chain) that says the results folder takes no more
    writes (:data:`FULL_OR_READ_ONLY`; EACCES / EPERM for a path inside ``results_dir``); None for anything else."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in FULL_OR_READ_ONLY:
            return exc
        if isinstance(exc, OSError) and exc.errno in NO_PERMISSION and results_dir is not None:
            inside = [f for f in (exc.filename, exc.filename2) if f is not None and _inside(f, results_dir)]
            if inside:
                return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _inside(path, folder: Path) -> bool:
    try:
        return Path(os.fsdecode(path)).resolve().is_relative_to(folder.resolve())
    except (OSError, TypeError, ValueError):
        return False


def _no_thread_traceback_for_write_errors(results_dir: Path) -> None:
    """TensorBoard's event-file writer thread keeps its write error for the main thread, which raises it at its next
    write, and then re-raises it in the thread too, where Python prints a traceback. The main thread's error is the
    one line the CLI prints (:func:`_guarded`): print nothing for the thread's copy."""
    previous = threading.excepthook

    def hook(args) -> None:
        if args.exc_value is not None and write_error(args.exc_value, results_dir) is not None:
            return
        previous(args)

    threading.excepthook = hook


def _one_line(exc: BaseException) -> str:
    """An exception as one line; an OSError as ``[Errno N] reason: 'path'`` (a bytes path decoded)."""
    if isinstance(exc, OSError) and exc.errno is not None:
        text = f"[Errno {exc.errno}] {exc.strerror or os.strerror(exc.errno)}"
        paths = [f"'{os.fsdecode(f) if isinstance(f, (str, bytes, os.PathLike)) else f}'"
                 for f in (exc.filename, exc.filename2) if f is not None]
        return " ".join((text + (": " + " -> ".join(paths) if paths else "")).split())
    return " ".join(str(exc).split()) or type(exc).__name__


def _guarded(objective, log_root: Path):
    """The objective, with two kinds of failure that are not the trial's own told apart:

    - Ctrl-C / SIGTERM: the trial is marked :data:`STOPPED` before optuna marks it FAIL, so that the workers still
      running (on this machine or others) retry it at once (:func:`_retry_failed_points`), as they retry a dead
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
                f"trial {trial.number} cannot write its files in '{folder}': {_one_line(error)}; the trial is marked "
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


def _main(args: argparse.Namespace) -> int:
    from .spec import BUDGETS, available_studies, load_spec, tune_name

    if args.list:
        return _list(available_studies(), BUDGETS, load_spec)
    if not args.study:
        raise ValueError("--study is required (or --list); valid studies: " + ", ".join(available_studies()))
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    sets = parse_sets(args.sets)
    spec = apply_sets(load_spec(args.study, args.budget), sets)
    check_loggers(args.loggers)
    overrides = {k: v for k, v in sets.items() if k in RUN_ONLY} | _overrides(args)
    _validate_points(spec, overrides, check_data=False)  # the data folders after --download, and not in a dry run
    if args.download and args.worker_index is None:  # a dry run says what it would fetch
        from data.fetch import ensure_all

        ensure_all([(c.dataset, c.data_dir) for c in _data_configs(spec, overrides)], dry_run=args.dry_run)
    if args.dry_run:
        if sets:
            where = "its own study" if spec.overrides else "the study"
            print(f"--set {describe({k: value_text(k, v) for k, v in sets.items()})}: over the study's base (and "
                  f"its tuning stage's); stored as {where} '{args.study_name or spec.study_name}'"
                  + (" (threads, data_dir: run-only, not in the name)" if set(sets) & set(RUN_ONLY) else ""))
        return _dry_run(spec, overrides, gpu=args.gpu, results_dir=Path(args.results_dir), workers=args.workers,
                        stored=_stored_done(args.storage, args.study_name or spec.study_name, spec))
    for config in _data_configs(spec, overrides):
        _check_data(config)  # before anything is stored: a missing or malformed folder is one line

    from .storage import exit_when_heartbeat_fails, open_storage

    _quiet()
    storage = open_storage(args.storage, heartbeat_s=args.heartbeat, grace_s=args.grace)
    exit_when_heartbeat_fails(args.storage)
    _no_thread_traceback_for_write_errors(Path(args.results_dir))
    study_name = args.study_name or spec.study_name
    if args.worker_index is not None:
        if args.stage == "tune":
            return _work(spec.tune_stage(), storage, study_name, args, overrides)
        return _work(spec, storage, study_name, args, overrides, tuned=_stored_choice(storage, study_name))

    study = _create_study(spec, storage, study_name, seed=0)  # refuses a stored study of other overrides
    if spec.overrides:
        print(f"--set {describe(spec.overrides)}: its own stored study '{study_name}' (a study never mixes two "
              "configurations)", file=sys.stderr)
    if spec.tune is not None:
        stored = study.user_attrs.get(TUNE_GRID)
        if stored is not None and stored != spec.tune.as_dict():
            raise ValueError(f"study '{study_name}' chose its learning rates with the tuning grid {stored}; the study "
                             f"file now has {spec.tune.as_dict()}: its reported trials would mix two choices. Pass "
                             "--study-name NEW_NAME for a new study, or restore the file's tune section")
        if stored is None:
            tune = spec.tune_stage()
            code = _run_grid(tune, storage, tune_name(study_name), args, overrides, stage="tune")
            if code:
                print(f"study '{study_name}': the tuning stage is not complete; the reported grid waits for it "
                      "(rerun the same command)", file=sys.stderr)
                return code
            choice, means = choose_lrs(spec, _load(storage, tune_name(study_name)))
            study.set_user_attr(TUNED_LR, choice)
            study.set_user_attr(TUNE_MEANS, means)
            study.set_user_attr(TUNE_GRID, spec.tune.as_dict())
        print(f"study '{study_name}': learning rate per variant, chosen on tuning seeds {list(spec.tune.seeds)} by "
              f"mean {spec.tune.metric}: " + "; ".join(f"{_cell_text(k)} {v:g}" for k, v in
                                                        study.user_attrs[TUNED_LR].items()), file=sys.stderr)
    return _run_grid(spec, storage, study_name, args, overrides, study=study)


TUNED_LR, TUNE_MEANS, TUNE_GRID = "tuned_lr", "tune_means", "tune_grid"  # study user attrs of the tuning stage


def _run_grid(spec, storage, study_name: str, args, overrides: dict, *, stage: str = "report", study=None) -> int:
    """One stage of a study: create (or continue) it, enqueue its grid, and train it with ``--workers`` workers."""
    from .dashboard import write_study_hparams
    from .training import HP_METRICS

    study = study or _create_study(spec, storage, study_name, seed=0)
    write_study_hparams(layout.runs_dir(args.results_dir, study_name), spec, HP_METRICS)
    if spec.kind == "grid":
        for params in spec.grid():
            study.enqueue_trial(params, skip_if_exists=True)
        _follow_study_file(study, spec, storage)
        _retry_failed_points(study, spec, storage)
    total = spec.size if spec.kind == "grid" else (args.n_trials or spec.n_trials)
    print(f"study '{study_name}' ({spec.kind}{', tuning stage' if stage == 'tune' else ''}, {total} trials) in "
          f"{_redact(args.storage)}; TensorBoard: tensorboard --logdir {layout.runs_dir(args.results_dir, study_name)}",
          file=sys.stderr)
    _measure_modes(spec, overrides, Path(args.results_dir))
    started = time.time()
    tuned = None if stage == "tune" else _stored_choice(storage, study_name)
    if args.workers == 1:
        _work(spec, storage, study_name, args, overrides, progress_total=None if args.no_progress else total,
              tuned=tuned)
    else:
        _spawn_workers(args, storage, study_name, total, _grid_keys(spec), stage=stage)
    return _finish(study_name, storage, spec, time.time() - started)


def _load(storage, study_name: str):
    import optuna

    return optuna.load_study(study_name=study_name, storage=storage)


def _stored_choice(storage, study_name: str) -> dict[str, float] | None:
    """The learning rates the tuning stage chose, as stored with the study (None: the study has no tuning stage)."""
    return _load(storage, study_name).user_attrs.get(TUNED_LR)


def _cell_text(key: str) -> str:
    variant, cell = json.loads(key)
    return variant + "".join(f" {axis}={value}" for axis, value in cell) + ":"


def choose_lrs(spec, study) -> tuple[dict[str, float], dict[str, dict[str, float | None]]]:
    """Each cell's learning rate (:meth:`StudySpec.tune_key`: the variant and its other axes) from the tuning stage's
    ``study``: the one whose tuning trials have the highest mean ``spec.tune.metric`` (a validation metric) over
    the tuning seeds; a diverged run counts as 0; ties go to the rate listed first. Returns (choice,
    cell -> {lr: mean}); a point of the tuning grid without a completed trial is a ValueError."""
    from optuna.trial import TrialState

    tune_spec, metric = spec.tune_stage(), spec.tune.metric

    values: dict[tuple[str, float], list[float]] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get("surplus") or "duplicate_of" in t.user_attrs:
            continue
        params = t.system_attrs.get("fixed_params", t.params)
        value = t.user_attrs.get(metric)
        ok = value is not None and math.isfinite(value) and not t.user_attrs.get("diverged")
        values.setdefault((spec.tune_key(params), float(params["lr"])), []).append(float(value) if ok else 0.0)
    means: dict[str, dict[str, float | None]] = {}
    for params in tune_spec.grid():
        key, lr = spec.tune_key(params), float(params["lr"])
        runs = values.get((key, lr), [])
        means.setdefault(key, {})[repr(lr)] = sum(runs) / len(runs) if runs else None
    choice = {}
    for key, by_lr in means.items():
        missing = [lr for lr, mean in by_lr.items() if mean is None]
        if missing:
            raise ValueError(f"tuning stage incomplete: {_cell_text(key)} no result at lr {', '.join(missing)}")
        choice[key] = float(max(by_lr, key=lambda lr: (by_lr[lr], -list(by_lr).index(lr))))
    return choice, means


def _measure_modes(spec, overrides: dict, results_dir: Path) -> None:
    """Precision ``auto`` on a CPU whose signature no modes table matches: measure the cells the study's points need
    once, here, before any worker starts (``ablations.modes``; cached under ``<results_dir>/device/``), so that the
    workers find them instead of each measuring while the others train. One line per cell measured. Torch is
    imported only when a cell has to be measured (a matching table or the cache answers without it)."""
    from data import dataset_shape

    from .modes import choose_mode, model_size, probe, tokens

    threads = overrides.get("threads") or os.cpu_count() or 1
    points = spec.grid() if spec.kind == "grid" else [{"variant": v.label} for v in spec.variants]
    seen = set()
    for params in points:
        config = spec.run_config(params, overrides)
        if config.precision != "auto" or config.accelerator not in ("auto", "cpu"):
            continue
        shape = dataset_shape(config)
        patch = config.patch_size or shape["patch_size"]
        cell = (config.embed_dim, tokens(shape["img_size"], patch))
        if cell in seen or not choose_mode("cpu", *cell, results_dir=results_dir, threads=threads).source.startswith(
                "rule:"):
            continue
        seen.add(cell)
        import torch

        if torch.cuda.is_available():  # accelerator auto trains on the GPU: its rule needs no measurement
            return
        size = model_size(config, shape["img_size"], patch, shape["in_chans"], shape["num_classes"])
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            mode = choose_mode("cpu", *cell, results_dir=results_dir, threads=threads,
                               measure=probe(size, config.batch_size))
        finally:
            torch.set_num_threads(before)
        if "(measured now)" in mode.source:  # not when another process measured it while this one waited
            print(f"precision auto, width {cell[0]}, {cell[1]} tokens, {threads} thread(s): measured the four "
                  f"modes here, {mode.key} ({mode.source})", file=sys.stderr)


def _retry_failed_points(study, spec, storage, *, only_stopped: bool = False) -> None:
    """Queue a retry (same parameters, same run folder, so it resumes from its last checkpoint) of every grid
    point whose trials all FAILed: an exception in training, Ctrl-C, SIGTERM. ``enqueue_trial(...,
    skip_if_exists=True)`` counts a FAIL trial as existing, so without this such a point never ran again and every
    rerun exited 1. Dead workers' trials are still RUNNING here; the heartbeat check retries those. The retry
    callback's ``max_retry`` bounds the attempts per point. Each run does this once at its start; running workers
    do it between trials with ``only_stopped``, for the trials that Ctrl-C or SIGTERM stopped (:data:`STOPPED`),
    so that the other workers of a study take over a preempted worker's trial (a trial that failed by itself is
    retried once per run, not by every worker in a row)."""
    import copy

    from optuna.trial import TrialState

    retry = storage.get_heartbeat_stale_trial_callback()
    if retry is None:
        return
    grid = {_point_key(p) for p in spec.grid()}
    live, failed = set(), {}
    for t in study.get_trials(deepcopy=False):
        key = _point_key(t.system_attrs.get("fixed_params", t.params))
        if t.state == TrialState.FAIL:
            if key in grid and (key not in failed or t.number > failed[key].number):
                failed[key] = t
        elif t.state != TrialState.PRUNED or not ({"surplus", "duplicate_of"} & set(t.user_attrs)):
            live.add(key)
    queued, exhausted = [], []
    for key, t in failed.items():
        if key in live or (only_stopped and not t.user_attrs.get(STOPPED)):
            continue
        before = len(study.get_trials(deepcopy=False))
        retry(study, copy.deepcopy(t))  # adds a WAITING copy unless the point used up its retries
        (queued if len(study.get_trials(deepcopy=False)) > before else exhausted).append(str(t.number))
    if queued:
        print(f"retrying failed trial(s) {', '.join(queued)} (same parameters)", file=sys.stderr)
    if exhausted and not only_stopped:
        print(f"not retrying failed trial(s) {', '.join(exhausted)}: retries used up", file=sys.stderr)


def _point_key(params: dict) -> str:
    return repr(sorted(params.items()))


def _grid_keys(spec) -> set[str] | None:
    return {_point_key(p) for p in spec.grid()} if spec.kind == "grid" else None


def _follow_study_file(study, spec, storage) -> None:
    """Make the stored grid follow an edited study file. Points added to the file have just been enqueued (only
    those: ``skip_if_exists``), so a rerun runs just them. A point removed from the file keeps its finished trials
    (the report still includes them: pass --study-name NEW_NAME for a study of the new grid alone), but its WAITING
    trials are set aside (:func:`_set_aside_removed`) instead of running; a point added back later is enqueued again.
    Changed variants, or an axis that changes kind, are refused before this (:func:`_check_same_choices`)."""
    from optuna.trial import TrialState

    grid = {_point_key(p): p for p in spec.grid()}
    set_aside = _set_aside_removed(study, storage, set(grid))
    if set_aside:
        print(f"not running waiting trial(s) {', '.join(map(str, set_aside))}: their grid points are no longer in "
              "the study file", file=sys.stderr)
    taken, kept = set(), 0
    for t in study.get_trials(deepcopy=False):
        key = _point_key(t.system_attrs.get("fixed_params", t.params))
        if t.user_attrs.get(REMOVED):
            continue
        if key in grid:
            taken.add(key)
        elif t.state == TrialState.COMPLETE:
            kept += 1
    for key in [k for k in grid if k not in taken]:  # only trials set aside had this point: it is back in the file
        study.enqueue_trial(grid[key])
    if kept:
        print(f"{kept} completed trial(s) of grid points no longer in the study file stay in the storage (the report "
              "includes them)", file=sys.stderr)


def _set_aside_removed(study, storage, grid: set[str]) -> list[int]:
    """PRUNE the WAITING trials of points that are not in the grid (``surplus`` and :data:`REMOVED` set: the report
    and the progress count skip them) and return their numbers. Each is claimed first (WAITING -> RUNNING, which
    fails if a worker has just taken it), so a trial that has started is never touched."""
    from optuna.trial import TrialState

    numbers = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if _point_key(t.system_attrs.get("fixed_params", t.params)) in grid:
            continue
        if storage.set_trial_state_values(t._trial_id, TrialState.RUNNING):
            storage.set_trial_user_attr(t._trial_id, "surplus", True)
            storage.set_trial_user_attr(t._trial_id, REMOVED, True)
            storage.set_trial_state_values(t._trial_id, TrialState.PRUNED)
            numbers.append(t.number)
    return numbers


def _quiet() -> None:
    """Study output is the progress bar and one line per event: silence per-trial Lightning chatter."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optimize_log = logging.getLogger("optuna.study._optimize")
    if not any(isinstance(f, _QuietStops) for f in optimize_log.filters):
        optimize_log.addFilter(_QuietStops())
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message=r".*(LeafSpec|litlogger|does not have many workers).*")


def _overrides(args: argparse.Namespace) -> dict:
    overrides = {}
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.workers)
    if args.workers > 1 or args.threads:
        overrides["threads"] = threads
    return overrides


def _validate_points(spec, overrides: dict, check_data: bool = True) -> None:
    """Build every grid point's config (and check its residual options and, with ``check_data``, its data
    folder) before anything is stored; the tuning stage's points too."""
    if check_data:
        for config in _data_configs(spec, overrides):
            _check_data(config)
    if spec.tune is not None:
        _validate_points(spec.tune_stage(), overrides, check_data=False)
        spec = dataclasses.replace(spec, tune=None)  # its points' lr comes from the tuning stage
    _make_pruner(spec)
    points = spec.grid() if spec.kind == "grid" else [{"variant": v.label} for v in spec.variants]
    seen = set()
    for params in points:
        config = spec.run_config(params, overrides)
        key = (config.residual, repr(sorted(config.residual_options.items())), config.depth, config.embed_dim,
               config.class_attention_blocks)
        if key not in seen:
            seen.add(key)
            _check_residual(config)


def _data_configs(spec, overrides: dict) -> list:
    """One config per distinct (dataset, data_dir, dataset_options) the study's points (and its tuning stage's)
    train on."""
    specs = [spec] + ([spec.tune_stage()] if spec.tune is not None else [])
    found = {}
    for stage in specs:
        points = stage.grid() if stage.kind == "grid" else [{"variant": v.label} for v in stage.variants]
        for params in points:
            config = stage.run_config(params, overrides)
            found.setdefault((config.dataset, config.data_dir, repr(sorted(config.dataset_options.items()))), config)
    return list(found.values())


def _check_data(config) -> None:
    """Constructing a DataModule checks its folder (missing / malformed: data.DataError) without loading data."""
    import data

    try:
        data.build_datamodule(config.dataset, data_dir=config.data_dir, **config.dataset_options)
    except TypeError as exc:
        raise ValueError(f"invalid dataset option for '{config.dataset}': {exc}") from None


def _check_residual(config) -> None:
    from lit_modules import RESIDUALS

    variant = RESIDUALS[config.residual]
    options = variant.validate_options(dict(config.residual_options),
                                       backbone={"class_attention_blocks": config.class_attention_blocks})
    variant.check_options(options, dim=config.embed_dim, depth=config.depth)


def _create_study(spec, storage, study_name: str, seed: int):
    import optuna

    sampler = optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(storage=storage, study_name=study_name, direction=spec.direction, sampler=sampler,
                                pruner=_make_pruner(spec), load_if_exists=True)
    _check_same_choices(study, spec)
    check_stored(study, spec)
    if study.metric_names is None:
        study.set_metric_names([spec.metric])
    for key, value in (("spec_source", spec.source), ("budget", spec.budget), ("kind", spec.kind),
                       ("description", spec.description), ("metric", spec.metric)):
        study.set_user_attr(key, value)
    return study


def _make_pruner(spec):
    """The study's pruner, only the one its file names (each takes different options); ValueError (one line) for
    an option it does not take."""
    import optuna

    options = {k: v for k, v in spec.pruner.items() if k != "type"}
    try:
        if spec.pruner["type"] == "median":
            return optuna.pruners.MedianPruner(**options)
        if spec.pruner["type"] == "hyperband":
            return optuna.pruners.HyperbandPruner(**({"max_resource": spec.base.get("max_epochs", 30)} | options))
        return optuna.pruners.NopPruner()
    except TypeError as exc:
        raise ValueError(f"study file '{spec.source}': pruner {spec.pruner}: {exc}") from None


def _check_same_choices(study, spec) -> None:
    """Optuna fixes a parameter's kind for the life of a study, and a categorical's choices: a study file whose
    variants (or label axes, or searched choices) changed, or whose numeric axis changed kind (integers to numbers,
    a linear range to a log one), cannot continue the stored study (its first new trial would FAIL with e.g.
    "CategoricalDistribution does not support dynamic value space"). Say so before anything is written. New values
    of a numeric axis (another seed or depth) are fine: the rerun runs just the new points."""
    from optuna.distributions import CategoricalDistribution, check_distribution_compatibility

    from .objective import categorical_axes

    expected = _expected_distributions(spec, categorical_axes(study, spec))
    stored = {(name, dist) for t in study.get_trials(deepcopy=False) for name, dist in t.distributions.items()}
    for name, old in sorted(stored, key=lambda item: item[0]):
        new = expected.get(name)
        if new is None:
            continue
        try:
            check_distribution_compatibility(old, new)
        except ValueError as exc:
            if isinstance(old, CategoricalDistribution) and isinstance(new, CategoricalDistribution):
                raise ValueError(
                    f"study '{study.study_name}' in the storage was run with {name} = {list(old.choices)}, the study "
                    f"file has {list(new.choices)}; a study's choices cannot change: pass --study-name NEW_NAME for a "
                    "new study, or restore the file") from None
            raise ValueError(
                f"study '{study.study_name}' in the storage was run with {name} as {_describe(old)}, the study file "
                f"makes it {_describe(new)} ({exc}); pass --study-name NEW_NAME for a new study, or restore the file"
            ) from None


def _expected_distributions(spec, categorical: frozenset[str]) -> dict:
    """Each parameter's distribution as the objective will suggest it (:func:`ablations.objective.suggest`)."""
    from .objective import suggest

    found: dict = {}
    for variant in spec.variants:
        recorder = _Recorder(variant.label)
        suggest(recorder, spec, categorical)
        found |= recorder.found
    return found


class _Recorder:
    """Stands in for an Optuna trial in ``suggest``: records the distribution each parameter would get."""

    def __init__(self, variant: str) -> None:
        self.variant = variant
        self.found: dict = {}

    def _record(self, name: str, make) -> None:
        try:
            self.found[name] = make()
        except ValueError:  # an invalid range: the trial itself reports it
            pass

    def suggest_categorical(self, name, choices):
        from optuna.distributions import CategoricalDistribution

        self._record(name, lambda: CategoricalDistribution(choices))
        return self.variant if name == "variant" else choices[0]

    def suggest_int(self, name, low, high, step=1, log=False):
        from optuna.distributions import IntDistribution

        self._record(name, lambda: IntDistribution(low, high, log=log, step=step))
        return low

    def suggest_float(self, name, low, high, *, step=None, log=False):
        from optuna.distributions import FloatDistribution

        self._record(name, lambda: FloatDistribution(low, high, log=log, step=step))
        return low


def _describe(dist) -> str:
    from optuna.distributions import CategoricalDistribution, IntDistribution

    if isinstance(dist, CategoricalDistribution):
        return f"one of {list(dist.choices)}"
    kind = "an integer" if isinstance(dist, IntDistribution) else "a number"
    return f"{kind} in [{dist.low}, {dist.high}]" + (" on a log scale" if dist.log else "")


def _work(spec, storage, study_name: str, args, overrides: dict, progress_total: int | None = None,
          tuned: dict[str, float] | None = None) -> int:
    """One worker: take enqueued grid points (or sample search points) until none are left."""
    import optuna
    from optuna.trial import TrialState

    from .objective import Objective

    index = args.worker_index or 0
    study = _create_study(spec, storage, study_name, seed=index)  # a distinct sampler seed per worker
    log_root = layout.runs_dir(args.results_dir, study_name)
    objective = Objective(spec, log_root=log_root, overrides=overrides, keep_checkpoints=args.keep_checkpoints,
                          loggers=tuple(args.loggers), results_dir=args.results_dir, tuned=tuned)
    objective = _guarded(objective, log_root)
    grid = _grid_keys(spec)
    bar = _progress(study, progress_total, grid)
    try:
        while True:
            check_stopping()
            optuna.storages.fail_stale_trials(study)
            if spec.kind == "grid":
                _retry_failed_points(study, spec, storage, only_stopped=True)  # e.g. a preempted worker's trial
                if not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                    break
            elif _search_budget_spent(study, args.n_trials or spec.n_trials):
                break
            study.optimize(objective, n_trials=1, gc_after_trial=True, catch=(RuntimeError,))
            if bar is not None:
                bar.n = _done(study, grid)
                bar.refresh()
    finally:
        if bar is not None:
            bar.close()
    return 0


def _search_budget_spent(study, n_trials: int) -> bool:
    """A search has its ``n_trials`` once that many trials are done, running, or failed for good, and no retry waits.
    A failed trial whose parameters were re-enqueued (a killed worker's, :func:`ablations.storage.open_storage`'s
    retry callback) is replaced by its retry, so it does not use up a trial; one that failed by itself and was not
    retried does (never loop on failures)."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    if any(t.state == TrialState.WAITING for t in trials):
        return False
    retried = {t.system_attrs.get("failed_trial") for t in trials}
    counted = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    return sum(t.state in counted or (t.state == TrialState.FAIL and t.number not in retried)
               for t in trials) >= n_trials


def _done(study, grid: set[str] | None = None) -> int:
    """Trials done (COMPLETE or PRUNED, not surplus or duplicate); for a grid, the points of ``grid`` done (trials
    of points removed from the study file do not count)."""
    from optuna.trial import TrialState

    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
            if not t.user_attrs.get("surplus") and "duplicate_of" not in t.user_attrs]
    if grid is None:
        return len(done)
    return len({key for t in done if (key := _point_key(t.system_attrs.get("fixed_params", t.params))) in grid})


def _progress(study, total: int | None, grid: set[str] | None = None):
    if total is None:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=_done(study, grid), desc=study.study_name, unit="trial", dynamic_ncols=True)


def _spawn_workers(args, storage, study_name: str, total: int, grid: set[str] | None = None,
                   stage: str = "report") -> None:
    """N local processes on the same study, each with its share of the cores and its own sampler seed. On Ctrl-C
    or SIGTERM the workers are stopped the same way (:func:`_stop_workers`) before this process exits."""
    import optuna

    argv = [a for a in args.argv if a != "--no-progress"]
    procs, bar = [], None
    try:
        for i in range(args.workers):
            procs.append(subprocess.Popen([sys.executable, "-m", "ablations.run", *argv, "--worker-index", str(i),
                                           "--no-progress", "--study-name", study_name, "--stage", stage]))
        if not args.no_progress:
            bar = _progress(optuna.load_study(study_name=study_name, storage=storage), total, grid)
        while any(p.poll() is None for p in procs):
            check_stopping()
            time.sleep(2)
            if bar is not None:
                bar.n = _done(optuna.load_study(study_name=study_name, storage=storage), grid)
                bar.refresh()
    except KeyboardInterrupt:
        _stop_workers(procs)
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
            p.kill()
            p.wait()


def _finish(study_name: str, storage, spec, elapsed: float) -> int:
    import optuna
    from optuna.trial import TrialState

    study = optuna.load_study(study_name=study_name, storage=storage)
    counts = {s.name.lower(): len(study.get_trials(deepcopy=False, states=(s,))) for s in TrialState}
    print(f"study '{study_name}': {counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed, "
          f"{counts['running']} running, {counts['waiting']} waiting; {elapsed:.0f} s this run", file=sys.stderr)
    missing = counts["waiting"] + (spec.size - _done(study, _grid_keys(spec)) if spec.kind == "grid" else 0)
    if 0 < missing <= counts["running"] and not counts["waiting"]:
        # Independent workers (other machines, a SLURM array): the last points are being trained by the others.
        # Nothing is left for this one to do; if one of those workers has died, the next run retries its trial.
        print(f"study '{study_name}': the {missing} point(s) left are running in other workers", file=sys.stderr)
        return 0
    return 0 if missing <= 0 else 1


def _list(studies: dict, budgets: tuple, load_spec) -> int:
    print(f"{'study':<20} {'kind':<7} " + " ".join(f"{b:>8}" for b in budgets) + "  description")
    for name in studies:
        specs = [load_spec(name, b) for b in budgets]
        print(f"{name:<20} {specs[0].kind:<7} " + " ".join(f"{s.size:>8}" for s in specs)
              + f"  {specs[0].description[:70]}")
    return 0


def _stored_done(url: str, study_name: str, spec) -> tuple[int, int, str] | None:
    """(tuning trials done, reported trials done, where) of the study as stored at ``url``, for a dry run's "what is
    left": None when nothing is stored yet (a SQLite file that does not exist is not created) or the storage cannot
    be read (the dry run then prices the whole study)."""
    import optuna

    from .spec import tune_name
    from .storage import sqlite_path

    path = sqlite_path(url)
    if path is not None and not path.is_file():
        return None
    def done(name: str, stage) -> int:
        try:
            return _done(optuna.load_study(study_name=name, storage=url), _grid_keys(stage))
        except KeyError:  # no such study stored yet
            return 0

    _quiet()
    try:
        tune_done = done(tune_name(study_name), spec.tune_stage()) if spec.tune is not None else 0
        report_done = done(study_name, spec)
    except Exception:  # noqa: BLE001 - a dry run never fails on the storage: it just cannot say what is done
        return None
    return (tune_done, report_done, _redact(url)) if tune_done or report_done else None


def _dry_run(spec, overrides: dict, gpu: str = DEFAULT_GPU, results_dir: Path = Path(layout.RESULTS_DIR),
             workers: int = 1, stored: tuple[int, int, str] | None = None) -> int:
    """Print the grid (or search space), the recipe, the estimated time on this machine with ``workers`` workers
    (:func:`estimate_seconds`) and the GPU-hours on class ``gpu`` (:mod:`ablations.gpu_hours`; measurements read
    from ``<results_dir>/device``). ``stored`` (:func:`_stored_done`): the trials a stored study has done, which
    the estimate leaves out (a run resumes with the rest). Trains nothing."""
    from .gpu_hours import describe_estimate, estimate, recipe_line

    tune_size = 0
    if spec.tune is not None:
        tune = spec.tune_stage()
        tune_size = tune.size
        print(f"tuning stage {tune.study_name}: {tune.size} trials first (each variant x "
              + "".join(f"{a} {v} x " for a, v in tune.axes.items() if a not in ("seed", "lr"))
              + f"lr {list(spec.tune.lr)} x tuning seeds {list(spec.tune.seeds)}); each variant's lr = the highest "
              f"mean {spec.tune.metric}; the reported grid below then trains at it")
    print(f"study {spec.study_name}: {spec.kind}, {spec.size} trials, metric {spec.metric} ({spec.direction})")
    tune_done, report_done = stored[:2] if stored else (0, 0)
    if stored:
        print(f"stored in {stored[2]}: {report_done} of the {spec.size} reported trials done"
              + (f" and {tune_done} of the {tune_size} tuning trials" if tune_size else "")
              + "; a run continues with the rest")
    if spec.kind == "grid":
        points = spec.grid()
        for params in points:
            print("  " + ", ".join(f"{k}={v}" for k, v in params.items()))
    else:
        points = [{"variant": v.label} for v in spec.variants]
        for label, space in spec.space.items():
            print(f"  {label}: " + "; ".join(f"{k} ~ {v}" for k, v in space.items()))
        print(f"  pruner: {spec.pruner}")
    configs = [spec.run_config(p, overrides) for p in points]
    names = sorted({c.recipe for c in configs})
    print(recipe_line(configs[0]) + (f" (first point; the points use recipes {', '.join(names)})"
                                     if len(names) > 1 else ""))
    print(_auto_line(configs[0], overrides, results_dir))
    threads = overrides.get("threads") or max(1, (os.cpu_count() or 1) // workers)
    rates = [measured_rate(config, threads, results_dir) for config in configs]
    seconds = [estimate_seconds(config, rate[0] if rate else None) for config, rate in zip(configs, rates, strict=True)]
    per_trial = sum(seconds) / len(seconds)
    trials = spec.size + tune_size
    left = trials - report_done - tune_done
    total = per_trial * left / workers
    count = f"{left} of {trials} trials left" if stored else f"{trials} trials" if tune_size else ""
    count += " with the tuning stage" if count and tune_size else ""
    measured = [rate for rate in rates if rate]
    basis = (f"this CPU's measured train step ({measured[0][1]}) at {measured[0][0] / 1e9:.3g} GFLOP/s"
             if len(measured) == len(rates) else
             f"a rough FLOP-based estimate at {EFFECTIVE_GFLOPS:.0f} GFLOP/s (no measured train step of this CPU "
             "for every cell yet: a run measures them first)")
    print(f"estimated time on this machine: {_duration(total)} ({_duration(per_trial)} per trial"
          + (f", {count}" if count else "")
          + f"; {workers} worker(s) x {threads} thread(s); {basis}, + {TRIAL_OVERHEAD_S:.0f} s per trial)")
    for line in describe_estimate(estimate(configs, trials, gpu, results_dir)):
        print(line)
    return 0


def _auto_line(config, overrides: dict, results_dir: Path) -> str:
    """What precision ``auto`` will train the (first) point in on this machine's CPU: a table or cache that matches
    this CPU's signature, or a measurement the study makes before its first trial."""
    if config.precision != "auto":
        return f"precision: {config.precision} (fixed by the study)"
    from data import dataset_shape

    from .modes import choose_mode, tokens

    shape = dataset_shape(config)
    count = tokens(shape["img_size"], config.patch_size or shape["patch_size"])
    threads = overrides.get("threads") or os.cpu_count() or 1
    mode = choose_mode("cpu", config.embed_dim, count, results_dir=results_dir, threads=threads)
    if mode.source.startswith("rule:"):
        return (f"precision auto on this CPU ({threads} thread(s)): no table matches this CPU; the run measures the "
                "four modes of each model size first (seconds) and caches them under "
                f"{results_dir / 'device'}")
    return f"precision auto on this CPU ({threads} thread(s)): {mode.key} ({mode.source})"


def _duration(seconds: float) -> str:
    """``42.0 s``, ``12.5 min``, ``3.2 h`` or ``1,540 days``: the unit a reader takes in at a glance."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} days"


def estimate_seconds(config, flops_per_s: float | None = None) -> float:
    """Wall time of one trial on this machine: its training FLOPs (3× forward per training image, 1× per val and
    test image, × epochs: :func:`ablations.gpu_hours.training_flops`) at ``flops_per_s`` (:func:`measured_rate`;
    default the rough calibrated :data:`EFFECTIVE_GFLOPS`), plus a fixed per-trial overhead."""
    from .gpu_hours import training_flops

    return TRIAL_OVERHEAD_S + training_flops(config) / (flops_per_s or EFFECTIVE_GFLOPS * 1e9)


def measured_rate(config, threads: int, results_dir: Path) -> tuple[float, str] | None:
    """(training FLOP/s, where) of this CPU for ``config``'s cell on ``threads`` threads, from the train step that
    precision ``auto`` measured and cached (:func:`ablations.modes.measured_step`: a ``standard`` model of the
    probe's depth, MLP ratio and batch, 3× its forward FLOPs per image); None for a GPU run, a fixed precision, or
    a cell not measured yet."""
    if config.precision != "auto" or config.accelerator not in ("auto", "cpu"):
        return None
    from data import dataset_shape

    from .gpu_hours import forward_flops
    from .modes import measured_step, tokens

    shape = dataset_shape(config)
    step = measured_step(config.embed_dim, tokens(shape["img_size"], config.patch_size or shape["patch_size"]),
                         threads=threads, results_dir=results_dir)
    if step is None:
        return None
    probe = dataclasses.replace(config, residual="standard", residual_options={}, depth=step["depth"],
                                mlp_ratio=step["mlp_ratio"])
    return 3 * forward_flops(probe, shape) * step["batch"] / step["seconds"], f"{step['mode']}, {step['path']}"


def _redact(url: str) -> str:
    from .storage import _redact as redact

    return redact(url)


if __name__ == "__main__":
    raise SystemExit(main())
