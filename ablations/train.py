"""Train one ViT run and print its convergence summary.

    python -m ablations.train --residual layerscale --depth 12 --init-value auto --dataset digits --max-epochs 30
    python -m ablations.train --dataset synthetic --dataset-option num_samples=512 --max-epochs 3 --json
    python -m ablations.train --dataset digits --devices 2 --strategy ddp    # DDP (gloo on CPU): rank 0 reports

Every ``RunConfig`` field is an option (``--embed-dim``, ``--lr``, ``--no-augment``, ...); ``--residual-option
KEY=VALUE`` / ``--dataset-option KEY=VALUE`` (repeatable) set the variant's / dataset's own options, with values
read as YAML (plus ``1e-5`` as a float and ``None`` as null). ``--init-value V`` sets the chosen variant's init knob.
Bad input exits with status 2 and one ``error: ...`` line on stderr.

This module imports neither torch nor lightning at import time (``--help`` stays fast); training imports them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ablations.cli import OneLineParser, fail, parse_value, program
from ablations.config import (
    GROUPS,
    INIT_VALUE_OPTIONS,
    OPTIONS,
    RunConfig,
    add_options,
    flat,
    layer,
    mapping_options,
    option_name,
)
from ablations.config.tree import Leaf
from ablations.dashboard import check_loggers
from ablations.engine.loop import NotStackable, StackedRun, device_of, train_stacked
from ablations.layout import OUTPUT_DIR, runs_dir
from ablations.machine import allocator
from ablations.recipes import RECIPE_FIELDS, RECIPE_NAMES
from ablations.training import SetupError, run_training, summary_table

# Imported where they are used, not here: PyYAML, Lightning, torch, the datasets (data: torch) and the study loader
# (ablations.studies.advice, for a run below the floor: about 50 ms, half again the ~110 ms this module takes to
# import on a 2-core CPU). Each takes from a twentieth of a second to seconds, and the command-line tools start
# without them.

DEFAULT_LOG_DIR = runs_dir(OUTPUT_DIR, "train").as_posix()  # outputs/runs/train


class CLIError(Exception):
    """A user error: printed as one ``error: ...`` line, exit status 2."""




def _help(leaf: Leaf) -> str:
    """An option's ``--help`` line and its default (a recipe option: marked ``recipe``, its default per recipe)."""
    if leaf.name in RECIPE_FIELDS:
        per_recipe = ", ".join(f"{name}: {_text(RunConfig(recipe=name).to_dict()[leaf.name])}" for name in RECIPE_NAMES)
        return f"recipe: {leaf.help} (default: the recipe's; {per_recipe})"
    return f"{leaf.help} (default: {_text(RunConfig().to_dict()[leaf.name])})"


def _text(value: Any) -> str:
    if isinstance(value, tuple):
        return " ".join(map(str, value)) or "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return "none" if value == {} else str(value)


# --- the parser ----------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=program("ablations.train"),
        description="Train one Vision Transformer with a chosen residual connection and print its convergence "
                    "summary (best/final val accuracy, epochs to 95% of best, AUC, wall time). TensorBoard logs "
                    "go to --log-dir/<run name>.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  python -m ablations.train --residual layerscale --depth 12 --init-value auto --dataset digits\n"
               "  python -m ablations.train --residual laurel --residual-option form=rw_lr --residual-option rank=8\n"
               "  python -m ablations.train --dataset cifar10 --data-dir ~/data --embed-dim 192 --num-heads 3",
    )
    groups = {g: parser.add_argument_group(f"{g} options") for g in GROUPS}
    add_options(groups, OPTIONS, _help)
    groups["model"].add_argument(
        "--init-value", metavar="V", default=argparse.SUPPRESS,
        help="the variant's init knob: " + ", ".join(f"{r} {o}" for r, o in INIT_VALUE_OPTIONS.items())
             + " (layerscale also takes auto = CaiT's depth rule, and None = no scale; highway takes auto = the"
               " paper's bias guideline)")
    run = parser.add_argument_group("run options")
    run.add_argument("--config", metavar="FILE", help="YAML file of RunConfig fields; options given here override it")
    run.add_argument("--log-dir", default=DEFAULT_LOG_DIR, help=f"TensorBoard root (default: {DEFAULT_LOG_DIR})")
    run.add_argument("--run-name", help="run folder name (default: derived from the config plus a timestamp)")
    run.add_argument("--json", action="store_true",
                     help="print the summary as one JSON object, the only output on stdout (progress goes to stderr)")
    run.add_argument("--progress-bar", action=argparse.BooleanOptionalAction, default=True,
                     help="show Lightning's progress bar and model summary (default: on)")
    run.add_argument("--checkpoint", action="store_true",
                     help="save checkpoints (best val/acc and last.ckpt) under the run folder")
    run.add_argument("--resume", metavar="CKPT", help="resume from a checkpoint file (implies --checkpoint)")
    run.add_argument("--download", action="store_true",
                     help="download the dataset into --data-dir first if it is not there (cifar10, cifar100, mnist, "
                          "fashion_mnist, svhn: torchvision's downloaders, md5-checked; see python -m data.fetch)")
    run.add_argument("--device", choices=("auto", "cpu", "cuda"),
                     help="where to train (sets --accelerator: cuda = gpu; default: the accelerator's, auto)")
    run.add_argument("--engine", choices=("auto", "plain", "stacked"), default="auto",
                     help="plain: Lightning's loop; stacked: the engine (ablations.engine: the step as one CUDA graph "
                          "on a GPU, data and metrics kept on the device; a run it cannot train falls back to plain "
                          "with one line); auto (default): the engine on CUDA, plain on a CPU")
    run.add_argument("--logger", action="append", default=[], metavar="NAME", dest="loggers",
                     help="an extra logger besides TensorBoard (repeatable): csv (<run>/csv/metrics.csv), mlflow "
                          "(local SQLite store <log-dir>/mlflow.db) or wandb (Weights & Biases; offline unless you "
                          "are logged in or WANDB_MODE says otherwise: <log-dir>/wandb)")
    return parser


def _key_values(items: Sequence[str], flag: str) -> dict[str, Any]:
    values = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise CLIError(f"{flag} expects KEY=VALUE, got {item!r}")
        values[key.strip()] = parse_value(text)
    return values


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The RunConfig of parsed arguments (config file, then options, then ``--init-value``).

    Raises CLIError / ValueError with one-line messages."""
    fields: dict[str, Any] = {}
    if args.config:
        fields = flat(_read_config_file(args.config))
    given = {name: getattr(args, name) for name in OPTIONS if hasattr(args, name)}
    for name in mapping_options():
        if name in given:
            given[name] = _key_values(given[name], option_name(OPTIONS[name]))
    if getattr(args, "device", None) is not None:
        if args.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise CLIError("--device cuda, but torch sees no CUDA device (torch.cuda.is_available() is False); "
                               "valid choices here: auto, cpu")
        given["accelerator"] = {"cuda": "gpu"}.get(args.device, args.device)
    fields = layer(fields, given)
    if hasattr(args, "init_value"):
        residual = fields.get("residual", RunConfig().residual)
        knob = INIT_VALUE_OPTIONS.get(residual)
        if knob is None:
            accepted = ", ".join(f"{r} ({o})" for r, o in INIT_VALUE_OPTIONS.items())
            raise CLIError(f"--init-value does not apply to residual {residual!r}; variants that accept it: {accepted}")
        options = dict(fields.get("residual_options") or {})
        if knob in options:
            raise CLIError(f"--init-value and --residual-option {knob}=... both set {residual}'s {knob}; give one")
        options[knob] = parse_value(args.init_value)
        fields["residual_options"] = options
    return RunConfig.from_dict(fields)


def _read_config_file(path: str) -> dict[str, Any]:
    import yaml

    try:
        with open(path) as fh:
            values = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise CLIError(f"cannot read config file {path!r}: {exc.strerror}") from None
    except yaml.YAMLError:
        raise CLIError(f"config file {path!r} is not valid YAML") from None
    if not isinstance(values, dict):
        raise CLIError(f"config file {path!r} must hold a mapping of RunConfig options (flat names, or nested: "
                       "model, data, optim, ...)")
    return values


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _wants_engine(config: RunConfig, args: argparse.Namespace) -> bool:
    """``--engine stacked``, or ``auto`` on CUDA (on a CPU a single run gains nothing from it: docs/gpu-engine.md)."""
    if args.engine == "plain":
        return False

    return args.engine == "stacked" or device_of(config).type == "cuda"


def _engine_run(config: RunConfig, args: argparse.Namespace, run_name: str) -> dict | None:
    """The run through the engine (:func:`ablations.engine.loop.train_stacked`, one run); None, after one line
    saying why, when the engine cannot train it (the caller trains it as a plain run)."""
    try:
        if args.loggers:
            raise NotStackable(f"extra loggers ({', '.join(args.loggers)}) are written by Lightning's loop")
        if args.resume is not None:
            raise NotStackable("--resume takes a Lightning checkpoint")
        folder = Path(args.log_dir) / run_name / "checkpoints" if args.checkpoint else None
        (outcome,) = train_stacked([StackedRun(config, run_name, Path(args.log_dir), checkpoint_dir=folder)])
    except NotStackable as exc:
        print(f"engine: trains as a plain run: {exc}", file=sys.stderr)
        return None
    return outcome.summary


def _below_floor(summary: dict, config: RunConfig) -> None:
    """A run that ended below the shared protocol's floor says so on stderr, with its likely causes."""
    from ablations.studies.advice import below_floor_line, protocol_floor

    floor = protocol_floor()
    if floor.failed(summary.get(floor.metric), summary.get("num_classes")):
        print(f"note: {below_floor_line([(summary, config.to_dict())], 0, floor)}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
        check_loggers(args.loggers)
        allocator.choice()
        if args.download:
            from data.fetch import ensure

            ensure(config.dataset, config.data_dir, log=lambda line: print(line, file=sys.stderr))
    except (CLIError, ValueError) as exc:
        fail(str(exc))
    run_name = args.run_name or f"{config.run_name()}_{datetime.datetime.now():%Y%m%d-%H%M%S}"

    # --json: stdout is the summary alone (``... --json > run.json``); the progress bar and model summary go to stderr
    output = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    try:
        with output:
            summary = _engine_run(config, args, run_name) if _wants_engine(config, args) else None
            if summary is None:
                summary = run_training(
                    config, log_dir=args.log_dir, run_name=run_name, enable_progress_bar=args.progress_bar,
                    enable_checkpointing=args.checkpoint or args.resume is not None, ckpt_path=args.resume,
                    loggers=args.loggers,
                )
    except (SetupError, ValueError) as exc:  # ValueError: e.g. --logger mlflow without mlflow installed
        fail(str(exc))
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130
    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank != 0:  # strategy ddp runs this script once per device: rank 0 reports for all
        return 0
    _below_floor(summary, config)
    if args.json:
        print(json.dumps(_json_safe(summary), allow_nan=False), flush=True)
    else:
        print(f"\nrun {run_name} ({config.residual}, depth {config.depth}, {config.dataset}, "
              f"{config.max_epochs} epochs)")
        print(summary_table(summary, markdown=False))
        print(f"\ntensorboard --logdir {args.log_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
