"""Run an Optuna study of residual-variant ablations.

    python -m ablations.run --study residual_variants              # the headline grid (default size)
    python -m ablations.run --study residual_variants --budget smoke --workers 2
    python -m ablations.run --study path/to/my_study.yaml --storage postgresql://user@host/db
    python -m ablations.run --list | --study NAME --dry-run

Rerunning continues a study: completed trials never run again; a trial whose worker died is retried with the
same parameters and resumes from its last checkpoint. Watch it with ``optuna-dashboard <storage URL>`` and
``tensorboard --logdir results/runs/<study>``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from . import layout
from .cli import OneLineParser
from .dashboard import check_loggers
from .storage import DEFAULT_STORAGE, GRACE_S, HEARTBEAT_S, lost_storage_error, lost_storage_message

#: Seconds per trial not proportional to FLOPs (Trainer set-up, data, logging) and effective train-step
#: GFLOP/s of this 2-core CPU for the small default models; calibrated on the residual_variants default run.
TRIAL_OVERHEAD_S = 3.0
EFFECTIVE_GFLOPS = 25.0
UNKNOWN_SIZES = (10000, 2000)  # (train, val) assumed for a dataset whose size is only known after loading


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m ablations.run", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--study", help="a study name (see --list) or a path to a study .yaml file")
    p.add_argument("--budget", default="default", help="study size: smoke (CI, < 1 min), quick (minutes), default, paper (GPU)")
    p.add_argument("--storage", default=os.environ.get("ABLATIONS_STORAGE", DEFAULT_STORAGE),
                   help=f"Optuna storage URL (default {DEFAULT_STORAGE}, or $ABLATIONS_STORAGE)")
    p.add_argument("--study-name", help="name in the storage (default: the study's name, suffixed by the budget)")
    p.add_argument("--workers", type=int, default=1, help="local worker processes sharing the study (cores split)")
    p.add_argument("--results-dir", default=layout.RESULTS_DIR,
                   help=f"where TensorBoard runs go (<dir>/{layout.RUNS}/<study>/)")
    p.add_argument("--data-dir", help="data folder for folder datasets (cifar10, imagefolder, ...)")
    p.add_argument("--threads", type=int, help="torch threads per worker (default: cores // workers)")
    p.add_argument("--n-trials", type=int, help="search studies: trials to run (default: the study's n_trials)")
    p.add_argument("--heartbeat", type=int, default=HEARTBEAT_S, help="trial heartbeat interval, seconds")
    p.add_argument("--grace", type=int, default=GRACE_S, help="seconds without heartbeat before a trial is retried")
    p.add_argument("--logger", action="append", default=[], metavar="NAME", dest="loggers",
                   help="an extra logger per trial besides TensorBoard (repeatable): csv (<run>/csv/metrics.csv) or "
                        "mlflow (local SQLite store <results-dir>/runs/<study>/mlflow.db)")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each trial's last.ckpt after it completes")
    p.add_argument("--list", action="store_true", help="list the studies with their sizes and exit")
    p.add_argument("--dry-run", action="store_true", help="print the grid or search space and the estimated time")
    p.add_argument("--no-progress", action="store_true", help="no study-level progress bar")
    p.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what the worker processes are started with
    try:
        return _main(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: completed trials are kept; rerun the same command to continue", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `--list | head`: the reader left; no traceback, and none at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # the database went away mid-study: one line, not optuna's chained tracebacks
        error = lost_storage_error(exc)
        if error is None:
            raise
        print(f"error: {lost_storage_message(args.storage, error)}", file=sys.stderr)
        return 1


def _main(args: argparse.Namespace) -> int:
    from .spec import BUDGETS, available_studies, load_spec

    if args.list:
        return _list(available_studies(), BUDGETS, load_spec)
    if not args.study:
        raise ValueError("--study is required (or --list); valid studies: " + ", ".join(available_studies()))
    if args.workers < 1:
        raise ValueError(f"--workers must be >= 1, got {args.workers}")
    spec = load_spec(args.study, args.budget)
    check_loggers(args.loggers)
    overrides = _overrides(args)
    _validate_points(spec, overrides)
    if args.dry_run:
        return _dry_run(spec, overrides)


    from .dashboard import write_study_hparams
    from .storage import exit_when_heartbeat_fails, open_storage
    from .training import HP_METRICS

    _quiet()
    storage = open_storage(args.storage, heartbeat_s=args.heartbeat, grace_s=args.grace)
    exit_when_heartbeat_fails(args.storage)
    study_name = args.study_name or spec.study_name
    if args.worker_index is not None:
        return _work(spec, storage, study_name, args, overrides)

    study = _create_study(spec, storage, study_name, seed=0)
    write_study_hparams(layout.runs_dir(args.results_dir, study_name), spec, HP_METRICS)
    if spec.kind == "grid":
        for params in spec.grid():
            study.enqueue_trial(params, skip_if_exists=True)
        _retry_failed_points(study, spec, storage)
    total = spec.size if spec.kind == "grid" else (args.n_trials or spec.n_trials)
    print(f"study '{study_name}' ({spec.kind}, {total} trials) in {_redact(args.storage)}; "
          f"TensorBoard: tensorboard --logdir {layout.runs_dir(args.results_dir, study_name)}", file=sys.stderr)
    started = time.time()
    if args.workers == 1:
        _work(spec, storage, study_name, args, overrides, progress_total=None if args.no_progress else total)
    else:
        _spawn_workers(args, storage, study_name, total)
    return _finish(study_name, storage, spec, time.time() - started)


def _retry_failed_points(study, spec, storage) -> None:
    """Queue a retry (same parameters, same run folder, so it resumes from its last checkpoint) of every grid
    point whose trials all FAILed: an exception in training, or Ctrl-C outside ``fit``. ``enqueue_trial(...,
    skip_if_exists=True)`` counts a FAIL trial as existing, so without this such a point never ran again and every
    rerun exited 1. Dead workers' trials are still RUNNING here; the heartbeat check retries those. The retry
    callback's ``max_retry`` bounds the attempts per point."""
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
        if key in live:
            continue
        before = len(study.get_trials(deepcopy=False))
        retry(study, copy.deepcopy(t))  # adds a WAITING copy unless the point used up its retries
        (queued if len(study.get_trials(deepcopy=False)) > before else exhausted).append(str(t.number))
    if queued:
        print(f"retrying failed trial(s) {', '.join(queued)} (same parameters)", file=sys.stderr)
    if exhausted:
        print(f"not retrying failed trial(s) {', '.join(exhausted)}: retries used up", file=sys.stderr)


def _point_key(params: dict) -> str:
    return repr(sorted(params.items()))


def _quiet() -> None:
    """Study output is the progress bar and one line per event: silence per-trial Lightning chatter."""
    import logging
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
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


def _validate_points(spec, overrides: dict) -> None:
    """Build every grid point's config (and check its residual options) before anything is stored."""
    _make_pruner(spec)
    points = spec.grid() if spec.kind == "grid" else [{"variant": v.label} for v in spec.variants]
    seen, datasets = set(), set()
    for params in points:
        config = spec.run_config(params, overrides)
        key = (config.residual, repr(sorted(config.residual_options.items())), config.depth, config.embed_dim)
        if key not in seen:
            seen.add(key)
            _check_residual(config)
        data_key = (config.dataset, config.data_dir, repr(sorted(config.dataset_options.items())))
        if data_key not in datasets:
            datasets.add(data_key)
            _check_data(config)


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
    options = variant.validate_options(dict(config.residual_options))
    variant.check_options(options, dim=config.embed_dim, depth=config.depth)


def _create_study(spec, storage, study_name: str, seed: int):
    import optuna

    sampler = optuna.samplers.TPESampler(seed=seed)
    study = optuna.create_study(storage=storage, study_name=study_name, direction=spec.direction, sampler=sampler,
                                pruner=_make_pruner(spec), load_if_exists=True)
    _check_same_choices(study, spec)
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
    """Optuna fixes a categorical parameter's choices for the life of a study: a study file whose variants or grid
    axes changed cannot continue the stored study (its first new trial would FAIL with "CategoricalDistribution
    does not support dynamic value space"). Say so before anything is written."""
    from optuna.distributions import CategoricalDistribution

    expected = {"variant": [v.label for v in spec.variants], **{axis: list(v) for axis, v in spec.axes.items()}}
    for t in study.get_trials(deepcopy=False):
        for name, dist in t.distributions.items():
            if name in expected and isinstance(dist, CategoricalDistribution) and list(dist.choices) != expected[name]:
                raise ValueError(
                    f"study '{study.study_name}' in the storage was run with {name} = {list(dist.choices)}, the study "
                    f"file has {expected[name]}; a study's choices cannot change: pass --study-name NEW_NAME for a "
                    "new study, or restore the file")


def _work(spec, storage, study_name: str, args, overrides: dict, progress_total: int | None = None) -> int:
    """One worker: take enqueued grid points (or sample search points) until none are left."""
    import optuna
    from optuna.trial import TrialState

    from .objective import Objective

    index = args.worker_index or 0
    study = _create_study(spec, storage, study_name, seed=index)  # a distinct sampler seed per worker
    objective = Objective(spec, log_root=layout.runs_dir(args.results_dir, study_name), overrides=overrides,
                          keep_checkpoints=args.keep_checkpoints, loggers=tuple(args.loggers))
    bar = _progress(study, progress_total)
    done_states = (TrialState.COMPLETE, TrialState.PRUNED)
    try:
        while True:
            optuna.storages.fail_stale_trials(study)
            if spec.kind == "grid":
                if not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                    break
            else:
                target = args.n_trials or spec.n_trials
                counted = (*done_states, TrialState.RUNNING, TrialState.FAIL)  # FAIL too: never loop on failures
                if len(study.get_trials(deepcopy=False, states=counted)) >= target:
                    break
            study.optimize(objective, n_trials=1, gc_after_trial=True, catch=(RuntimeError,))
            if bar is not None:
                bar.n = _done(study)
                bar.refresh()
    finally:
        if bar is not None:
            bar.close()
    return 0


def _done(study) -> int:
    from optuna.trial import TrialState

    return sum(1 for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
               if not t.user_attrs.get("surplus") and "duplicate_of" not in t.user_attrs)


def _progress(study, total: int | None):
    if total is None:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=_done(study), desc=study.study_name, unit="trial", dynamic_ncols=True)


def _spawn_workers(args, storage, study_name: str, total: int) -> None:
    """N local processes on the same study, each with its share of the cores and its own sampler seed."""
    import optuna

    argv = [a for a in args.argv if a != "--no-progress"]
    procs = [subprocess.Popen([sys.executable, "-m", "ablations.run", *argv, "--worker-index", str(i),
                               "--no-progress", "--study-name", study_name])
             for i in range(args.workers)]
    bar = None if args.no_progress else _progress(optuna.load_study(study_name=study_name, storage=storage), total)
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(2)
            if bar is not None:
                bar.n = _done(optuna.load_study(study_name=study_name, storage=storage))
                bar.refresh()
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        if bar is not None:
            bar.close()


def _finish(study_name: str, storage, spec, elapsed: float) -> int:
    import optuna
    from optuna.trial import TrialState

    study = optuna.load_study(study_name=study_name, storage=storage)
    counts = {s.name.lower(): len(study.get_trials(deepcopy=False, states=(s,))) for s in TrialState}
    print(f"study '{study_name}': {counts['complete']} complete, {counts['pruned']} pruned, {counts['fail']} failed, "
          f"{counts['running']} running, {counts['waiting']} waiting; {elapsed:.0f} s this run", file=sys.stderr)
    missing = counts["waiting"] + (spec.size - _done(study) if spec.kind == "grid" else 0)
    return 0 if missing <= 0 else 1


def _list(studies: dict, budgets: tuple, load_spec) -> int:
    print(f"{'study':<20} {'kind':<7} " + " ".join(f"{b:>8}" for b in budgets) + "  description")
    for name in studies:
        specs = [load_spec(name, b) for b in budgets]
        print(f"{name:<20} {specs[0].kind:<7} " + " ".join(f"{s.size:>8}" for s in specs)
              + f"  {specs[0].description[:70]}")
    return 0


def _dry_run(spec, overrides: dict) -> int:
    print(f"study {spec.study_name}: {spec.kind}, {spec.size} trials, metric {spec.metric} ({spec.direction})")
    if spec.kind == "grid":
        points = spec.grid()
        for params in points:
            print("  " + ", ".join(f"{k}={v}" for k, v in params.items()))
    else:
        points = [{"variant": v.label} for v in spec.variants]
        for label, space in spec.space.items():
            print(f"  {label}: " + "; ".join(f"{k} ~ {v}" for k, v in space.items()))
        print(f"  pruner: {spec.pruner}")
    seconds = [estimate_seconds(spec.run_config(p, overrides)) for p in points]
    per_trial = sum(seconds) / len(seconds)
    total = per_trial * spec.size
    print(f"estimated time on this machine: {total / 60:.1f} min ({per_trial:.1f} s per trial; one worker using "
          f"all cores; a rough FLOP-based estimate at {EFFECTIVE_GFLOPS:.0f} GFLOP/s + {TRIAL_OVERHEAD_S:.0f} s per trial)")
    return 0


_FLOPS_CACHE: dict = {}


def estimate_seconds(config) -> float:
    """Rough wall time of one trial: 3× forward FLOPs per training image, 1× per val image, at the calibrated
    effective rate, plus a fixed per-trial overhead."""
    from .costs import measure

    shape = dataset_shape(config)
    key = (config.residual, repr(sorted(config.residual_options.items())), config.depth, config.embed_dim,
           config.num_heads, config.patch_size, shape["img_size"], shape["in_chans"], shape["num_classes"])
    if key not in _FLOPS_CACHE:
        _FLOPS_CACHE[key] = measure(config.residual, dict(config.residual_options), embed_dim=config.embed_dim,
                                    depth=config.depth, num_heads=config.num_heads, img_size=shape["img_size"],
                                    patch_size=config.patch_size or shape["patch_size"],
                                    num_classes=shape["num_classes"], in_chans=shape["in_chans"])["flops"]
    train, val = shape["sizes"]
    flops = _FLOPS_CACHE[key] * config.max_epochs * (3 * train + val)
    return TRIAL_OVERHEAD_S + flops / (EFFECTIVE_GFLOPS * 1e9)


def dataset_shape(config) -> dict:
    """What the dataset class knows before loading: img_size, in_chans, num_classes, default patch size and
    (train, val) sizes (``known_sizes``; a generated dataset: its ``num_samples`` split by ``val_fraction``;
    otherwise :data:`UNKNOWN_SIZES`). From the constructed DataModule (cheap), else the class attributes."""
    import data

    try:
        dm = data.build_datamodule(config.dataset, data_dir=config.data_dir, **config.dataset_options)
    except Exception:  # noqa: BLE001 - e.g. a folder dataset not on this machine: the class still knows its shape
        dm = data.DATASETS.get(config.dataset)
    sizes = getattr(dm, "known_sizes", None)
    samples = getattr(dm, "num_samples", None)
    if sizes is None and isinstance(samples, int):
        val = round(samples * getattr(dm, "val_fraction", 0.2))
        sizes = (samples - val, val)
    return {"img_size": getattr(dm, "img_size", 32), "in_chans": getattr(dm, "in_chans", 3),
            "num_classes": getattr(dm, "num_classes", 10), "patch_size": getattr(dm, "default_patch_size", 4),
            "sizes": tuple(sizes or UNKNOWN_SIZES)}


def _redact(url: str) -> str:
    from .storage import _redact as redact

    return redact(url)


if __name__ == "__main__":
    raise SystemExit(main())
