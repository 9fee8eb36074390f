"""One training run: how it is built and what it records, for both ways of training, and its training by
Lightning's loop: ``run_training(config, log_dir=..., run_name=...) -> summary dict``.

Used by the ``python -m ablations.train`` CLI and, with extra callbacks (e.g. Optuna's pruning callback), a
checkpoint folder and ``ckpt_path`` for resuming, by study objectives. The stacked engine
(:func:`ablations.engine.loop.train_stacked`) builds and records each run of its stack with the same functions:

- how a run is built: :func:`prepare_process` (threads, malloc, cuBLAS), :func:`build_run` (seed, data, mode,
  model, facts); its schedule and optimiser groups are ``ViTClassifier``'s;
- what it records: its :class:`lit_modules.convergence.ConvergenceTracker` (per-epoch records, steps,
  divergence, per-image test results, timings, where it resumed from: the summary; its ``state_dict`` is part of
  either loop's checkpoint) and its TensorBoard folder ``<log_dir>/<run_name>/`` (event files, ``hparams.yaml``
  and, if enabled, ``checkpoints/``) through :func:`register_run` as it starts, :func:`log_resume` when it resumed
  and :func:`finish_run` at its end.

Every run logs the same metric keys, :data:`HP_METRICS`, once, at its end, and the HParams experiment (the
study's, at its log root; a single run's own) lists exactly those, so runs of one study directory share one
HParams table (a different metric set in the same folder hides values). HParams metrics must be numbers: a summary
value of None ("never reached", e.g. epochs to 95% of a run that diverged before its first validation) is logged as
NaN; booleans as 0/1.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ablations import layout
from ablations.cli import markdown_table
from ablations.config import RunConfig
from ablations.machine import allocator
from data.settings import TrainAugment

# Imported where they are used, not here: torch, Lightning, the datasets (data: torch), the model (lit_modules:
# torch) and the machine's modes (ablations.machine.modes: about 60 ms, half again the ~110 ms that
# ``python -m ablations.train`` takes to import on a 2-core CPU). The command-line tools start without them.

#: Summary keys mirrored to TensorBoard's HParams plugin as ``hp/<key>``: the same tuple for every run.
HP_SUMMARY_KEYS: tuple[str, ...] = (
    "test_acc", "test_acc_at_best_val", "best_val_acc", "final_val_acc", "best_epoch", "val_acc_auc",
    "epochs_to_90pct_of_best", "epochs_to_95pct_of_best", "epochs_to_99pct_of_best", "steps_to_95pct_of_best",
    "final_train_loss", "wall_time_s", "time_per_epoch_s", "train_images_per_s",
    "epochs_completed", "diverged", "param_count",
)
#: Summary entries too long for the summary table (TensorBoard's text): the per-image test results
BULK_SUMMARY_KEYS = ("test_correct",)
HP_METRICS: tuple[str, ...] = tuple(f"hp/{k}" for k in HP_SUMMARY_KEYS)


def hp_metric_values(summary: Mapping[str, Any]) -> dict[str, float]:
    """``{hp/<key>: float}`` for every key of :data:`HP_METRICS`; None (or a missing key) -> NaN, bool -> 0/1."""
    values = {}
    for key in HP_SUMMARY_KEYS:
        value = summary.get(key)
        values[f"hp/{key}"] = math.nan if value is None else float(value)
    return values


def format_value(value: Any) -> str:
    """Compact display of one summary value (4 significant digits, thousands separators above 1000)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def summary_table(summary: Mapping[str, Any], markdown: bool = True) -> str:
    """The scalar entries of a summary as a two-column table (Markdown, or aligned plain text)."""
    rows = [(k, format_value(v)) for k, v in summary.items()
            if not isinstance(v, (list, tuple, dict)) and k not in BULK_SUMMARY_KEYS]
    if markdown:
        return markdown_table(["metric", "value"], rows)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
#: The checkpoint of a run's latest epoch (``<name>.ckpt``), which resuming continues from.
LAST_CHECKPOINT = "last"
#: Key of ``trainer.callback_metrics`` that carries the summary from wherever ``fit`` ran (see _hand_back_summary).
_SUMMARY_KEY = "ablations/summary"


class SetupError(ValueError):
    """The run could not be built from its config (bad residual options, missing data folder, ...): one line."""


def lightning_accelerator(name: str) -> str:
    """Lightning's accelerator for a config's ``accelerator``: ``auto`` resolved (gpu where torch sees CUDA), cuda = gpu."""
    import torch

    if name == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    return "gpu" if name == "cuda" else name


def build_datamodule(config: RunConfig):
    """The run's DataModule, set up (data loaded). Raises SetupError for data problems."""
    import data

    try:
        dm = data.build_datamodule(
            config.dataset, data_dir=config.data_dir, batch_size=config.batch_size,
            val_fraction=config.val_fraction, test_fraction=config.test_fraction, seed=config.seed, augment=config.augment,
            num_workers=config.num_workers, train_augment=train_augment(config),
            **data.fitted_options(config.dataset, config.dataset_options, config.patch_size),
        )
        dm.setup("fit")
    except TypeError as exc:  # an unknown dataset option
        raise SetupError(f"invalid dataset option for '{config.dataset}': {exc}") from None
    except ValueError as exc:  # incl. data.DataError
        raise SetupError(" ".join(str(exc).split())) from None
    return dm


def train_augment(config: RunConfig):
    """The recipe's per-image augmentation of ``config`` as the DataModules take it (:class:`data.TrainAugment`, the
    per-image part of ``config.augmentation``)."""
    return TrainAugment(**{f.name: getattr(config.augmentation, f.name) for f in dataclasses.fields(TrainAugment)})


def build_model(config: RunConfig, datamodule: Any):
    """The ``ViTClassifier`` for ``config``, sized by the DataModule. Raises SetupError for bad model options."""
    from lit_modules.classifier import ViTClassifier

    try:
        return ViTClassifier(
            config.model_config(datamodule_shape(datamodule)), optim=config.optim,
            max_epochs=config.trainer.max_epochs, seed=config.trainer.seed,
            mixup=mixup_options(config) if config.mixes else None,
        )
    except (TypeError, ValueError) as exc:
        raise SetupError(" ".join(str(exc).split())) from None


def datamodule_shape(datamodule: Any) -> dict[str, int]:
    """A set-up DataModule's geometry, as :meth:`RunConfig.model_config` takes it."""
    return {"img_size": datamodule.img_size, "in_chans": datamodule.in_chans, "num_classes": datamodule.num_classes,
            "patch_size": datamodule.default_patch_size}


def mixup_options(config: RunConfig) -> dict[str, float]:
    """The recipe's Mixup/CutMix settings as ``ViTClassifier(mixup=...)`` takes them (timm.data.Mixup's names)."""
    aug = config.augmentation
    return {"mixup_alpha": aug.mixup_alpha, "cutmix_alpha": aug.cutmix_alpha, "prob": aug.mixup_prob,
            "switch_prob": aug.mixup_switch_prob}


def diagnostics_callback(config: RunConfig, datamodule: Any) -> Any:
    """The run's diagnostics (``diagnostics_every`` epochs, on a fixed batch of its training data)."""
    from lit_modules.diagnostics_logging import DiagnosticsCallback

    return DiagnosticsCallback(datamodule.fixed_batch(config.diagnostics_batch_size), config.diagnostics_every,
                               k=config.diagnostics_sim_k)


def deterministic_without_nan_fill() -> dict[str, Any]:
    """The Trainer argument that makes a run reproducible, ``deterministic=True``, minus its per-step cost.

    ``torch.use_deterministic_algorithms(True)`` (what the flag sets) also turns on
    ``torch.utils.deterministic.fill_uninitialized_memory``: every tensor made by ``torch.empty`` is filled with NaN,
    a guard against reading uninitialised memory that changes no result of correct code and cost ~1.5 % of a
    trial's CPU train step (a paired bench of the study's step with and without it). Turned off here, for the
    whole process; returns the Trainer keyword arguments (used by ``run_training`` and the bench's Lightning loop).
    """
    import torch.utils.deterministic

    torch.utils.deterministic.fill_uninitialized_memory = False
    return {"deterministic": True}


@dataclass
class BuiltRun:
    """A run as :func:`build_run` builds it: the config it trains with (precision ``auto`` resolved), its set-up
    DataModule, its ``ViTClassifier`` and the facts of its summary."""

    config: RunConfig
    datamodule: Any
    model: Any
    facts: dict[str, Any]


def prepare_process(config: RunConfig) -> tuple[str, str]:
    """Set up the process that trains ``config``'s run (or a stack of its cell's): ``torch.set_num_threads(threads
    or all cores)``, on a CPU glibc's malloc as ``ABLATIONS_MALLOC`` says (:mod:`ablations.machine.allocator`), on a
    GPU deterministic cuBLAS. Returns the Lightning accelerator and the ``malloc`` fact."""
    import torch

    torch.set_num_threads(config.threads or os.cpu_count() or 1)
    accelerator = lightning_accelerator(config.accelerator)
    malloc = allocator.set_malloc() if accelerator == "cpu" else "system (not a CPU run)"
    if accelerator == "gpu":  # deterministic cuBLAS (deterministic algorithms are enabled by the loop)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return accelerator, malloc


def build_run(config: RunConfig, accelerator: str, malloc: str,
              results_dir: str | Path = layout.RESULTS_DIR) -> BuiltRun:
    """A run up to its training, as both ways of training build it: seeded (``seed_everything(config.seed,
    workers=True)``), its data set up, its mode resolved (:func:`resolve_mode`), its model built. Its facts:
    ``precision``, ``fused_attn``, ``mode_source``, ``num_classes`` (the chance level a diverged run counts at in the
    report), ``malloc``, ``device`` (where it trained: its mode's device) and ``machine``. Raises SetupError."""
    import lightning.pytorch as pl

    from ablations.machine.modes import machine_text

    pl.seed_everything(config.seed, workers=True, verbose=False)
    datamodule = build_datamodule(config)
    config, facts = resolve_mode(config, accelerator, datamodule, results_dir)
    device = "cuda" if accelerator == "gpu" else "cpu"
    facts |= {"num_classes": datamodule.num_classes, "malloc": malloc, "device": device,
              "machine": machine_text(device)}
    return BuiltRun(config, datamodule, build_model(config, datamodule), facts)


def run_training(
    config: RunConfig,
    *,
    log_dir: str | Path,
    run_name: str,
    extra_callbacks: Iterable[Any] = (),
    enable_progress_bar: bool = True,
    enable_model_summary: bool | None = None,
    enable_checkpointing: bool = False,
    checkpoint_dir: str | Path | None = None,
    ckpt_path: str | Path | None = None,
    hparams: Mapping[str, Any] | None = None,
    loggers: Sequence[str] = (),
    experiment: str = "ablations",
    results_dir: str | Path = layout.RESULTS_DIR,
) -> dict[str, Any]:
    """Train one run and return its summary (:meth:`lit_modules.convergence.ConvergenceTracker.summary` and the
    run's facts) plus ``run_name``, ``log_dir`` (the run's TensorBoard folder) and ``param_count``.

    Builds the run with :func:`prepare_process` and :func:`build_run`, and trains it deterministically
    (``deterministic=True`` without the NaN fill of new tensors: ``deterministic_without_nan_fill``): the same config
    on the same CPU gives identical metrics. Checkpoints (``ModelCheckpoint`` on ``val/acc`` + ``last.ckpt``) are
    written to ``checkpoint_dir`` (default ``<run dir>/checkpoints``) when ``enable_checkpointing`` or
    ``checkpoint_dir`` is given; ``ckpt_path`` resumes from a checkpoint (``"last"`` or a path; Lightning starts
    fresh if "last" has none).

    TensorBoard tags are grouped for reading (:mod:`ablations.dashboard`). ``hparams``: the run's values of its
    study's HParams columns (:func:`register_run`). ``loggers``: extra Lightning loggers (``csv``,
    ``mlflow``; MLflow's store is ``<log_dir>/mlflow.db``, SQLite, experiment ``experiment``). ``results_dir``: where
    precision ``auto`` looks for (and caches) this machine's mode measurements (``<results_dir>/device/``).

    Raises SetupError (a ValueError, one line) when the model or data cannot be built. If ``fit`` raises
    (e.g. ``optuna.TrialPruned`` from a pruning callback, or KeyboardInterrupt), the summary of the epochs run so
    far is still written to TensorBoard and attached to the exception as ``exc.run_summary`` before it propagates.
    A diverging run (non-finite loss) is not an exception: it stops and returns ``diverged=True``.
    """
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import LambdaCallback

    from ablations.dashboard import extra_loggers
    from ablations.tb_logger import tensorboard_logger
    from lit_modules.convergence import ConvergenceTracker

    accelerator, malloc = prepare_process(config)
    run = build_run(config, accelerator, malloc, results_dir)
    config, datamodule, model, facts = run.config, run.datamodule, run.model, run.facts
    facts |= use_stream_kernels(model.model, config, accelerator, datamodule)
    compile_timer = compile_model(model.model, accelerator) if config.compile else None

    logger = tensorboard_logger(log_dir, run_name)
    more_loggers = extra_loggers(loggers, run_dir=Path(logger.log_dir), run_name=run_name, experiment=experiment,
                                 mlflow_db=Path(log_dir) / "mlflow.db", wandb_dir=Path(log_dir))
    tracker = ConvergenceTracker(config.accuracy_thresholds)
    callbacks: list[Any] = [tracker, LambdaCallback(on_train_start=functools.partial(_record_resume, tracker))]
    if config.diagnostics_every > 0:
        callbacks.append(diagnostics_callback(config, datamodule))
    checkpointing = enable_checkpointing or checkpoint_dir is not None
    if checkpointing:
        callbacks += checkpoint_callbacks(checkpoint_dir or Path(logger.log_dir) / layout.CHECKPOINTS)
    callbacks.append(LambdaCallback(on_fit_end=functools.partial(_hand_back_summary, tracker)))
    callbacks += [c for c in (compile_timer, *extra_callbacks) if c is not None]
    steps_per_epoch = len(datamodule.train_dataloader())
    trainer = pl.Trainer(
        accelerator=accelerator, devices=config.devices, strategy=config.strategy, precision=config.precision,
        max_epochs=config.max_epochs, **deterministic_without_nan_fill(), logger=[logger, *more_loggers],
        callbacks=callbacks,
        enable_checkpointing=checkpointing, enable_progress_bar=enable_progress_bar,
        enable_model_summary=enable_progress_bar if enable_model_summary is None else enable_model_summary,
        num_sanity_val_steps=0, log_every_n_steps=max(1, min(50, steps_per_epoch)), default_root_dir=str(log_dir),
    )
    # hparams.yaml and the extra loggers get the whole config (under config/: Lightning logs the model's own
    # hyperparameters to them at fit start, and MLflow refuses a key logged twice with another spelling)
    flat = register_run(logger, config, run_name, hparams) if trainer.is_global_zero else config.to_hparams()
    for extra in more_loggers:
        extra.log_hyperparams({f"config/{k}": v for k, v in flat.items()})
    everyone = [logger, *more_loggers]
    try:
        trainer.fit(model, datamodule=datamodule, ckpt_path=None if ckpt_path is None else str(ckpt_path))
    except BaseException as exc:
        exc.run_summary = finish_run(everyone, tracker.summary() | facts, run_name, "failed",
                                     step=trainer.global_step, rank_zero=trainer.is_global_zero)
        raise
    summary = trainer.callback_metrics.pop(_SUMMARY_KEY, None) or tracker.summary()
    if compile_timer is not None:
        facts["compile_time_s"] = compile_timer.compile_time_s()
    return finish_run(everyone, summary | facts, run_name, "success", step=trainer.global_step,
                      rank_zero=trainer.is_global_zero)


def compile_model(backbone: Any, accelerator: str) -> Any:
    """Compile ``backbone`` in place (its ``state_dict`` keys stay ``model.*``; ``torch.compile(m)`` would add
    ``_orig_mod``) and return the callback that times the first batches: the compile time."""
    from lit_modules.convergence import StepTimer

    if accelerator == "cpu":
        from lit_modules.residual.stream_kernels import pin_vector_width

        pin_vector_width()  # inductor's cache key must hold the vector width (see pin_vector_width)
    backbone.compile()
    return StepTimer()


def checkpoint_callbacks(dirpath: str | Path) -> list[Any]:
    """A run's Lightning checkpoints in ``dirpath``: its best epoch (on ``val/acc``) and its latest,
    :data:`LAST_CHECKPOINT`, rewritten after every validation: what a resume continues from. (Lightning 2.6's
    ``save_last=True`` on the monitored checkpoint rewrites ``last.ckpt`` only when ``val/acc`` improves, so a
    killed trial would resume from its best epoch and train the epochs after it again.)"""
    from lightning.pytorch.callbacks import ModelCheckpoint

    return [ModelCheckpoint(dirpath=str(dirpath), monitor="val/acc", mode="max",
                            filename="epoch{epoch:03d}-acc{val/acc:.4f}", auto_insert_metric_name=False),
            ModelCheckpoint(dirpath=str(dirpath), filename=LAST_CHECKPOINT, enable_version_counter=False)]


def use_stream_kernels(model: Any, config: RunConfig, accelerator: str, datamodule: Any) -> dict[str, Any]:
    """Set the multi-stream residuals' kernels of ``model`` (``config.stream_kernels``, ``auto`` resolved for the
    device; eager under ``config.compile``, whose whole-model compile fuses the passes itself) and return the
    facts for the run's summary when the model has such sites: ``stream_kernels`` and, for compiled kernels on the
    CPU, ``stream_kernels_compile_s``: they are compiled before training on a zero batch of the training shape
    (forward and backward in train mode, a forward in eval mode, with the RNG state restored and the gradients
    cleared), so that the compile time stays out of the epochs' times. A smaller last batch still compiles once
    more, inside the first epoch."""
    import torch

    from lit_modules.residual import stream_kernels

    if not model.multi_stream_sites():
        return {}
    device = "cpu" if accelerator == "cpu" else "cuda"
    chosen = "eager" if config.compile else stream_kernels.resolve(config.stream_kernels, device)
    model.set_stream_kernels(chosen)
    facts: dict[str, Any] = {"stream_kernels": chosen}
    if chosen == "compiled" and device == "cpu":
        start = time.perf_counter()
        x = torch.zeros(config.batch_size, datamodule.in_chans, datamodule.img_size, datamodule.img_size)
        with torch.random.fork_rng(devices=[]):
            model.train()
            model(x).sum().backward()
            model.eval()
            with torch.no_grad():
                model(x)
            model.train()
        model.zero_grad(set_to_none=True)
        facts["stream_kernels_compile_s"] = time.perf_counter() - start
    return facts


def with_mode(config: RunConfig, mode: Any) -> RunConfig:
    """``config`` trained in ``mode`` (:class:`ablations.machine.modes.Mode`): its precision, and its attention
    kernel unless the config sets one."""
    return config.replace(precision=mode.precision,
                          fused_attn=mode.fused_attn if config.fused_attn is None else config.fused_attn)


def resolve_mode(config: RunConfig, accelerator: str, datamodule: Any,
                 results_dir: str | Path = layout.RESULTS_DIR) -> tuple[RunConfig, dict[str, Any]]:
    """``precision="auto"``: the fastest mode for this device, this CPU's signature and thread count, and this model
    size (:mod:`ablations.machine.modes`: a table measured on this machine, else a cell measured now and cached under
    ``<results_dir>/device/``), precision and attention kernel together (an explicit ``fused_attn`` is kept).
    Returns the config the run trains with and the facts for its summary: ``precision``, ``fused_attn`` and, when
    chosen, ``mode_source``."""
    facts: dict[str, Any] = {}
    if config.precision == "auto":
        import torch

        from ablations.machine.modes import auto_mode, model_size, probe, tokens

        patch = config.patch_size or datamodule.default_patch_size
        size = model_size(config, datamodule.img_size, patch, datamodule.in_chans, datamodule.num_classes)
        mode = auto_mode(accelerator, config.embed_dim, tokens(datamodule.img_size, patch), results_dir=results_dir,
                         threads=torch.get_num_threads(), measure=probe(size, config.batch_size))
        config = with_mode(config, mode)
        facts["mode_source"] = mode.source
    facts |= {"precision": config.precision, "fused_attn": config.fused_attn is not False}  # None: timm's fused
    return config, facts


def _record_resume(tracker: Any, trainer: Any, pl_module: Any) -> None:
    """``on_train_start``, after the tracker: a run that Lightning resumed from a checkpoint records it
    (:func:`log_resume`)."""
    if trainer.is_global_zero and trainer.loggers:
        log_resume(trainer.loggers[0], tracker.this_process(), "Lightning")


def _hand_back_summary(tracker: Any, trainer: Any, pl_module: Any) -> None:
    """``on_fit_end`` in the process(es) that trained. Under ``ddp_spawn`` those are child processes and the
    tracker of the calling process saw no epoch; Lightning returns rank 0's ``callback_metrics`` to it (the only
    trainer state that comes back), so the summary travels there. A module-level function: it pickles."""
    trainer.callback_metrics[_SUMMARY_KEY] = tracker.summary()


# --- what a run records, either way it trains ---------------------------------------------------------------
def register_run(logger: Any, config: RunConfig, run_name: str, hparams: Mapping[str, Any] | None) -> dict[str, Any]:
    """Register a run's hyperparameters as it starts (its metrics come at its end): the whole config (flat,
    ``RunConfig.to_hparams``) for ``hparams.yaml``, and its HParams entry — ``hparams``, the run's values of its
    study's columns (the study writes the columns once at its log root), or None: a run on its own, whose entry
    lists the whole config in an experiment of its own. Returns the flat config."""
    from ablations.dashboard import write_run_hparams

    flat = config.to_hparams()
    logger.hparams.update(flat)
    write_run_hparams(logger.experiment, flat if hparams is None else hparams, HP_METRICS, run=run_name,
                      own_experiment=hparams is None)
    return flat


def log_resume(logger: Any, start: Mapping[str, Any], restored_by: str) -> None:
    """A run resumed from a checkpoint (``start``: the tracker's ``this_process()``) writes what was restored
    (epoch, global step, file) as scalars ``resume/*`` and the text ``resume``; a run from scratch writes nothing."""
    if not start["resumed_from_checkpoint"]:
        return
    step = start["start_global_step"]
    logger.log_metrics({"resume/start_epoch": start["start_epoch"], "resume/start_global_step": step}, step=step)
    logger.experiment.add_text("resume", f"resumed from `{start['resumed_checkpoint']}`: {restored_by} restored "
                                         f"epoch {start['start_epoch']}, global step {step}", global_step=step)


def finish_run(loggers: Sequence[Any], summary: dict[str, Any], run_name: str, status: str, *, step: int,
               rank_zero: bool = True) -> dict[str, Any]:
    """The run's summary plus ``run_name``, ``log_dir`` (the first logger's folder) and ``param_count``; on rank
    zero the ``hp/*`` metrics (every logger) and the Markdown summary table (TensorBoard, the first logger) are
    written at the final global ``step`` (at least 1: after every epoch's, even if no step was taken), and the
    loggers finalised with ``status``."""
    logger = loggers[0]
    summary.update(run_name=run_name, log_dir=str(logger.log_dir), param_count=summary.get("param_count"))
    if rank_zero:
        step = max(step, 1)
        for each in loggers:
            each.log_metrics(hp_metric_values(summary), step=step)
        logger.experiment.add_text("summary", summary_table(summary), global_step=step)
        for each in loggers:
            each.finalize(status)
        from ablations.dashboard import finish_wandb

        finish_wandb(loggers)
    return summary
