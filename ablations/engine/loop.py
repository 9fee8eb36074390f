"""Train K runs of one cell as one stacked model and hand each back as the run it is: ``train_stacked``.

Each run is built exactly as :func:`ablations.training.run_training` builds it — seeded by its own seed, its own
DataModule, the precision ``auto`` resolves, its ``ViTClassifier`` (whose backbone's initial weights are its
seed's) — then the K backbones are stacked (:mod:`ablations.engine.stack`) and trained together, epoch by epoch,
with every run's own data order and augmentation (:mod:`ablations.engine.data`), learning rate, schedule, AdamW state
and divergence (:mod:`ablations.engine.optim`, :mod:`ablations.engine.step`). What each run records is what its plain
run records:

- its summary (:func:`lit_modules.convergence.summarize` through a ``ConvergenceTracker`` filled with its epochs:
  val and test accuracy per validated epoch, the optimizer steps at each, the epoch's mean train loss, images
  trained on, the per-image test results of the last validated epoch (``test_correct``); a diverged run's last
  epoch as Lightning leaves it), plus the run facts (``precision``,
  ``fused_attn``, ``mode_source``, ``num_classes``, ``malloc``) and the engine's (``engine``: ``stacked K`` or
  ``graph``, ``device``);
- its TensorBoard folder: the same tags at the same steps (``train/*``, ``val/*``, ``test/acc``, ``lr``,
  ``epoch``, the ``hp/*`` metrics and the summary text, the diagnostics every ``diagnostics_every`` epochs);
- its checkpoint (:data:`CHECKPOINT`, written after every epoch on a CPU, every :data:`CHECKPOINT_EVERY_S` on a
  GPU: its weights, AdamW moments, step, epoch records) from which a retried trial resumes;
- through ``on_epoch`` (the study's hook): its validation accuracy per epoch, so its Optuna trial gets the same
  intermediate values and can be pruned on its own.

Timing facts are the stack's: every run's ``wall_time_s`` is the time the stack trained (the K runs shared it),
``train_images_per_s`` its own images over that time. The metrics of an epoch are read from the device once, at
its end.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ablations import layout
from ablations.config import RunConfig

#: The engine's checkpoint of a run (in its checkpoint folder): everything a retried trial resumes from.
CHECKPOINT = "last.engine.pt"
#: Seconds between a stack's checkpoints by device (0: after every epoch, as the plain run saves them); a run that
#: finished (diverged, pruned) saves at once
CHECKPOINT_EVERY_S = {"cpu": 0.0, "cuda": 30.0}
#: The validation and test batch on a GPU (at least): an evaluation pass is a forward of eagerly launched kernels
EVAL_BATCH_CUDA = 1024
#: Fields that may differ between the runs of one stack (everything else must be equal).
PER_RUN_FIELDS = frozenset({"seed", "lr", "min_lr", "weight_decay"})
#: The plain run's refusal of a non-finite loss, whose summary a diverged run repeats (ViTClassifier).
EPOCH_HOOK = Callable[[int, int, float], bool]  # (run index, epoch 0-based, val acc) -> prune this run?


class NotStackable(ValueError):
    """The runs cannot train as one stack: one line saying why (they train as plain runs). ``one_at_a_time``: each
    of them can still train through the engine alone (only ``vmap`` failed: a stack of one needs none)."""

    def __init__(self, reason: str, one_at_a_time: bool = False) -> None:
        super().__init__(reason)
        self.one_at_a_time = one_at_a_time


@dataclass
class StackedRun:
    """One run of a stack: its config and everything ``run_training`` takes for it."""

    config: RunConfig
    run_name: str
    log_dir: Path
    checkpoint_dir: Path | None = None
    resume: bool = False
    hparams: dict | None = None


@dataclass
class Outcome:
    """What one run of a stack ended with: its ``summary`` and ``status`` (``completed``, ``pruned``)."""

    summary: dict
    status: str = "completed"
    pruned_at: int | None = None


@dataclass
class _Run:
    """A run's bookkeeping during training."""

    spec: StackedRun
    config: RunConfig
    datamodule: Any
    module: Any  # its ViTClassifier (its backbone becomes part of the stack)
    facts: dict
    tracker: Any
    logger: Any
    diagnostics: Any = None
    finished: bool = False
    status: str = "completed"
    pruned_at: int | None = None
    steps: int = 0  # optimizer steps taken (the plain run's global_step)
    last_train_loss: float | None = None
    last_val_acc: float | None = None
    best_val: float = -math.inf
    extra: dict = field(default_factory=dict)


def cell_key(config: RunConfig) -> str:
    """The cell of a run's config: every field but :data:`PER_RUN_FIELDS`, as one string (the runs of one cell can
    stack)."""
    import json

    fields = {k: v for k, v in config.to_dict().items() if k not in PER_RUN_FIELDS}
    return json.dumps(fields, sort_keys=True, default=str)


def check_uniform(configs: Sequence[RunConfig]) -> None:
    """NotStackable unless the configs differ in :data:`PER_RUN_FIELDS` only."""
    first = configs[0].to_dict()
    for k, config in enumerate(configs[1:], 1):
        other = config.to_dict()
        differ = sorted(name for name in first if name not in PER_RUN_FIELDS and first[name] != other[name])
        if differ:
            raise NotStackable(f"run {k} differs from run 0 in {', '.join(differ[:4])} (a stack's runs may differ "
                               f"only in {', '.join(sorted(PER_RUN_FIELDS))})")
    if configs[0].compile:
        raise NotStackable("compile=True is the plain run's lever (torch.compile of one model)")
    if configs[0].strategy not in ("auto", "single_device") or configs[0].devices not in (1, "auto"):
        raise NotStackable(f"strategy {configs[0].strategy} on {configs[0].devices} devices (a stack trains on one)")


def device_of(config: RunConfig):
    import torch

    from ablations.training import lightning_accelerator

    return torch.device("cuda" if lightning_accelerator(config.accelerator) == "gpu" else "cpu")


def build_run(spec: StackedRun, results_dir: str | Path) -> _Run:
    """A run as ``run_training`` builds it, up to the model (seeded, data set up, mode resolved, module built)."""
    import lightning.pytorch as pl

    from ablations.training import build_datamodule, build_model, resolve_mode

    config = spec.config
    accelerator = "gpu" if device_of(config).type == "cuda" else "cpu"
    pl.seed_everything(config.seed, workers=True, verbose=False)
    datamodule = build_datamodule(config)
    config, facts = resolve_mode(config, accelerator, datamodule, results_dir)
    facts["num_classes"] = datamodule.num_classes
    module = build_model(config, datamodule)
    return _Run(spec=spec, config=config, datamodule=datamodule, module=module, facts=facts, tracker=None,
                logger=None)


def train_stacked(specs: Sequence[StackedRun], *, results_dir: str | Path = layout.RESULTS_DIR,
                  on_epoch: EPOCH_HOOK | None = None, graph: bool | None = None,
                  log: Callable[[str], None] | None = None, eval_batch_size: int | None = None) -> list[Outcome]:
    """Train ``specs`` (runs of one cell) as one stack and return each run's :class:`Outcome`, in order.

    Raises :class:`NotStackable` (one line) before anything is trained or written when they cannot stack; the
    caller then trains them as plain runs. ``graph``: replay the step as a CUDA graph (default: on CUDA);
    ``eval_batch_size``: the evaluation batches' size (default: the run's batch, on CUDA at least
    :data:`EVAL_BATCH_CUDA`).
    ``on_epoch(k, epoch, val_acc)`` is called after each validated epoch of run k; True prunes it (its summary
    says what it trained). A ``KeyboardInterrupt`` (Ctrl-C, SIGTERM) stops every run where it is: their
    checkpoints of the last finished epoch stay, and the exception carries ``run_summaries``."""
    import torch

    from ablations.machine.allocator import set_malloc

    configs = [s.config for s in specs]
    check_uniform(configs)
    first = configs[0]
    torch.set_num_threads(first.threads or os.cpu_count() or 1)
    device = device_of(first)
    malloc = set_malloc() if device.type == "cpu" else "system (not a CPU run)"
    if device.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch.utils.deterministic

    # as the plain run's Trainer(deterministic=True), without its NaN fill (ablations.training); warn_only: a
    # batching rule of vmap may take a kernel without a deterministic twin where the plain run's op has one
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    runs = [build_run(s, results_dir) for s in specs]
    modes = {(r.config.precision, r.config.fused_attn) for r in runs}
    if len(modes) > 1:
        raise NotStackable(f"precision auto chose different modes for the runs: {sorted(map(str, modes))}")
    backbones = [r.module.model.to(device) for r in runs]
    sample = next(iter(runs[0].datamodule.val_dataloader()))[0][:2].to(device)
    from .stack import layout_reason, vmap_reason

    reason = layout_reason(backbones)
    if reason is not None:
        raise NotStackable(reason)
    reason = vmap_reason(backbones[0], sample) if len(backbones) > 1 else None
    if reason is not None:
        raise NotStackable(reason, one_at_a_time=True)
    say = log or (lambda line: print(line, file=sys.stderr, flush=True))
    return _Trainer(runs, device, malloc, results_dir, on_epoch, graph, say, eval_batch_size).fit()


class _Trainer:
    """The epoch loop of :func:`train_stacked` (module docstring)."""

    def __init__(self, runs: list[_Run], device, malloc: str, results_dir, on_epoch, graph, log,
                 eval_batch_size: int | None = None) -> None:
        import torch

        from lit_modules.classifier import WarmupCosine

        from .data import StackedBatches
        from .step import build_step

        self.runs, self.device, self.on_epoch = runs, device, on_epoch
        self.log = log or (lambda line: None)
        first = runs[0].config
        self.config = first
        self.k = len(runs)
        self.max_epochs = first.max_epochs
        mixups = [(r.module.mixup, r.config.seed) if r.module.mixup is not None else None for r in runs]
        eval_batch = eval_batch_size or (max(first.batch_size, EVAL_BATCH_CUDA) if device.type == "cuda"
                                         else first.batch_size)
        self.data = StackedBatches([r.datamodule for r in runs], device, batch_size=first.batch_size, mixups=mixups,
                                   num_classes=runs[0].datamodule.num_classes, eval_batch_size=eval_batch)
        self.steps_per_epoch = self.data.steps
        total = self.steps_per_epoch * self.max_epochs
        schedules = []
        for r in runs:  # as ViTClassifier.schedule_steps with Lightning's estimated_stepping_batches
            per_epoch = total / self.max_epochs
            schedules.append(WarmupCosine(round(r.config.warmup_epochs * per_epoch), max(1, total),
                                          r.config.min_lr / r.config.lr))
        self.step = build_step(
            [r.module.model for r in runs], optimizer=first.optimizer, lrs=[r.config.lr for r in runs],
            weight_decays=[r.config.weight_decay for r in runs], betas=tuple(first.betas), schedules=schedules,
            total_steps=total, precision=first.precision, label_smoothing=first.label_smoothing,
            top5=runs[0].datamodule.num_classes > 5, sample=self.data.val[0].x[0, :2] if self.data.val else None)
        self.stacked, self.optimizer = self.step.stacked, self.step.optimizer
        self.lr_table = self.optimizer.lr_table.double().cpu().tolist()  # (steps + 1, K): what each run's lr was
        self.eval_step = _Eval(self.stacked, first.precision, first.label_smoothing,
                               runs[0].datamodule.num_classes > 5)
        self.graph = (device.type == "cuda") if graph is None else graph
        self.engine = f"stacked {self.k}" + (" (CUDA graph)" if self.graph else "")
        self.malloc = malloc
        self.results_dir = results_dir
        self.start_epoch = 0
        self.saved_at: float | None = None
        self.torch = torch

    # --- set-up per run ------------------------------------------------------------------------------------------
    def _open(self) -> None:
        from ablations.dashboard import write_run_hparams
        from ablations.machine.modes import machine_text
        from ablations.tb_logger import tensorboard_logger
        from ablations.training import HP_METRICS
        from lit_modules.convergence import ConvergenceTracker

        machine = machine_text(self.device.type)

        for r in self.runs:
            r.logger = tensorboard_logger(r.spec.log_dir, r.spec.run_name)
            flat = r.config.to_hparams()
            r.logger.hparams.update(flat)
            write_run_hparams(r.logger.experiment, flat if r.spec.hparams is None else r.spec.hparams, HP_METRICS,
                              run=r.spec.run_name, own_experiment=r.spec.hparams is None)
            r.logger.log_hyperparams(r.module.hparams_initial)  # what Lightning logs at fit start: hparams.yaml
            tracker = ConvergenceTracker(r.config.accuracy_thresholds)
            tracker.max_epochs = self.max_epochs
            tracker.param_count = sum(p.numel() for p in r.module.model.parameters())
            tracker._module = SimpleNamespace(diverged=False)
            r.tracker = tracker
            r.facts |= {"malloc": self.malloc, "engine": self.engine, "stack_size": self.k,
                        "device": self.device.type, "machine": machine}
            if r.config.diagnostics_every > 0:
                from ablations.training import diagnostics_callback

                r.diagnostics = diagnostics_callback(r.config, r.datamodule)
                if r.diagnostics is not None:
                    r.diagnostics.on_fit_start(self._trainer_view(r, 0), r.module)

    def _trainer_view(self, r: _Run, epoch: int) -> SimpleNamespace:
        """What the diagnostics callback reads from a Trainer."""
        return SimpleNamespace(is_global_zero=True, current_epoch=epoch, max_epochs=self.max_epochs,
                               loggers=[r.logger], global_step=r.steps)

    # --- resume --------------------------------------------------------------------------------------------------
    def _resume(self) -> None:
        """Load every run's engine checkpoint when its spec says ``resume`` (all from the same epoch)."""
        torch = self.torch
        wanted = [r for r in self.runs if r.spec.resume and r.spec.checkpoint_dir is not None
                  and (r.spec.checkpoint_dir / CHECKPOINT).is_file()]
        if not wanted:
            return
        if len(wanted) != self.k:
            raise NotStackable("some runs of the stack have a checkpoint to resume and others not")
        states = [torch.load(r.spec.checkpoint_dir / CHECKPOINT, map_location="cpu", weights_only=False)
                  for r in self.runs]
        epochs = {s["epoch"] for s in states}
        if len(epochs) != 1:
            raise NotStackable(f"the runs' checkpoints are from different epochs ({sorted(epochs)})")
        self.start_epoch = epochs.pop()
        for k, (r, state) in enumerate(zip(self.runs, states, strict=True)):
            r.module.model.load_state_dict(state["model"])  # into the stack's row k (the parameters are views)
            self.optimizer.load_state_of(k, state["optimizer"])
            r.tracker.load_state_dict(state["tracker"])
            r.steps, r.finished, r.status = state["steps"], state["finished"], state["status"]
            r.last_train_loss, r.last_val_acc = state["last_train_loss"], state["last_val_acc"]
            r.best_val = state.get("best_val", -math.inf)
            r.tracker._module.diverged = state["diverged"]
            r.tracker._start = {"epoch": self.start_epoch, "global_step": r.steps, "images_seen":
                                r.tracker.images_seen, "checkpoint": str(r.spec.checkpoint_dir / CHECKPOINT)}
            if r.finished:
                self.step.active[k] = False
        self.log(f"resumed {self.k} runs from epoch {self.start_epoch}")

    def _save(self, k: int, r: _Run, epoch: int) -> None:
        if r.spec.checkpoint_dir is None:
            return
        torch = self.torch
        r.spec.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        state = {"epoch": epoch, "model": {n: t.detach().clone() for n, t in r.module.model.state_dict().items()},
                 "optimizer": self.optimizer.state_of(k), "tracker": r.tracker.state_dict(), "steps": r.steps,
                 "finished": r.finished, "status": r.status, "diverged": r.tracker._module.diverged,
                 "last_train_loss": r.last_train_loss, "last_val_acc": r.last_val_acc, "best_val": r.best_val,
                 "config": r.config.to_dict(), "engine": self.engine}
        path = r.spec.checkpoint_dir / CHECKPOINT
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)

    # --- training ------------------------------------------------------------------------------------------------
    def fit(self) -> list[Outcome]:
        self._open()
        self._resume()
        fit_start = time.perf_counter()
        for r in self.runs:
            r.tracker._fit_start = fit_start
            if r.tracker._start.get("checkpoint") is None:
                r.tracker._start = {"epoch": self.start_epoch, "global_step": r.steps,
                                    "images_seen": r.tracker.images_seen, "checkpoint": None}
            else:  # what the plain run's resume writes (ablations.training's resume record)
                step = r.steps
                r.logger.log_metrics({"resume/start_epoch": self.start_epoch, "resume/start_global_step": step},
                                     step=step)
                r.logger.experiment.add_text("resume", f"resumed from `{r.tracker._start['checkpoint']}`: the engine "
                                                       f"restored epoch {self.start_epoch}, global step {step}",
                                             global_step=step)
        captured = False
        try:
            for epoch in range(self.start_epoch, self.max_epochs):
                if all(r.finished for r in self.runs):
                    break
                captured = self._epoch(epoch, captured)
        except BaseException as exc:
            exc.run_summaries = [self._summary(r, fit_start) for r in self.runs]
            for r in self.runs:
                r.logger.finalize("failed")
            raise
        end = time.perf_counter()
        outcomes = []
        for r in self.runs:
            r.tracker._fit_end = end
            summary = self._finish(r, fit_start)
            outcomes.append(Outcome(summary, r.status, r.pruned_at))
        return outcomes

    def _epoch(self, epoch: int, captured: bool) -> bool:
        from lit_modules.predictions import pack

        step = self.step
        live = [not r.finished for r in self.runs]
        start = time.perf_counter()
        step.metrics.reset()
        before = step.active.clone()
        diag_epoch = [r.diagnostics is not None and not r.finished and r.diagnostics.is_diagnostic_epoch(
            self._trainer_view(r, epoch), epoch) for r in self.runs]
        for i, batch in enumerate(self.data.epoch(epoch)):
            if self.graph and not captured:
                captured = True
                try:
                    step.capture(batch.x, batch.targets, batch.labels, batch.weight)
                except Exception as exc:  # noqa: BLE001 - e.g. a host sync inside a variant's step: train eagerly
                    self.graph = False
                    self.engine = self.engine.replace(" (CUDA graph)", "")
                    for r in self.runs:
                        r.facts["engine"] = self.engine
                    self.log(f"engine: the step cannot be captured as a CUDA graph ({' '.join(str(exc).split())[:200]}); "
                             "it runs eagerly")
            if self.graph:
                step.replay(batch.x, batch.targets, batch.labels, batch.weight)
            else:
                step(batch.x, batch.targets, batch.labels, batch.weight)
            if i == 0 and any(diag_epoch):  # the diagnostics' block gradient norms, at the epoch's first step
                self._grad_norms(diag_epoch)
        metrics = step.metrics.read()  # the epoch's one host sync
        active = step.active.tolist()
        diverged_at = step.diverged_at.tolist()
        was_active = before.tolist()
        train_end = time.perf_counter()
        for k, r in enumerate(self.runs):
            if not live[k]:
                continue
            if was_active[k] and not active[k] and not r.finished:  # diverged in this epoch
                r.steps = diverged_at[k] + 1  # Lightning counts the skipped step (the optimizer was called)
                r.tracker._module.diverged = True
                r.finished = True
            else:
                r.steps += self.steps_per_epoch
            r.tracker.images_seen += int(metrics["images"][k])
            if metrics["loss"][k] is not None:  # else Lightning's callback_metrics keep the last logged value
                r.last_train_loss = metrics["loss"][k]
        val = self._evaluate(epoch)
        for k, r in enumerate(self.runs):
            if not live[k]:
                continue
            e = epoch + 1
            step_at = max(r.steps - 1, 0)
            pruned_now = False
            if not r.finished:
                vloss, vacc, vacc5, tacc = (val[name][k] for name in ("loss", "acc", "acc_top5", "test"))
                r.tracker.val_acc[e] = vacc
                r.tracker.val_steps[e] = r.steps
                if tacc is not None:
                    r.tracker.test_acc[e] = tacc
                correct = val["test_correct"][k]  # the per-image results, as the plain run's tracker packs them
                r.tracker.test_correct = (e, pack(correct.numpy())) if correct is not None else None
                logged = {"val/loss": vloss, "val/acc": vacc} | ({"val/acc_top5": vacc5} if vacc5 is not None else {})
                logged |= ({"test/acc": tacc} if tacc is not None else {})
                r.logger.log_metrics(logged | {"epoch": epoch}, step=step_at)
                r.last_val_acc = vacc
                if self.on_epoch is not None and self.on_epoch(k, epoch, vacc):
                    # the plain run's pruning callback raises in on_validation_end: the epoch's train loss and
                    # time are never recorded
                    r.finished, r.status, r.pruned_at, pruned_now = True, "pruned", epoch, True
                    step.active[k] = False
            elif r.last_val_acc is not None and self.on_epoch is not None:
                # the stop-time validation of a diverged plain run scores nothing, but the pruning callback reads
                # Lightning's last val/acc again: the same intermediate value, reported for this epoch
                self.on_epoch(k, epoch, r.last_val_acc)
            if pruned_now:
                continue
            r.tracker.train_loss[e] = r.last_train_loss
            train = {"train/loss": metrics["loss"][k], "train/acc": metrics["acc"][k],
                     "train/acc_top5": metrics["acc_top5"][k]}
            train = {key: v for key, v in train.items() if v is not None}
            lr = self.lr_table[min(self.optimizer.last_step, r.steps)][k]  # its scheduler stepped r.steps times
            r.logger.log_metrics(train | {"lr": lr, "epoch": epoch}, step=step_at)
        end = time.perf_counter()
        for k, r in enumerate(self.runs):
            if not live[k]:
                continue
            if r.status != "pruned":
                r.tracker.epoch_times[epoch + 1] = end - start
                r.tracker.train_times[epoch + 1] = train_end - start
                last = r.finished and r.diagnostics is not None and r.diagnostics._last_logged != epoch
                if r.diagnostics is not None and (diag_epoch[k] or last):
                    r.diagnostics._diagnose(self._trainer_view(r, epoch), r.module, epoch)
        if self._checkpoint_due(end) or any(r.finished for k, r in enumerate(self.runs) if live[k]):
            for k, r in enumerate(self.runs):
                if live[k]:
                    self._save(k, r, epoch + 1)
            self.saved_at = time.perf_counter()
        return captured

    def _checkpoint_due(self, now: float) -> bool:
        """Every epoch on a CPU; on a GPU once :data:`CHECKPOINT_EVERY_S` have passed since the last save (its
        epochs take a fraction of a second, K checkpoints of a stack much longer)."""
        every = CHECKPOINT_EVERY_S.get(self.device.type, 0.0)
        return self.saved_at is None or now - self.saved_at >= every

    def _grad_norms(self, wanted: list[bool]) -> None:
        """Each diagnosed run's per-block gradient norms at this epoch's first step (the diagnostics callback reads
        them at its ``on_before_optimizer_step``): its rows of the stack's gradients, before they are cleared."""
        from lit_modules.diagnostics import block_grad_norms

        for k, r in enumerate(self.runs):
            if wanted[k]:
                model = r.module.model
                for slot in self.stacked.slots:  # point each parameter's .grad at its row of the gradients
                    param = model.get_parameter(slot.name)
                    param.grad = self.stacked.view(self.stacked.grads, slot)[k]
                r.diagnostics._grad_norms = block_grad_norms(model).clone()
                for param in model.parameters():
                    param.grad = None

    def _evaluate(self, epoch: int) -> dict[str, list]:
        self.stacked.eval()
        val = self.eval_step(self.data.val)
        test = self.eval_step(self.data.test, per_image=True) if self.data.test else None
        self.stacked.train()
        return {"loss": val["loss"], "acc": val["acc"], "acc_top5": val["acc_top5"],
                "test": test["acc"] if test else [None] * self.k,
                "test_correct": test["correct"] if test else [None] * self.k}

    # --- the end ---------------------------------------------------------------------------------------------------
    def _summary(self, r: _Run, fit_start: float) -> dict:
        r.tracker._global_step = r.steps
        return r.tracker.summary() | r.facts

    def _finish(self, r: _Run, fit_start: float) -> dict:
        from ablations.training import finish_run

        summary = self._summary(r, fit_start)
        trainer = SimpleNamespace(is_global_zero=True, global_step=r.steps)
        return finish_run(trainer, [r.logger], summary, r.spec.run_name, status="success")


class _Eval:
    """The stacked evaluation pass over fixed batches: per run, the image-weighted mean of the batch losses and
    the top-1 / top-5 accuracy (as ``ViTClassifier``'s ``MeanMetric`` and ``MulticlassAccuracy``)."""

    def __init__(self, stacked, precision: str, label_smoothing: float, top5: bool) -> None:
        import torch

        self.stacked, self.label_smoothing, self.top5 = stacked, label_smoothing, top5
        self.bf16 = precision == "bf16-mixed"
        self.torch = torch

    def __call__(self, batches: list, per_image: bool = False) -> dict[str, list]:
        """The metrics (:meth:`Metrics.read`); with ``per_image`` also ``correct``: each run's bool vector of the
        images its top-1 prediction got right, in the split's order (as ``ViTClassifier.test_correct``), on the CPU."""
        from .step import Metrics, correct, per_run_loss

        torch = self.torch
        device = self.stacked.weights.device
        metrics = Metrics(self.stacked.k, device, self.top5)
        everyone = torch.ones(self.stacked.k, dtype=torch.bool, device=device)
        right = []
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16):
            for b in batches:
                logits = self.stacked(b.x)
                loss = per_run_loss(logits, b.labels, b.weight, self.label_smoothing)
                hits = correct(logits.float(), b.labels, b.weight, self.top5)
                metrics.add(loss, hits, b.weight.sum(1), everyone)
                if per_image:
                    right.append((logits.argmax(-1) == b.labels)[:, :b.images])
        out = metrics.read()
        if per_image:
            out["correct"] = list(torch.cat(right, dim=1).cpu()) if right else [None] * self.stacked.k
        return out

