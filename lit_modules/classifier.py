"""``ViTClassifier``: the LightningModule that trains one ``VisionTransformer`` for image classification.

Optimisation: AdamW (or Adam with L2 decay, ``optimizer="adam"``) over the backbone's own parameter groups (no weight decay on biases, norms, embeddings and
the variants' scalars), linear warmup then cosine decay, stepped per optimizer step.

The schedule is a ``torch.optim.lr_scheduler.LambdaLR`` driven by :class:`WarmupCosine` with Lightning's
``interval="step"``, not timm's ``CosineLRScheduler``: the two give the same curve, but LambdaLR needs no
``lr_scheduler_step`` override, and its state (the step count) round-trips through Lightning checkpoints as is,
so a resumed run continues the schedule where it stopped.

Divergence: a non-finite training loss skips that optimizer step (``training_step`` returns None, so no backward
and no update), sets ``self.diverged`` and ``trainer.should_stop``; the run ends cleanly after that batch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from data.augment import SeededMixup
from data.common import seeded_generator

from .config import FIELDS as MODEL_FIELDS
from .config import OPTIM_FIELDS, OptimConfig, ViTConfig
from .names import OPTIMIZER_CLASSES as OPTIMIZER_PATHS
from .names import resolve
from .vit import VisionTransformer

#: ``optimizer`` name -> its torch.optim class (names and classes: ``lit_modules.names.OPTIMIZER_CLASSES``)
OPTIMIZER_CLASSES: dict[str, type[torch.optim.Optimizer]] = resolve(OPTIMIZER_PATHS)
MIXUP_STREAM = 0x313C  # keeps the Mixup draws apart from the data's streams of the same (seed, epoch)
ADAM_EPS = 1e-8  # Adam(W)'s ε (torch's default); a parametrisation may scale it per group (``eps_scale``)


class WarmupCosine:
    """LR multiplier at optimizer step ``s``: linear warmup over ``warmup_steps`` (from ``1/warmup_steps`` to 1),
    then cosine from 1 down to ``min_ratio`` at ``total_steps``; constant ``min_ratio`` afterwards.

    A class, not a lambda, so LambdaLR's ``state_dict`` stores it (its attributes) with the scheduler.
    """

    def __init__(self, warmup_steps: int, total_steps: int, min_ratio: float = 0.0) -> None:
        self.warmup_steps = max(0, min(int(warmup_steps), int(total_steps)))
        self.total_steps = max(1, int(total_steps))
        self.min_ratio = float(min_ratio)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        decay = self.total_steps - self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / decay) if decay > 0 else 1.0
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def optimizer_groups(model: VisionTransformer, lr: float, weight_decay: float) -> list[dict[str, Any]]:
    """``model``'s parameter groups as the optimiser takes them (``VisionTransformer.param_groups``: weight decay
    per group), with a parametrisation's per-group multipliers of the learning rate and of Adam's ε applied as the
    groups' ``lr`` and ``eps`` (CompleteP's ``lr_scale`` and ``eps_scale``; none by default)."""
    groups = [g | {"lr": lr * g["lr_scale"]} if "lr_scale" in g else g for g in model.param_groups(weight_decay)]
    return [g | {"eps": ADAM_EPS * g["eps_scale"]} if "eps_scale" in g else g for g in groups]


class ViTClassifier(pl.LightningModule):
    """Image classification with a ``VisionTransformer`` backbone (``self.model``) whose residual is chosen by name.

    Logged once per epoch: ``train/loss``, ``train/acc`` (+ ``train/acc_top5``), ``val/loss``, ``val/acc``,
    ``val/acc_top5`` (top-5 only when ``num_classes > 5``) and ``lr`` (the learning rate at the epoch's end).
    Accuracies are micro-averaged (the plain fraction of correct images); ``train/loss`` and ``val/loss`` are the
    image-weighted means of the epoch's batch losses. Under DDP each is the value over all ranks' images: they are
    torchmetrics objects, whose sums and counts are summed across ranks. (``val/loss`` is a ``MeanMetric``, not a
    tensor logged with ``sync_dist=True``: Lightning averages the ranks' image counts, under gloo in integer
    arithmetic, so val shards of 13 and 12 images counted 12, not 12.5, and the loss came out 25/24 too high.)

    The training step does no per-step metric or logging work: it keeps each batch's detached logits, labels and
    loss, and the torchmetrics objects consume them in one batched update every ``TRAIN_METRIC_ROWS`` images and at
    the epoch's last batch, where the epoch values are logged (before the callbacks' ``on_train_epoch_end``, so
    ``ConvergenceTracker`` sees them). ``self.log`` costs ~1 ms per call and a torchmetrics update ~0.2-0.5 ms:
    with ~50 ms steps that alone was a 5-6% slower loop (``python -m ablations.bench``, section 3).

    ``mixup`` (timm ``Mixup``'s ``mixup_alpha``, ``cutmix_alpha``, ``prob``, ``switch_prob``) mixes each training
    batch and trains on the soft targets, with ``label_smoothing`` folded into them as timm does; ``train/acc`` is
    then the accuracy of the mixed images against their unmixed (hard) labels, and validation is never mixed.

    ``steps_per_epoch=None`` takes the schedule length from ``trainer.estimated_stepping_batches`` (correct under
    DDP and gradient accumulation); pass it to make the schedule independent of the Trainer.

    The backbone is a :class:`lit_modules.config.ViTConfig` (``ViTClassifier(cfg)``) and the optimiser an
    :class:`lit_modules.config.OptimConfig` (``optim=``); either's fields may also be given as keyword arguments
    (``ViTClassifier("layerscale", depth=8, lr=2e-3)``), which is how ``hparams.yaml`` stores them.
    """

    TRAIN_METRIC_ROWS = 1 << 16  # buffered training images before the metrics consume them

    def __init__(self, residual: ViTConfig | str = "standard", residual_options: Mapping[str, Any] | None = None,
                 *, optim: OptimConfig | None = None, max_epochs: int = 30, steps_per_epoch: int | None = None,
                 mixup: Mapping[str, float] | None = None, seed: int = 0, **fields: Any) -> None:
        super().__init__()
        unknown = sorted(set(fields) - set(MODEL_FIELDS) - set(OPTIM_FIELDS))
        if unknown:
            raise TypeError(f"unknown argument {unknown[0]!r}; valid: the backbone's fields "
                            f"({', '.join(MODEL_FIELDS)}) and the optimiser's ({', '.join(OPTIM_FIELDS)})")
        cfg = ViTConfig.build(residual, residual_options, **{k: v for k, v in fields.items() if k in MODEL_FIELDS})
        optim = dataclasses.replace(optim or OptimConfig(), **{k: v for k, v in fields.items() if k in OPTIM_FIELDS})
        if cfg.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2 for classification, got {cfg.num_classes}")
        optim.check()
        if steps_per_epoch is not None and steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be positive, got {steps_per_epoch}")
        self.optim = optim  # the optimiser and its schedule, passed whole (configure_optimizers, lr_schedule)
        # flat, so that hparams.yaml lists every field and load_from_checkpoint(**hparams) rebuilds the same module
        self.save_hyperparameters(cfg.to_dict() | optim.to_dict() | {
            "max_epochs": max_epochs, "steps_per_epoch": steps_per_epoch, "mixup": mixup, "seed": seed})
        self.model = VisionTransformer(cfg)
        num_classes = cfg.num_classes
        # Mixup/CutMix with the label smoothing folded into its soft targets (timm's Mixup), seeded per batch
        self.mixup = (SeededMixup(**mixup, label_smoothing=optim.label_smoothing, num_classes=num_classes)
                      if mixup else None)
        self.diverged = False
        self.diverged_at_step: int | None = None
        top5 = num_classes > 5
        self.train_loss = MeanMetric()
        self.val_loss = MeanMetric()
        self._train_batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.train_acc = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.train_acc5 = MulticlassAccuracy(num_classes, top_k=5, average="micro") if top5 else None
        self.val_acc5 = MulticlassAccuracy(num_classes, top_k=5, average="micro") if top5 else None
        self.test_acc = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self._test_loader: Any = None
        #: which test images the latest validated epoch classified correctly (bool, test-loader order; CPU)
        self.test_correct: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    # --- steps -----------------------------------------------------------------------------------------------------
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        x, y = batch
        if self.mixup is not None:  # soft targets; the accuracy is still measured against the hard labels y
            x, targets = self.mixup(x, y, self.batch_generator(batch_idx))
            logits = self(x)
            loss = F.cross_entropy(logits, targets)
        else:
            logits = self(x)
            loss = F.cross_entropy(logits, y, label_smoothing=self.optim.label_smoothing)
        if not torch.isfinite(loss):
            if not self.diverged:
                self.diverged, self.diverged_at_step = True, self.global_step
                rank_zero_warn(f"training loss is {loss.item()} at step {self.global_step}: the run diverged; "
                               "skipping the step and stopping")
            self.trainer.should_stop = True
            return None  # skip this step: no backward, no parameter update
        # Hot path: keep the batch's outputs; the metrics consume them in bulk (see the class docstring).
        self._train_batches.append((logits.detach(), y, loss.detach()))
        if len(self._train_batches) * len(y) >= self.TRAIN_METRIC_ROWS:
            self._update_train_metrics()
        return loss

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        """Lightning's step, then the backbone's parameter constraint (nGPT's unit-norm matrices; a no-op for every
        other variant): part of every training step, so a checkpoint always holds projected weights."""
        super().optimizer_step(*args, **kwargs)
        self.model.project_parameters()

    def batch_generator(self, batch_idx: int) -> torch.Generator:
        """The generator of one training batch's Mixup/CutMix draws: seeded by (seed, epoch, batch, rank), so every
        variant of a study mixes the same images with the same λ, and a resumed run mixes as the first attempt did."""
        return seeded_generator(self.hparams.seed, self.current_epoch, batch_idx, self.global_rank, MIXUP_STREAM)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        trainer = self.trainer
        if (batch_idx + 1 >= trainer.num_training_batches or trainer.should_stop
                or 0 <= trainer.max_steps <= self.global_step):  # the epoch's last batch: log before callbacks read
            self._log_train_metrics()

    def on_train_epoch_end(self) -> None:
        self._log_train_metrics()  # only if an epoch ended in a way on_train_batch_end did not foresee
        self.log("lr", self.optimizers().param_groups[0]["lr"])

    def _update_train_metrics(self) -> None:
        if not self._train_batches:
            return
        batches = self._train_batches
        logits, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        losses = torch.stack([b[2] for b in batches])
        self.train_loss.update(losses, weight=losses.new_tensor([len(b[1]) for b in batches]))
        self.train_acc.update(logits, y)
        if self.train_acc5 is not None:
            self.train_acc5.update(logits, y)
        self._train_batches.clear()

    def _log_train_metrics(self) -> None:
        """Log the epoch's training metrics once (from whichever of the two hooks comes first) and reset them."""
        self._update_train_metrics()
        if not self.train_loss.update_count:
            return
        for name, metric in (("train/loss", self.train_loss), ("train/acc", self.train_acc),
                             ("train/acc_top5", self.train_acc5)):
            if metric is not None:
                self.log(name, metric.compute(), on_step=False, on_epoch=True)  # compute() syncs across ranks
                metric.reset()

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        if self.diverged:  # Lightning validates once more when a run stops: don't score the broken model
            return
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y, label_smoothing=self.optim.label_smoothing)
        n = len(y)
        self.val_loss.update(loss, weight=n)
        self.val_acc(logits, y)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, batch_size=n)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, batch_size=n, prog_bar=True)
        if self.val_acc5 is not None:
            self.val_acc5(logits, y)
            self.log("val/acc_top5", self.val_acc5, on_step=False, on_epoch=True, batch_size=n)

    def on_validation_epoch_end(self) -> None:
        """Score the test split after every validation, as ``test/acc`` (the datamodule's ``test_dataloader``; none:
        nothing). It is recorded, never selected on: the best epoch, early stopping and a study's tuned learning
        rate read ``val/acc`` only. The test split is the same for every seed and variant (:mod:`data.base`)."""
        trainer = self.trainer
        if self.diverged or trainer.sanity_checking:
            return
        if self._test_loader is None:
            datamodule = getattr(trainer, "datamodule", None)
            self._test_loader = getattr(datamodule, "test_dataloader", lambda: None)() or False
        if self._test_loader is False:
            return
        correct = []
        with trainer.precision_plugin.val_step_context(), torch.no_grad():
            for x, y in self._test_loader:
                logits, y = self(x.to(self.device)), y.to(self.device)
                self.test_acc.update(logits, y)
                correct.append(logits.argmax(dim=-1) == y)
        self.test_correct = torch.cat(correct).cpu() if correct else None  # one host copy per epoch
        self.log("test/acc", self.test_acc.compute(), on_step=False, on_epoch=True)  # compute() syncs across ranks
        self.test_acc.reset()

    # --- optimisation --------------------------------------------------------------------------------------------
    def schedule_steps(self, total: int | None = None) -> tuple[int, int]:
        """(warmup steps, total steps) of the learning-rate schedule: ``warmup_epochs`` epochs of ``total`` optimizer
        steps (default: ``steps_per_epoch`` × ``max_epochs``, else the Trainer's estimate)."""
        hp = self.hparams
        if total is not None:
            per_epoch = total / max(1, hp.max_epochs)
        elif hp.steps_per_epoch is not None:
            per_epoch = float(hp.steps_per_epoch)
            total = hp.steps_per_epoch * hp.max_epochs
        else:
            total = int(self.trainer.estimated_stepping_batches)
            per_epoch = total / max(1, self.trainer.max_epochs or hp.max_epochs)
        return round(self.optim.warmup_epochs * per_epoch), max(1, total)

    def lr_schedule(self, total: int | None = None) -> WarmupCosine:
        """The multiplier of the learning rate per optimizer step (:meth:`schedule_steps`' warm-up and length)."""
        warmup, total = self.schedule_steps(total)
        return WarmupCosine(warmup, total, self.optim.min_lr / self.optim.lr)

    def configure_optimizers(self) -> dict[str, Any]:
        opt = self.optim
        groups = optimizer_groups(self.model, opt.lr, opt.weight_decay)
        # fused=True: one kernel for all parameters instead of a Python loop with per-parameter ``.item()`` calls
        optimizer = OPTIMIZER_CLASSES[opt.optimizer](groups, lr=opt.lr, betas=tuple(opt.betas), eps=ADAM_EPS,
                                                     fused=True)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, self.lr_schedule())
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1}}
