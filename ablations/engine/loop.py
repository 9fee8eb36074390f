"""Train K runs of one cell as one stacked model and hand each back as the run it is: ``train_stacked``.

Each run is built as Lightning's run builds it (:func:`ablations.training.prepare_process`,
:func:`ablations.training.build_run`: seeded by its own seed, its own DataModule, the precision ``auto`` resolves,
its ``ViTClassifier``, whose backbone's initial weights are its seed's), then the K backbones are stacked
(:mod:`ablations.engine.stack`) and trained together, epoch by epoch, with every run's own data order and
augmentation (:mod:`ablations.engine.data`), learning rate and schedule (``ViTClassifier.lr_schedule``), AdamW
state over its optimiser groups (:func:`lit_modules.classifier.optimizer_groups`) and divergence
(:mod:`ablations.engine.optim`, :mod:`ablations.engine.step`).

What each run records is what its plain run records, written by the same code (:mod:`ablations.training`): its
``ConvergenceTracker`` filled with its epochs (val and test accuracy, the per-image test results, optimizer steps,
mean train loss, images, times, divergence: a diverged run's last epoch as Lightning leaves it), its TensorBoard
folder (``hparams.yaml`` and HParams entry, the tags ``train/*``, ``val/*``, ``test/acc``, ``lr`` and ``epoch`` at
the steps Lightning logs them, the diagnostics every ``diagnostics_every`` epochs, ``resume/*``, the ``hp/*``
metrics and the summary text), its summary with the run facts and the engine's (``engine``: ``stacked K`` or
``(CUDA graph)``, ``stack_size``). Besides:

- its checkpoint (:data:`CHECKPOINT`, written after every epoch on a CPU, every :data:`CHECKPOINT_EVERY_S` on a
  GPU: its weights, AdamW moments, its tracker's state) from which a retried trial resumes;
- through ``on_epoch`` (the study's hook): its validation accuracy per epoch, so its Optuna trial gets the same
  intermediate values and can be pruned on its own.

Timing facts are the stack's: every run's ``wall_time_s`` is the time the stack trained (the K runs shared it),
``train_images_per_s`` its own images over that time. The metrics of an epoch are read from the device once, at
its end.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
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
EPOCH_HOOK = Callable[[int, int, float], bool]  # (run index, epoch 0-based, val acc) -> prune this run?
#: The epoch's scalars of the step's and evaluation's metrics, by the names ``ViTClassifier`` logs them under
TRAIN_TAGS = {"loss": "train/loss", "acc": "train/acc", "acc_top5": "train/acc_top5"}
VAL_TAGS = {"loss": "val/loss", "acc": "val/acc", "acc_top5": "val/acc_top5", "test": "test/acc"}


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
    """A run's bookkeeping during training: its spec, what :func:`ablations.training.build_run` built, its record."""

    spec: StackedRun
    config: RunConfig
    datamodule: Any
    module: Any  # its ViTClassifier (its backbone becomes part of the stack)
    facts: dict
    tracker: Any = None  # its ConvergenceTracker
    logger: Any = None
    diagnostics: Any = None
    resumed_from: str | None = None
    grad_norms: Any = None  # its block gradient norms at a diagnosed epoch's first step
    finished: bool = False
    status: str = "completed"
    pruned_at: int | None = None


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

    from ablations.training import build_run, deterministic_without_nan_fill, prepare_process

    configs = [s.config for s in specs]
    check_uniform(configs)
    accelerator, malloc = prepare_process(configs[0])
    device = torch.device("cuda" if accelerator == "gpu" else "cpu")
    # as the plain run's Trainer(deterministic=True), without its NaN fill; warn_only: a batching rule of vmap may
    # take a kernel without a deterministic twin where the plain run's op has one
    torch.use_deterministic_algorithms(True, warn_only=True)
    deterministic_without_nan_fill()
    runs = []
    for spec in specs:
        built = build_run(spec.config, accelerator, malloc, results_dir)
        runs.append(_Run(spec, built.config, built.datamodule, built.model, built.facts))
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
    return _Trainer(runs, device, on_epoch, graph, say, eval_batch_size).fit()


class _Trainer:
    """The epoch loop of :func:`train_stacked` (module docstring)."""

    def __init__(self, runs: list[_Run], device, on_epoch, graph, log, eval_batch_size: int | None = None) -> None:
        import torch

        from .data import StackedBatches
        from .step import build_step

        self.runs, self.device, self.on_epoch, self.log = runs, device, on_epoch, log
        first = runs[0].config
        self.k = len(runs)
        self.max_epochs = first.max_epochs
        mixups = [(r.module.mixup, r.config.seed) if r.module.mixup is not None else None for r in runs]
        eval_batch = eval_batch_size or (max(first.batch_size, EVAL_BATCH_CUDA) if device.type == "cuda"
                                         else first.batch_size)
        self.data = StackedBatches([r.datamodule for r in runs], device, batch_size=first.batch_size, mixups=mixups,
                                   num_classes=runs[0].datamodule.num_classes, eval_batch_size=eval_batch)
        self.steps_per_epoch = self.data.steps
        total = self.steps_per_epoch * self.max_epochs
        self.step = build_step(
            [r.module.model for r in runs], optimizer=first.optimizer, lrs=[r.config.lr for r in runs],
            weight_decays=[r.config.weight_decay for r in runs], betas=tuple(first.betas),
            schedules=[r.module.lr_schedule(total) for r in runs], total_steps=total, precision=first.precision,
            label_smoothing=first.label_smoothing, top5=runs[0].datamodule.num_classes > 5,
            sample=self.data.val[0].x[0, :2] if self.data.val else None)
        self.stacked, self.optimizer = self.step.stacked, self.step.optimizer
        self.lr_table = self.optimizer.lr_table.double().cpu().tolist()  # (steps + 1, K): what each run's lr was
        self.eval_step = _Eval(self.stacked, first.precision, first.label_smoothing,
                               runs[0].datamodule.num_classes > 5)
        self.graph = (device.type == "cuda") if graph is None else graph
        self.engine = f"stacked {self.k}" + (" (CUDA graph)" if self.graph else "")
        self.start_epoch = 0
        self.saved_at: float | None = None
        self.torch = torch

    # --- set-up per run ------------------------------------------------------------------------------------------
    def _open(self) -> None:
        """Each run's TensorBoard folder, registered as its plain run registers it, and its record."""
        from ablations.tb_logger import tensorboard_logger
        from ablations.training import diagnostics_callback, register_run
        from lit_modules.convergence import ConvergenceTracker

        for r in self.runs:
            r.logger = tensorboard_logger(r.spec.log_dir, r.spec.run_name)
            register_run(r.logger, r.config, r.spec.run_name, r.spec.hparams)
            r.logger.log_hyperparams(r.module.hparams_initial)  # what Lightning logs at fit start: hparams.yaml
            r.tracker = ConvergenceTracker(r.config.accuracy_thresholds)
            r.facts |= {"engine": self.engine, "stack_size": self.k}
            if r.config.diagnostics_every > 0:
                r.diagnostics = diagnostics_callback(r.config, r.datamodule)
                r.diagnostics.define(r.logger.experiment)

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
            # the record; a checkpoint that keeps the step count and divergence beside it gives them too
            r.tracker.load_state_dict({"global_step": state.get("steps", 0), "diverged": state.get("diverged", False)}
                                      | state["tracker"])
            r.finished, r.status = state["finished"], state["status"]
            r.resumed_from = str(r.spec.checkpoint_dir / CHECKPOINT)
            if r.finished:
                self.step.active[k] = False
        self.log(f"resumed {self.k} runs from epoch {self.start_epoch}")

    def _save(self, k: int, r: _Run, epoch: int) -> None:
        if r.spec.checkpoint_dir is None:
            return
        r.spec.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        state = {"epoch": epoch, "model": {n: t.detach().clone() for n, t in r.module.model.state_dict().items()},
                 "optimizer": self.optimizer.state_of(k), "tracker": r.tracker.state_dict(), "finished": r.finished,
                 "status": r.status, "config": r.config.to_dict(), "engine": self.engine}
        path = r.spec.checkpoint_dir / CHECKPOINT
        tmp = path.with_name(path.name + ".tmp")
        self.torch.save(state, tmp)
        os.replace(tmp, path)

    def _checkpoint(self, live: list[int], epoch: int, now: float) -> None:
        """Save the live runs' checkpoints after ``epoch`` (0-based): every epoch on a CPU; on a GPU once
        :data:`CHECKPOINT_EVERY_S` have passed since the last save (its epochs take a fraction of a second, K
        checkpoints of a stack much longer), and at once when a run finished."""
        every = CHECKPOINT_EVERY_S.get(self.device.type, 0.0)
        due = self.saved_at is None or now - self.saved_at >= every
        if due or any(self.runs[k].finished for k in live):
            for k in live:
                self._save(k, self.runs[k], epoch + 1)
            self.saved_at = time.perf_counter()

    # --- training ------------------------------------------------------------------------------------------------
    def fit(self) -> list[Outcome]:
        from ablations.training import log_resume

        self._open()
        self._resume()
        for r in self.runs:
            r.tracker.begin(self.max_epochs, r.module.model)
            r.tracker.start(self.start_epoch, r.tracker.global_step, r.resumed_from)
            log_resume(r.logger, r.tracker.this_process(), "the engine")
        captured = False
        try:
            for epoch in range(self.start_epoch, self.max_epochs):
                if all(r.finished for r in self.runs):
                    break
                captured = self._epoch(epoch, captured)
        except BaseException as exc:
            exc.run_summaries = [self._finish(r, "failed") for r in self.runs]
            raise
        return [Outcome(self._finish(r, "success"), r.status, r.pruned_at) for r in self.runs]

    def _epoch(self, epoch: int, captured: bool) -> bool:
        """One epoch of the live runs: train, count, validate (and maybe prune), record, diagnose, checkpoint."""
        live = [k for k, r in enumerate(self.runs) if not r.finished]
        start = time.perf_counter()
        before = self.step.active.clone()
        diagnosed = {k for k in live if self.runs[k].diagnostics is not None
                     and self.runs[k].diagnostics.is_diagnostic_epoch(epoch, self.max_epochs)}
        captured = self._train(epoch, captured, diagnosed)
        metrics = self.step.metrics.read()  # the epoch's one host sync
        train_end = time.perf_counter()
        self._count(live, metrics, before.tolist())
        val = self._evaluate()
        for k in live:
            self._validated(k, epoch, val)
        end = time.perf_counter()
        for k in live:
            if self.runs[k].status != "pruned":  # pruned now: its epoch's train loss and time are never recorded
                self._ended(k, epoch, end - start, train_end - start, metrics, k in diagnosed)
        self._checkpoint(live, epoch, end)
        return captured

    def _train(self, epoch: int, captured: bool, diagnosed: set[int]) -> bool:
        """The epoch's steps (the first captured as a CUDA graph under ``graph``); the block gradient norms of the
        ``diagnosed`` runs at its first step."""
        step = self.step
        step.metrics.reset()
        for i, batch in enumerate(self.data.epoch(epoch)):
            if self.graph and not captured:
                captured = True
                self._capture(batch)
            if self.graph:
                step.replay(batch.x, batch.targets, batch.labels, batch.weight)
            else:
                step(batch.x, batch.targets, batch.labels, batch.weight)
            if i == 0 and diagnosed:
                self._grad_norms(diagnosed)
        return captured

    def _capture(self, batch) -> None:
        try:
            self.step.capture(batch.x, batch.targets, batch.labels, batch.weight)
        except Exception as exc:  # noqa: BLE001 - e.g. a host sync inside a variant's step: train eagerly
            self.graph = False
            self.engine = self.engine.replace(" (CUDA graph)", "")
            for r in self.runs:
                r.facts["engine"] = self.engine
            self.log(f"engine: the step cannot be captured as a CUDA graph ({' '.join(str(exc).split())[:200]}); "
                     "it runs eagerly")

    def _count(self, live: list[int], metrics: dict, was_active: list[bool]) -> None:
        """Each live run's optimizer steps and images of the epoch; a run whose loss turned non-finite diverged:
        Lightning counts its skipped step (the optimizer was called) and stops it."""
        active, diverged_at = self.step.active.tolist(), self.step.diverged_at.tolist()
        for k in live:
            r = self.runs[k]
            steps = r.tracker.global_step + self.steps_per_epoch
            if was_active[k] and not active[k]:
                steps = diverged_at[k] + 1
                r.tracker.mark_diverged()
                r.finished = True
            r.tracker.trained(int(metrics["images"][k]), steps)

    def _validated(self, k: int, epoch: int, val: dict) -> None:
        """Run k's validation of ``epoch`` recorded and logged, and its intermediate value reported (True from
        ``on_epoch`` prunes it). The stop-time validation of a diverged plain run scores nothing, but its pruning
        callback reads Lightning's last ``val/acc`` again: the same value, reported for this epoch."""
        r = self.runs[k]
        if r.finished:
            last = r.tracker.latest(r.tracker.val_acc)
            if last is not None and self.on_epoch is not None:
                self.on_epoch(k, epoch, last)
            return
        r.tracker.validated(epoch + 1, val["acc"][k], r.tracker.global_step, val["test"][k], val["test_correct"][k])
        r.logger.log_metrics(_scalars(VAL_TAGS, val, k) | {"epoch": epoch}, step=max(r.tracker.global_step - 1, 0))
        if self.on_epoch is not None and self.on_epoch(k, epoch, val["acc"][k]):
            r.finished, r.status, r.pruned_at = True, "pruned", epoch
            self.step.active[k] = False

    def _ended(self, k: int, epoch: int, elapsed: float, train_time: float, metrics: dict, diagnosed: bool) -> None:
        """Run k's epoch recorded (its loss: the epoch's, or where it counted no image the last logged, as
        Lightning's ``callback_metrics`` keep it) and logged, and diagnosed when due (or when it finished)."""
        r = self.runs[k]
        loss = metrics["loss"][k]
        r.tracker.epoch_ended(epoch + 1, elapsed, train_time,
                              r.tracker.latest(r.tracker.train_loss) if loss is None else loss)
        lr = self.lr_table[min(self.optimizer.last_step, r.tracker.global_step)][k]  # stepped global_step times
        r.logger.log_metrics(_scalars(TRAIN_TAGS, metrics, k) | {"lr": lr, "epoch": epoch},
                             step=max(r.tracker.global_step - 1, 0))
        d = r.diagnostics
        if d is not None and (diagnosed or (r.finished and not d.diagnosed(epoch))):
            d.diagnose(r.logger.experiment, r.module.model, epoch, r.grad_norms)
        r.grad_norms = None

    def _grad_norms(self, wanted: set[int]) -> None:
        """Each diagnosed run's per-block gradient norms at this epoch's first step (the diagnostics callback takes
        them at its ``on_before_optimizer_step``): its rows of the stack's gradients, before they are cleared."""
        from lit_modules.diagnostics import block_grad_norms

        for k in wanted:
            model = self.runs[k].module.model
            for slot in self.stacked.slots:  # point each parameter's .grad at its row of the gradients
                model.get_parameter(slot.name).grad = self.stacked.view(self.stacked.grads, slot)[k]
            self.runs[k].grad_norms = block_grad_norms(model).clone()
            for param in model.parameters():
                param.grad = None

    def _evaluate(self) -> dict[str, list]:
        self.stacked.eval()
        val = self.eval_step(self.data.val)
        test = self.eval_step(self.data.test, per_image=True) if self.data.test else None
        self.stacked.train()
        return {"loss": val["loss"], "acc": val["acc"], "acc_top5": val["acc_top5"],
                "test": test["acc"] if test else [None] * self.k,
                "test_correct": test["correct"] if test else [None] * self.k}

    # --- the end ---------------------------------------------------------------------------------------------------
    def _finish(self, r: _Run, status: str) -> dict:
        """The run's summary, written as its plain run writes it (:func:`ablations.training.finish_run`)."""
        from ablations.training import finish_run

        r.tracker.end()
        return finish_run([r.logger], r.tracker.summary() | r.facts, r.spec.run_name, status,
                          step=r.tracker.global_step)


def _scalars(tags: dict[str, str], values: dict[str, list], k: int) -> dict[str, float]:
    """Run k's values under their TensorBoard tags (``tags``: metric name -> tag); those it has none of left out."""
    return {tag: values[name][k] for name, tag in tags.items() if values[name][k] is not None}


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

