"""Run an Optuna study of residual-variant ablations.

    python -m ablations.run --study residual_variants              # the headline grid (default size)
    python -m ablations.run --study residual_variants --budget smoke --workers 2
    python -m ablations.run --study path/to/my_study.yaml --storage postgresql://user@host/db
    python -m ablations.run --list | --study NAME --dry-run

Rerunning continues a study: completed trials never run again; a trial whose worker died is retried with the
same parameters and resumes from its last checkpoint. Grid points added to the study file run on the next run;
points removed from it keep their finished trials. ``--import-runs results/NAME/runs.csv`` continues a study whose
storage is elsewhere or gone from the runs.csv of its report: those trials count as done. Watch it with
``optuna-dashboard <storage URL>`` and ``tensorboard --logdir outputs/runs/<study>/agg``.

Exit status: 0 every point done (or, for the last points, running in other workers on the same study); 1 trials
failed or are missing, or the storage or the results folder failed
(one "error:" line); 2 bad input; 130 Ctrl-C (SIGINT); 143 SIGTERM (SLURM, Kubernetes, systemd stopping the job)
or the end of ``--time-budget``. After 130 or 143 the trials that were running are marked failed with their checkpoints kept: rerunning the same
command retries them from there. See docs/reliability.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
from pathlib import Path

import data

from .. import layout
from ..cli import OneLineParser, add_study_arguments, duration, folder_storage, make_storage_folder, program
from ..dashboard import check_loggers
from ..machine import allocator
from ..pricing.gpu_hours import DEFAULT_GPU, DEVICE_RESULTS, GPU_CLASSES
from ..studies.budgets import budget_line
from ..studies.overrides import RUN_ONLY, apply_sets, describe, parse_sets, value_text
from ..studies.spec import BUDGETS, TUNE_GRID, available_studies, load_spec, parent_name, tune_name
from ..studies.stopping import interrupted, stop_after, stop_on_signals
from ..studies.storage import (
    GRACE_S,
    HEARTBEAT_S,
    check_url,
    exit_when_heartbeat_fails,
    lost_storage_error,
    lost_storage_message,
    open_storage,
    unusable_storage_error,
    unusable_storage_message,
)
from .contend import prepare as prepare_contend
from .contend import stored_points
from .imported import check_retrain_modes, imported_done, retrain_rule
from .plan import dry_run, stored_done
from .rounds import prepare as prepare_round
from .rounds import stored_points as stored_round_points
from .study import (
    Stored,
    check_data_folder,
    create_study,
    data_configs,
    earlier_forms_warning,
    load_study,
    stored_choice,
    validate_points,
)
from .tuning import check_tuning_grid, settle_rates, stored_extra
from .workers import quiet, run_grid, work
from .write_errors import ResultsWriteError, one_line, write_error

# torch (about 1.7 s, measured with python -X importtime beside the 0.5 s of `python -m ablations.run --help`) and
# data.fetch (which imports torch) are imported where they are used, so that --help, --list and a bad flag answer at
# once.


#: ``--until``'s stages, in order, and what is left after each
UNTIL = ("tune", "report", "contend")
LEFT_AFTER = {"tune": "the reported grid, its contending rates and a second look",
              "report": "the contending rates and a second look", "contend": "a second look"}
STAGE_NAMES = {"tune": "tuning stage", "report": "reported grid", "contend": "contending rates"}


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=program("ablations.run"), description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    add_study_arguments(p)
    p.add_argument("--workers", type=int,
                   help="local worker processes sharing the study (cores split); default: the fastest layout here, "
                        "one worker per core with one thread each for trials on the CPU, one for trials on a GPU")
    p.add_argument("--results-dir", default=layout.OUTPUT_DIR,
                   help=f"where TensorBoard runs go (<dir>/{layout.RUNS}/<study>/; default {layout.OUTPUT_DIR}, which "
                        f"git ignores; the committed studies are in {layout.RESULTS_DIR})")
    p.add_argument("--data-dir", help="data folder for folder datasets (cifar10, imagefolder, ...; fashion_mnist: "
                                      "optional, also found in Debian's dataset-fashion-mnist folder)")
    p.add_argument("--download", action="store_true",
                   help="download the study's datasets into --data-dir first where they are not there (cifar10, "
                        "cifar100, mnist, fashion_mnist, svhn; md5-checked; with --dry-run: say what would be fetched)")
    p.add_argument("--threads", type=int, help="torch threads per worker (default: cores // workers)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default=None,
                   help="where every trial trains (default: the study's accelerator, auto = CUDA when torch sees it)")
    p.add_argument("--engine", default=os.environ.get("ABLATIONS_ENGINE", "auto"), choices=("auto", "plain", "stacked"),
                   help="plain: one Lightning run per trial; stacked: the waiting trials of a cell (its seeds, or its "
                        "learning rates) trained as one stacked model, each still its own trial (docs/gpu-engine.md); "
                        "auto (default; ABLATIONS_ENGINE sets another): stacked on CUDA, and on a CPU where it "
                        "measured >= 10%% faster per trial")
    p.add_argument("--stack", type=int, metavar="K", help="--engine stacked/auto: at most K trials per stack "
                   "(default: 32 on CUDA, 8 on a CPU)")
    p.add_argument("--n-trials", type=int, help="search studies: trials to run (default: the study's n_trials)")
    p.add_argument("--heartbeat", type=int, default=HEARTBEAT_S, help="trial heartbeat interval, seconds")
    p.add_argument("--grace", type=int, default=GRACE_S, help="seconds without heartbeat before a trial is retried")
    p.add_argument("--logger", action="append", default=[], metavar="NAME", dest="loggers",
                   help="an extra logger per trial besides TensorBoard (repeatable): csv (<run>/csv/metrics.csv), "
                        "mlflow (local SQLite store <results-dir>/runs/<study>/mlflow.db) or wandb (Weights & Biases, "
                        "project <study>, a row's seeds grouped; offline unless you are logged in or WANDB_MODE says "
                        "otherwise: <results-dir>/runs/<study>/wandb)")
    p.add_argument("--import-runs", metavar="RUNS_CSV",
                   help="continue the study from a runs.csv of its report made elsewhere (another machine, a lost "
                        "storage): its completed trials join this storage as done and only the other points train")
    p.add_argument("--retrain-without-per-image", action="store_true",
                   help="with --import-runs: reported rows without per-image test results (a runs.csv of an earlier "
                        "version) are not imported and train again, so every paired difference gets its two-level "
                        "bootstrap interval")
    p.add_argument("--retrain-mode", action="append", default=[], metavar="MODE",
                   help="with --import-runs: reported rows that trained in MODE (runs.csv's mode column, e.g. "
                        "'32-true + explicit attention') are not imported and train again, in the mode this run "
                        "uses, so that every reported run has one mode (repeatable)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each trial's last.ckpt after it completes")
    p.add_argument("--list", action="store_true", help="list the studies with their sizes and exit")
    p.add_argument("--dry-run", action="store_true",
                   help="print the grid or search space, the estimated time here and the GPU-hours on --gpu")
    p.add_argument("--measure", action="store_true",
                   help="--dry-run: time each model's train step here beside its standard twin (seconds per model) "
                        "and price the trials with it (the FLOP estimate prices every model at standard's rate)")
    p.add_argument("--gpu", default=DEFAULT_GPU, choices=tuple(GPU_CLASSES),
                   help=f"--dry-run: the GPU class of the GPU-hours estimate (default {DEFAULT_GPU}); its MFU is "
                        f"measured when <results-dir>/{DEVICE_RESULTS}/ holds a device check or bench of a GPU, "
                        "else assumed")
    p.add_argument("--time-budget", type=duration, metavar="DURATION",
                   help="stop cleanly after this wall time (seconds, or e.g. 90m, 1.5h), as SIGTERM would (exit 143); "
                        "rerunning the same command continues the study. Set it below a scheduler's job time limit")
    p.add_argument("--until", choices=UNTIL, help="run the study's stages up to this one, then stop (exit 0): "
                   "tune (the tuning stage), report (the reported grid, the first look), contend (its contending "
                   "rates); the same command without it continues with the rest. Default: every stage, the second "
                   "look included")
    p.add_argument("--no-progress", action="store_true", help="no study-level progress bar")
    p.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--stage", default="report", choices=("tune", "report", "contend", "round"), help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what the worker processes are started with
    restore_signals = stop_on_signals()
    end_budget = stop_after(args.time_budget if args.worker_index is None else None)  # workers stop with the main
    excepthook = threading.excepthook  # _main installs its own (lost storage, write errors): undone on return
    try:
        return _main(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (see ablations.studies.stopping)
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
        print(f"error: cannot write the results folder: {one_line(write)}; completed trials are kept: free space "
              "or make the folder writable, then rerun the same command", file=sys.stderr)
        return 1
    finally:
        end_budget()
        restore_signals()
        threading.excepthook = excepthook  # a caller's process (a test, a notebook) keeps its own hook


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


def _main(args: argparse.Namespace) -> int:
    if args.list:
        return _list(available_studies(), BUDGETS, load_spec)
    _check_flags(args)
    sets = parse_sets(args.sets)
    spec = apply_sets(load_spec(args.study, args.budget), sets)
    study_name = args.study_name or spec.study_name
    _check_flags_against(spec, study_name, args)
    check_loggers(args.loggers)
    if args.workers is None:
        args.workers = default_workers(spec, args.threads)
    if spec.first_look() and args.worker_index is None:  # the run's (and the dry run's) first line
        print(f"{spec.first_look()} (study '{study_name}')", file=sys.stderr)
    overrides = {k: v for k, v in sets.items() if k in RUN_ONLY} | _overrides(args)
    validate_points(spec, overrides, check_data=False)  # the data folders after --download, and not in a dry run
    if args.download and args.worker_index is None:  # a dry run says what it would fetch
        _download(spec, overrides, dry_run=args.dry_run)
    if args.dry_run:
        return _dry_run(spec, sets, study_name, args, overrides)
    for config in data_configs(spec, overrides):
        check_data_folder(config)  # before anything is stored: a missing or malformed folder is one line
    storage = _open_storage(args)
    if args.worker_index is not None:
        return _work(spec, storage, study_name, args, overrides)
    return _run(spec, storage, study_name, args, overrides)


def _check_flags(args: argparse.Namespace) -> None:
    """The flags that need no study file, and the environment: a ValueError (one line) for the first at fault."""
    if not args.study:
        raise ValueError("--study is required (or --list); valid studies: " + ", ".join(available_studies()))
    for flag, value in (("--workers", args.workers), ("--stack", args.stack)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.device == "cuda" and not args.dry_run and not _cuda_available():
        raise ValueError("--device cuda, but torch sees no CUDA device (torch.cuda.is_available() is False); "
                         "valid choices here: auto, cpu")
    allocator.choice()  # a bad ABLATIONS_MALLOC is one line here, not a failed trial


def _check_flags_against(spec, study_name: str, args: argparse.Namespace) -> None:
    """The flags that depend on the study (``--import-runs`` continues a grid; ``--measure`` prices a dry run; the
    ``--retrain-*`` flags choose rows of an ``--import-runs`` file): a ValueError (one line) for the first at
    fault."""
    if args.import_runs and spec.space:
        raise ValueError(f"--import-runs: study '{args.study}' searches residual options ({', '.join(spec.space)}); "
                         "only a grid of listed points can be continued from a runs.csv")
    if args.import_runs and spec.kind != "grid":
        raise ValueError(f"--import-runs continues a grid study; '{args.study}' is a {spec.kind} (its points are "
                         "sampled, not listed): run it with its storage instead")
    if args.measure and not args.dry_run:
        raise ValueError("--measure prices a study for --dry-run: give both (a run measures nothing beforehand)")
    for flag, given in (("--retrain-without-per-image", args.retrain_without_per_image),
                        ("--retrain-mode", args.retrain_mode)):
        if given and not args.import_runs:
            raise ValueError(f"{flag} chooses which rows of --import-runs FILE train again: give both")
    if args.import_runs and not Path(args.import_runs).is_file():
        raise ValueError(f"--import-runs: runs file '{args.import_runs}' does not exist")
    if args.until in ("tune", "contend") and (spec.tune is None or spec.kind != "grid"):
        raise ValueError(f"--until {args.until}: study '{args.study}' has no tuning stage, so no {STAGE_NAMES[args.until]}; "
                         "valid choices for it: report")
    if args.retrain_mode:
        check_retrain_modes(args.import_runs, spec, study_name, tuple(args.retrain_mode))


def _download(spec, overrides: dict, dry_run: bool) -> None:
    """``--download``: fetch the datasets the study's points train on where they are not there (a dry run says what
    it would fetch)."""
    from data.fetch import ensure_all

    ensure_all([(c.dataset, c.data_dir) for c in data_configs(spec, overrides)], dry_run=dry_run)


def _dry_run(spec, sets: dict, study_name: str, args: argparse.Namespace, overrides: dict) -> int:
    """``--dry-run``: what ``--set`` makes of the study, what is done already, and the plan (:func:`.plan.dry_run`).
    Trains nothing, stores nothing."""
    if sets:
        where = "its own study" if spec.overrides else "the study"
        print(f"--set {describe({k: value_text(k, v) for k, v in sets.items()})}: over the study's base (and "
              f"its tuning stage's); stored as {where} '{study_name}'"
              + (" (threads, data_dir: run-only, not in the name)" if set(sets) & set(RUN_ONLY) else ""))
    if not folder_storage(args.storage, args.results_dir):  # the results folder's own: the run makes its folder
        check_url(args.storage)  # a URL the run would refuse is refused here too, before what is stored is read
    stored = _stored_and_imported(spec, study_name, args)
    _say_budget_and_data(spec, overrides)
    return dry_run(spec, overrides, gpu=args.gpu, results_dir=Path(args.results_dir), workers=args.workers,
                   stored=stored, measure=args.measure, stack=args.stack, retrain_modes=tuple(args.retrain_mode),
                   import_runs=Path(args.import_runs) if args.import_runs else None, until=args.until)


def _stored_and_imported(spec, study_name: str, args: argparse.Namespace) -> Stored | None:
    """What a run would find done: the study stored at ``--storage`` (:func:`.plan.stored_done`), joined by the rows
    of ``--import-runs`` for points not done there."""
    stored = stored_done(args.storage, study_name, spec)
    if not args.import_runs:
        return stored
    retrain = retrain_rule(args.retrain_without_per_image, tuple(args.retrain_mode))
    if stored is None:
        return imported_done(args.import_runs, spec, study_name, retrain)
    try:  # the rates the stored tuning stage chose (none yet: its report stage is not created)
        tuned = stored_choice(args.storage, study_name) if spec.tune is not None else None
    except KeyError:
        tuned = None
    return stored.joined(imported_done(args.import_runs, spec, study_name, retrain, stored.finished, tuned))


def _open_storage(args: argparse.Namespace):
    """The study's storage, opened for a run: its heartbeat watched, optuna's logging quiet, and a write error of
    TensorBoard's writer thread left to the main thread's one line."""
    quiet()
    make_storage_folder(args.storage, args.results_dir)
    storage = open_storage(args.storage, heartbeat_s=args.heartbeat, grace_s=args.grace)
    exit_when_heartbeat_fails(args.storage)
    _no_thread_traceback_for_write_errors(Path(args.results_dir))
    return storage


#: What a worker process (``--worker-index``) of each ``--stage`` trains: (its stage of the study, the learning
#: rates it trains at) from the study's name and what the storage holds
WORKER_STAGES = {
    "tune": lambda spec, storage, name: (spec.tune_stage(stored_extra(storage, name)), None),
    "contend": lambda spec, storage, name: (spec.contend_stage(stored_points(storage, name)), None),
    "round": lambda spec, storage, name: (spec.round_stage(stored_round_points(storage, name)),
                                          stored_choice(storage, parent_name(name))),
    "report": lambda spec, storage, name: (spec, stored_choice(storage, name)),
}


def _work(spec, storage, study_name: str, args: argparse.Namespace, overrides: dict) -> int:
    """A worker process started by the main one: train its stage's points until none are left."""
    stage, tuned = WORKER_STAGES[args.stage](spec, storage, study_name)
    return work(stage, storage, study_name, args, overrides, tuned=tuned)


def _run(spec, storage, study_name: str, args: argparse.Namespace, overrides: dict) -> int:
    """The main process: the study's stages in order (the tuning stage, the reported grid, the contending rates, a
    second look and its contending rates), each run to its end before the next; the exit code of the first that
    did not complete."""
    study = create_study(spec, storage, study_name, seed=0)  # refuses a stored study of other overrides
    check_tuning_grid(spec, study)
    _say_budget_and_data(spec, overrides)
    _warn_earlier_forms(storage, study_name, study, tune=spec.tune is not None)
    if spec.overrides:
        print(f"--set {describe(spec.overrides)}: its own stored study '{study_name}' (a study never mixes two "
              "configurations)", file=sys.stderr)
    if spec.tune is not None:
        code = settle_rates(spec, storage, study_name, args, overrides, study, chosen=study.user_attrs.get(TUNE_GRID) is not None)
        if code or args.until == "tune":
            return code or _stopped("tune")
    code = run_grid(spec, storage, study_name, args, overrides, study=study)
    if code or spec.tune is None or spec.kind != "grid":
        return code
    if args.until == "report":
        return _stopped("report")
    return _contend_and_look_again(spec, storage, study_name, args, overrides)


def _stopped(stage: str) -> int:
    """One line on stopping at ``--until``'s stage; exit 0."""
    print(f"stopped after the {STAGE_NAMES[stage]} (--until {stage}): {LEFT_AFTER[stage]} may follow; the same "
          "command without --until continues", file=sys.stderr)
    return 0


def _contend_and_look_again(spec, storage, study_name: str, args: argparse.Namespace, overrides: dict) -> int:
    """After a tuned grid: the contending rates' stage, then a second look at the claims still undecided
    (:mod:`.rounds`) with its own contending rates."""
    code = _contend(spec, storage, study_name, args, overrides)
    if not code and args.until == "contend":
        return _stopped("contend")
    second = None if code else prepare_round(spec, storage, study_name, Path(args.results_dir))
    if second is None:
        return code
    stage, name, round_study = second
    code = run_grid(stage, storage, name, args, overrides, stage="round", study=round_study)
    if code:
        return code
    return _contend(dataclasses.replace(spec, extra_points=spec.extra_points + stage.extra_points), storage,
                    study_name, args, overrides)


def _contend(spec, storage, study_name: str, args: argparse.Namespace, overrides: dict) -> int:
    """The contending rates' stage of the points of ``spec`` (its grid and any second look's), when a choice is not
    settled; 0 when there is nothing to train."""
    contend = prepare_contend(spec, storage, study_name)
    if contend is None:
        return 0
    stage, name, contend_study = contend
    return run_grid(stage, storage, name, args, overrides, stage="contend", study=contend_study)


def _say_budget_and_data(spec, overrides: dict) -> None:
    """Lines on stderr before anything runs: what the budget changes against the study's default (its data kept or
    swapped, said either way), and each dataset the points train on as it will be read (an image folder: its
    images, and the channels, size, patch and augmentation chosen for them)."""
    line = budget_line(spec)
    if line:
        print(line, file=sys.stderr)
    for config in data_configs(spec, overrides):
        print(f"data: {data.describe(config)}", file=sys.stderr)


def _warn_earlier_forms(storage, study_name: str, study, tune: bool) -> None:
    """A line on stderr for each stage of a continued study holding trials of an earlier form of their design."""
    stages = [study]
    if tune:
        try:
            stages.insert(0, load_study(storage, tune_name(study_name)))
        except KeyError:  # not created yet
            pass
    for stage in stages:
        line = earlier_forms_warning(stage)
        if line:
            print(line, file=sys.stderr)


def cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def default_workers(spec, threads: int | None = None) -> int:
    """``--workers`` when not given: the fastest layout of this machine for the study's trials. On the CPU one worker
    per core with one thread each (``--threads`` each when given): on 2 cores, 2 workers x 1 thread train a study's
    trials faster than 1 x 2 (docs/protocol.md, "Workers and threads"); at most one worker per trial of the larger
    stage. On a GPU one worker, since the local workers would share it (docs/scaling.md: one worker per GPU)."""
    point = spec.grid()[0] if spec.kind == "grid" else {"variant": spec.variants[0].label}
    accelerator = spec.run_config(point).accelerator
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and _cuda_available()):
        return 1
    trials = max(spec.size, spec.tune_stage().size if spec.tune is not None else 0)
    return max(1, min(cores() // (threads or 1), trials))


def _overrides(args: argparse.Namespace) -> dict:
    overrides = {}
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    threads = args.threads or max(1, cores() // args.workers)
    if args.workers > 1 or args.threads:
        overrides["threads"] = threads
    if args.device is not None:  # where the trials train: not part of what a study's results are
        overrides["accelerator"] = {"cuda": "gpu"}.get(args.device, args.device)
    return overrides


def size_text(spec) -> str:
    """A study's trials under one budget as the progress bars count them: ``reported+tuning`` (the tuning stage's
    starting grid; an evidence budget's may extend at its edges), or the reported trials alone without one."""
    return f"{spec.size}+{spec.tune_stage().size}" if spec.tune is not None else str(spec.size)


def _list(studies: dict, budgets: tuple, load_spec) -> int:
    """One line per study: its kind, its trials under each budget it defines (:func:`size_text`; '—' where it
    defines none) and the start of its description; then what the sizes count."""
    print(f"{'study':<20} {'kind':<7} " + " ".join(f"{b:>8}" for b in budgets) + "  description")
    for name in studies:
        default = load_spec(name)
        sizes = [size_text(load_spec(name, b)) if b in default.budgets else "—" for b in budgets]
        print(f"{name:<20} {default.kind:<7} " + " ".join(f"{s:>8}" for s in sizes) + f"  {default.description[:70]}")
    print("trials: reported+tuning (the tuning stage runs first; at the default, gpu and paper budgets its grid may "
          "extend while a row's best rate is at an edge)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
