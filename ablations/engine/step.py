"""The stacked train step: forward, per-run loss, backward, optimiser, metrics — on the device, without a host sync.

One call trains every run of a :class:`~ablations.engine.stack.StackedModel` on its own batch. A batch has a static
shape: ``x`` (K, B, ...) and ``weight`` (K, B), 1 for a real image and 0 for padding, so that the last, smaller
batch of an epoch runs through the same kernels (and the same captured CUDA graph) as the others; a run's loss is
the mean over its real images, as the plain run's ``F.cross_entropy`` of the smaller batch is.

What the plain run does per batch (:class:`lit_modules.classifier.ViTClassifier.training_step`) happens per run:

- the loss: cross-entropy with label smoothing against the labels, or against the soft targets of Mixup/CutMix
  (the accuracy then still against the hard labels);
- divergence: a run whose loss is not finite takes no step (its weights stay as they were) and is inactive from
  then on, as the plain run skips that step and stops; ``diverged_at`` records the optimizer steps it had taken;
- the epoch's metrics are sums on the device (loss·images, correct top-1, correct top-5, images, of the batches
  a run trained on), read once per epoch (:meth:`StackedStep.read_metrics`).

``StackedStep.capture()`` records the whole step as a CUDA graph (static input buffers; the optimiser's step and
learning rates are device tensors), so each later step is one graph replay: the per-kernel launch cost is paid
once per model shape, at capture.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F

from .optim import StackedAdam
from .stack import StackedModel


def per_run_loss(logits: torch.Tensor, targets: torch.Tensor, weight: torch.Tensor, label_smoothing: float) -> \
        torch.Tensor:
    """(K,) each run's mean loss over its real images. ``logits`` (K, B, C); ``targets`` (K, B) class indices
    (cross-entropy with ``label_smoothing``) or (K, B, C) soft targets (Mixup/CutMix, smoothing already folded in);
    ``weight`` (K, B): 1 real, 0 padding."""
    k, b, c = logits.shape
    if targets.dim() == 2:
        losses = F.cross_entropy(logits.reshape(k * b, c), targets.reshape(-1), reduction="none",
                                 label_smoothing=label_smoothing).view(k, b)
    else:  # F.cross_entropy with probabilities, per image
        losses = -(targets * F.log_softmax(logits.float(), dim=-1)).sum(-1)
    return (losses * weight).sum(1) / weight.sum(1)


def correct(logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor, top5: bool) -> tuple[torch.Tensor, ...]:
    """(K,) real images whose top-1 (and, with ``top5``, top-5) prediction is the label."""
    hit1 = ((logits.argmax(-1) == labels) * weight).sum(1)
    if not top5:
        return (hit1,)
    hit5 = ((logits.topk(5, dim=-1).indices == labels.unsqueeze(-1)).any(-1) * weight).sum(1)
    return hit1, hit5


class Metrics:
    """Per-run sums on the device (K,): loss·images, top-1 hits, top-5 hits, images. Read with :meth:`read`."""

    def __init__(self, k: int, device: torch.device, top5: bool) -> None:
        self.top5 = top5
        self.sums = torch.zeros(4, k, device=device, dtype=torch.float64)

    def add(self, loss: torch.Tensor, hits: tuple[torch.Tensor, ...], images: torch.Tensor,
            counted: torch.Tensor) -> None:
        """Add one batch for the runs that ``counted`` it (bool (K,)); ``loss`` (K,) is each run's batch mean."""
        on = counted.to(self.sums.dtype)
        images = images.to(self.sums.dtype) * on
        rows = [torch.nan_to_num(loss.to(self.sums.dtype)) * images, hits[0].to(self.sums.dtype) * on,
                (hits[1].to(self.sums.dtype) * on) if self.top5 else torch.zeros_like(on), images]
        self.sums += torch.stack(rows)

    def reset(self) -> None:
        self.sums.zero_()

    def read(self) -> dict[str, list[float | None]]:
        """Per run: ``loss`` (the image-weighted mean of its batch losses), ``acc``, ``acc_top5``, ``images``; None
        where a run counted no image (one host sync)."""
        loss, hit1, hit5, images = self.sums.cpu().tolist()
        out: dict[str, list] = {"loss": [], "acc": [], "acc_top5": [], "images": images}
        for k, n in enumerate(images):
            out["loss"].append(loss[k] / n if n else None)
            out["acc"].append(hit1[k] / n if n else None)
            out["acc_top5"].append(hit5[k] / n if n and self.top5 else None)
        return out


class StackedStep:
    """The train step of K stacked runs (module docstring). ``precision``: ``32-true`` or ``bf16-mixed``
    (autocast of forward and loss, as Lightning's); ``top5``: count top-5 hits (more than 5 classes)."""

    def __init__(self, stacked: StackedModel, optimizer: StackedAdam, *, precision: str, label_smoothing: float,
                 top5: bool, project: bool = False) -> None:
        self.stacked, self.optimizer = stacked, optimizer
        self.label_smoothing = float(label_smoothing)
        self.project = project
        device = stacked.weights.device
        self.device = device
        # autocast's cache of cast weights must be off for a CUDA graph (torch.cuda.graphs' AMP note): the weights
        # are cast inside the step, as the captured kernels replay it
        self.autocast = (torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)
                         if precision == "bf16-mixed" else nullcontext())
        self.metrics = Metrics(stacked.k, device, top5)
        self.active = torch.ones(stacked.k, dtype=torch.bool, device=device)
        self.diverged_at = torch.full((stacked.k,), -1, dtype=torch.long, device=device)
        self.graph: Any = None
        self.static: dict[str, torch.Tensor] | None = None

    def run(self, x: torch.Tensor, targets: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor) -> None:
        """One eager step on a batch: ``x`` (K, B, ...), ``targets`` (K, B) or (K, B, C), ``labels`` (K, B) hard
        labels, ``weight`` (K, B)."""
        stacked = self.stacked
        stacked.zero_grad()
        with self.autocast:
            logits = stacked(x)
            loss = per_run_loss(logits, targets, weight, self.label_smoothing)
        finite = torch.isfinite(loss)
        newly = self.active & ~finite
        self.diverged_at.copy_(torch.where(newly, self.optimizer.step_count.long(), self.diverged_at))
        self.active &= finite
        torch.where(self.active, loss, 0.0).sum().backward()
        self.optimizer.step(self.active)
        if self.project:
            stacked.project_parameters()
        with torch.no_grad():
            logits = logits.detach().float()
            hits = correct(logits, labels, weight, self.metrics.top5)
            self.metrics.add(loss.detach(), hits, weight.sum(1), self.active)

    __call__ = run

    # --- CUDA graph ----------------------------------------------------------------------------------------------
    def capture(self, x: torch.Tensor, targets: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor,
                warmup: int = 3) -> None:
        """Record :meth:`run` as a CUDA graph on static copies of this batch's tensors (the first calls run
        eagerly on a side stream, as ``torch.cuda.graphs`` asks); afterwards :meth:`replay` feeds each batch. The
        warm-up steps train: pass the run's first batch and replay from its second. Only on CUDA."""
        if self.device.type != "cuda":
            raise ValueError("a CUDA graph needs a CUDA device")
        self.static = {"x": x.clone(), "targets": targets.clone(), "labels": labels.clone(), "weight": weight.clone()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        saved = self._state()
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self.run(**self.static)
        torch.cuda.current_stream().wait_stream(side)
        self._restore(saved)  # the warm-up steps leave no trace: the captured step is the run's first
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self.run(**self.static)
        finally:
            self._restore(saved)  # capturing ran nothing, but be exact about it (also when it failed)
        self.graph = graph

    def replay(self, x: torch.Tensor, targets: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor) -> None:
        """One step through the captured graph: copy the batch into the static buffers, replay."""
        s = self.static
        s["x"].copy_(x)
        s["targets"].copy_(targets)
        s["labels"].copy_(labels)
        s["weight"].copy_(weight)
        self.graph.replay()

    def _state(self) -> list[torch.Tensor]:
        o = self.optimizer
        return [t.clone() for t in (self.stacked.weights, o.exp_avg, o.exp_avg_sq, o.step_count, self.active,
                                    self.diverged_at, self.metrics.sums, *self.stacked.buffers.values())]

    def _restore(self, saved: list[torch.Tensor]) -> None:
        o = self.optimizer
        with torch.no_grad():
            for dst, src in zip((self.stacked.weights, o.exp_avg, o.exp_avg_sq, o.step_count, self.active,
                                 self.diverged_at, self.metrics.sums, *self.stacked.buffers.values()), saved,
                                strict=True):
                dst.copy_(src)


def build_step(backbones: list, *, optimizer: str, lrs: list[float], weight_decays: list[float],
               betas: tuple[float, float], schedules: list, total_steps: int, precision: str, label_smoothing: float,
               top5: bool, sample: torch.Tensor | None) -> StackedStep:
    """The stacked train step of ``backbones`` (K ``VisionTransformer`` of one layout, each built as its run builds
    it): their stack, Adam(W) at each run's ``lrs[k] · schedules[k](step)`` and weight decay over the backbone's
    parameter groups (with a parametrisation's per-group multipliers of the learning rate, weight decay and ε;
    parameters no gradient reaches left alone: ``sample`` is one batch to find them), and nGPT's projection after
    each step where the variant has one. What :func:`ablations.engine.loop.train_stacked` trains."""
    from lit_modules.classifier import ADAM_EPS

    from .optim import StackedAdam, schedule_table
    from .stack import frozen_parameters, group_scales, projects

    frozen = frozen_parameters(backbones[0], sample)
    scales = group_scales(backbones[0])
    stacked = StackedModel(backbones).train()
    table = schedule_table(lrs, schedules, total_steps)
    lr_scale = stacked.columns(scales.lr) if any(v != 1.0 for v in scales.lr.values()) else None
    eps = stacked.columns(scales.eps) if any(v != ADAM_EPS for v in scales.eps.values()) else ADAM_EPS
    adam = StackedAdam(stacked.weights, stacked.grads, kind=optimizer, lr_table=table, weight_decay=weight_decays,
                       decay=stacked.columns(scales.decay, default=0.0), lr_scale=lr_scale,
                       frozen=stacked.trainable_mask(frozen), betas=betas, eps=eps)
    return StackedStep(stacked, adam, precision=precision, label_smoothing=label_smoothing, top5=top5,
                       project=projects(backbones[0]))
