"""Convergence measures of a run: pure functions over per-epoch curves, and the callback that records them.

Conventions (shared by every function here):

* Epochs are numbered from 1: epoch 1 is the state after the first training epoch. A curve is a sequence whose
  item ``i`` belongs to epoch ``i + 1``.
* ``None`` or NaN in a val-accuracy curve means "no measurement" (e.g. the epochs a diverged run never reached);
  such an epoch never reaches a threshold and counts as 0 in the area under the curve.
* "Epochs to X" is the first epoch whose val accuracy is >= X; None when the curve never gets there.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
import numpy as np

from .predictions import pack

#: Fractions of the run's best val accuracy reported as ``epochs_to_<p>pct_of_best`` / ``steps_to_<p>pct_of_best``.
FRACTIONS_OF_BEST: tuple[float, ...] = (0.90, 0.95, 0.99)
#: Summary keys whose values are wall-clock measurements (they differ between otherwise identical runs).
TIMING_KEYS: tuple[str, ...] = ("wall_time_s", "time_per_epoch_s", "train_images_per_s", "wall_time_this_process_s")


# --- pure functions --------------------------------------------------------------------------------------------
def as_curve(values: Sequence[float | None]) -> np.ndarray:
    """The curve as float64 with None -> NaN."""
    return np.array([math.nan if v is None else float(v) for v in values], dtype=np.float64)


def best_epoch(curve: Sequence[float | None]) -> int | None:
    """First epoch with the highest value; None when the curve has no measurement."""
    c = as_curve(curve)
    if c.size == 0 or np.all(np.isnan(c)):
        return None
    return int(np.nanargmax(c)) + 1


def epochs_to_threshold(curve: Sequence[float | None], threshold: float) -> int | None:
    """First epoch whose value is >= ``threshold`` (None: never)."""
    c = as_curve(curve)
    hits = np.flatnonzero(np.nan_to_num(c, nan=-math.inf) >= threshold)
    return int(hits[0]) + 1 if hits.size else None


def epochs_to_fraction_of_best(curve: Sequence[float | None], fraction: float) -> int | None:
    """First epoch reaching ``fraction`` of the curve's own best value (None: empty curve).

    The threshold ``fraction * best`` is lowered by 1e-12 so that float rounding never makes the best epoch itself
    miss ``fraction=1``.
    """
    epoch = best_epoch(curve)
    if epoch is None:
        return None
    best = as_curve(curve)[epoch - 1]
    return epochs_to_threshold(curve, fraction * best - 1e-12)


def steps_at_epoch(steps: Sequence[int | None], epoch: int | None) -> int | None:
    """The optimizer steps taken by the end of ``epoch`` (1-based), given cumulative ``steps`` per epoch."""
    if epoch is None or epoch > len(steps):
        return None
    value = steps[epoch - 1]
    return None if value is None else int(value)


def val_acc_auc(curve: Sequence[float | None], max_epochs: int) -> float:
    """Mean val accuracy over the ``max_epochs`` planned epochs: the normalised area under the curve.

    Epochs without a measurement (missing entries or NaN, e.g. every epoch after a divergence stopped the run)
    count as accuracy 0, so a run that diverged early scores low even if its few measured epochs were good;
    measurements beyond ``max_epochs`` are ignored. Higher is better: fast and high convergence both raise it.
    """
    if max_epochs <= 0:
        raise ValueError(f"max_epochs must be positive, got {max_epochs}")
    c = np.nan_to_num(as_curve(curve)[:max_epochs], nan=0.0)
    return float(c.sum() / max_epochs)


#: The share of the last epochs over which a run's plateau is judged (``late_change``).
PLATEAU_FRACTION = 0.2


def late_change(curve: Sequence[float | None], fraction: float = PLATEAU_FRACTION) -> float | None:
    """How much the curve still moves over its last ``fraction`` of epochs: the least-squares line through those
    epochs' values, its rise from the first of them to the last (robust to one noisy epoch, unlike the endpoints).
    None with fewer than 3 such epochs or a missing value among them. A schedule long enough to plateau keeps it
    below a quarter of the study's minimum detectable effect on the run's validation accuracy."""
    c = as_curve(curve)
    k = int(round(fraction * len(c)))
    if k < 3 or np.isnan(c[-k:]).any():
        return None
    slope = np.polyfit(np.arange(k, dtype=np.float64), c[-k:], 1)[0]
    return float(slope * (k - 1))


def _at(values: Sequence[float | None], epoch: int | None) -> float | None:
    """The finite value of ``epoch`` (1-based), else None."""
    if epoch is None or epoch > len(values) or values[epoch - 1] is None or not math.isfinite(values[epoch - 1]):
        return None
    return float(values[epoch - 1])


def last_finite(values: Sequence[float | None]) -> float | None:
    """The last finite value (None when there is none)."""
    for v in reversed(list(values)):
        if v is not None and math.isfinite(v):
            return float(v)
    return None


def threshold_key(threshold: float) -> str:
    """``0.95`` -> ``epochs_to_acc_0.95``."""
    return f"epochs_to_acc_{threshold:g}"


def fraction_keys(fraction: float) -> tuple[str, str]:
    """``0.95`` -> (``epochs_to_95pct_of_best``, ``steps_to_95pct_of_best``)."""
    pct = f"{fraction * 100:g}"
    return f"epochs_to_{pct}pct_of_best", f"steps_to_{pct}pct_of_best"


def summarize(
    *,
    val_acc: Sequence[float | None],
    test_acc: Sequence[float | None] = (),
    train_loss: Sequence[float | None],
    steps: Sequence[int | None],
    epoch_times: Sequence[float],
    train_times: Sequence[float],
    images_seen: int,
    max_epochs: int,
    thresholds: Sequence[float] = (0.5, 0.8, 0.9, 0.95),
    diverged: bool = False,
    param_count: int | None = None,
    wall_time_s: float | None = None,
) -> dict[str, Any]:
    """The end-of-run summary from per-epoch records (item ``i`` = epoch ``i + 1``).

    ``val_acc`` / ``steps``: val accuracy and cumulative optimizer steps after each validated epoch;
    ``test_acc``: test accuracy after each validated epoch (empty without a test split): ``test_acc`` is the last
    measured one (the final epoch's, the reported metric), ``test_acc_at_best_val`` the one of the epoch chosen on
    validation (``best_epoch``);
    ``train_loss``: mean train loss per epoch (NaN/None entries are skipped by ``final_train_loss``);
    ``epoch_times``: wall time per epoch incl. validation (``time_per_epoch_s`` is their median: an epoch in which the
    process was paused, or the machine suspended, does not move it, nor does the first epoch's warm-up);
    ``train_times``: the training part only.
    ``final_val_acc`` is the last measured val accuracy (of a diverged run: the last epoch validated before it
    diverged). Values never reached are None. ``epochs_completed`` counts validated epochs.
    """
    curve = as_curve(val_acc)
    best = best_epoch(curve)
    summary: dict[str, Any] = {
        "best_val_acc": None if best is None else float(curve[best - 1]),
        "final_val_acc": last_finite(val_acc),
        "best_epoch": best,
        "test_acc": last_finite(test_acc),
        "test_acc_at_best_val": _at(test_acc, best),
    }
    for fraction in FRACTIONS_OF_BEST:
        e_key, s_key = fraction_keys(fraction)
        epoch = epochs_to_fraction_of_best(curve, fraction)
        summary[e_key] = epoch
        summary[s_key] = steps_at_epoch(steps, epoch)
    for t in thresholds:
        summary[threshold_key(t)] = epochs_to_threshold(curve, t)
    total_train = float(sum(train_times))
    summary.update(
        val_acc_auc=val_acc_auc(curve, max_epochs),
        val_acc_late_change=late_change(curve),
        final_train_loss=last_finite(train_loss),
        wall_time_s=float(wall_time_s) if wall_time_s is not None else float(sum(epoch_times)),
        time_per_epoch_s=float(np.median(epoch_times)) if len(epoch_times) else None,
        train_images_per_s=float(images_seen / total_train) if total_train > 0 else None,
        epochs_completed=int(np.count_nonzero(~np.isnan(curve))),
        images_seen=int(images_seen),
        diverged=bool(diverged),
        param_count=None if param_count is None else int(param_count),
        val_acc_curve=[None if math.isnan(v) else float(v) for v in curve],
        test_acc_curve=[None if v is None or not math.isfinite(v) else float(v) for v in test_acc],
        train_loss_curve=[None if v is None or not math.isfinite(v) else float(v) for v in train_loss],
    )
    return summary


# --- the callback ----------------------------------------------------------------------------------------------
def _metric(metrics: Mapping[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    return None if value is None else float(value)


class ConvergenceTracker(pl.Callback):
    """What a run records, per epoch: val accuracy, test accuracy and the per-image test results, mean train loss,
    wall time (train + val), train time, optimizer steps and images trained on; ``summary()`` turns them into the
    end-of-run dict (see :func:`summarize`).

    Both ways of training fill it through the same methods — :meth:`begin`, :meth:`start`, :meth:`trained`,
    :meth:`validated`, :meth:`epoch_ended`, :meth:`mark_diverged`, :meth:`end` —: Lightning through this callback's
    hooks, which read ``val_metric``, ``test_metric`` and ``train_metric`` from ``trainer.callback_metrics``; the
    stacked engine (:mod:`ablations.engine.loop`) calling them itself, once per run of its stack.

    Divergence is flagged by :meth:`mark_diverged` (the hooks: when the LightningModule's ``diverged`` is set, as
    ``ViTClassifier`` sets it for a loss that is not finite) or inferred from a non-finite epoch train loss. The
    records are part of the checkpoint (``state_dict``; Lightning's, and the engine's), so a resumed run keeps its
    earlier epochs, optimizer steps, divergence and wall time.

    What this process itself did is recorded apart (:meth:`this_process`): the epoch and global step training
    started from (0 and 0 for a run from scratch) and the epochs, optimizer steps, images and wall time trained
    since. A resumed run is one whose restored global step is above 0: read after loading, not from "a checkpoint
    path was passed".
    """

    def __init__(self, thresholds: Sequence[float] = (0.5, 0.8, 0.9, 0.95), val_metric: str = "val/acc",
                 train_metric: str = "train/loss", test_metric: str = "test/acc") -> None:
        super().__init__()
        self.thresholds = tuple(thresholds)
        self.val_metric, self.train_metric, self.test_metric = val_metric, train_metric, test_metric
        self.val_acc: dict[int, float] = {}  # epoch (1-based) -> value
        self.test_acc: dict[int, float] = {}
        self.test_correct: tuple[int, str] | None = None  # (epoch, packed per-image test results) of the latest
        self.val_steps: dict[int, int] = {}
        self.train_loss: dict[int, float | None] = {}
        self.epoch_times: dict[int, float] = {}
        self.train_times: dict[int, float] = {}
        self.images_seen = 0
        self.global_step = 0  # optimizer steps taken (Lightning's global_step)
        self.elapsed_before = 0.0  # wall time of earlier fits of the run (restored from a checkpoint)
        self.max_epochs: int | None = None
        self.param_count: int | None = None
        self._diverged = False
        self._fit_start: float | None = None
        self._fit_end: float | None = None
        self._epoch_start = 0.0
        self._val_start = 0.0
        self._val_time = 0.0
        self._start: dict[str, Any] = {"epoch": 0, "global_step": 0, "images_seen": 0, "checkpoint": None}

    # --- the record ---------------------------------------------------------------------------------------------
    def begin(self, max_epochs: int | None, model: Any) -> None:
        """Training begins (its wall time from now): ``max_epochs`` planned, ``model``'s parameters counted."""
        self.max_epochs = max_epochs
        self.param_count = sum(p.numel() for p in model.parameters())
        self._fit_start, self._fit_end = time.perf_counter(), None

    def start(self, epoch: int, global_step: int, checkpoint: Any = None) -> None:
        """Training starts from ``epoch`` (0-based) and ``global_step``, restored from ``checkpoint`` (a resumed run)
        or from scratch (0, 0)."""
        self._start = {"epoch": epoch, "global_step": global_step, "images_seen": self.images_seen,
                       "checkpoint": checkpoint}
        self.global_step = global_step

    def trained(self, images: int, global_step: int) -> None:
        """``images`` more trained on; ``global_step`` optimizer steps taken so far."""
        self.images_seen += images
        self.global_step = global_step

    def validated(self, epoch: int, val_acc: float, global_step: int, test_acc: float | None = None,
                  test_correct: Any = None) -> None:
        """Epoch ``epoch`` (1-based) validated after ``global_step`` optimizer steps: its val accuracy, test accuracy
        and per-image test results (a bool tensor in the test split's order, packed here; None: no test split)."""
        self.val_acc[epoch] = val_acc
        self.val_steps[epoch] = global_step
        if test_acc is not None:
            self.test_acc[epoch] = test_acc
        self.test_correct = (epoch, pack(test_correct.numpy())) if test_correct is not None else None

    def epoch_ended(self, epoch: int, elapsed: float, train_time: float, train_loss: float | None) -> None:
        """Epoch ``epoch`` (1-based) ended: its wall time (train + validation), train time and mean train loss."""
        self.epoch_times[epoch] = elapsed
        self.train_times[epoch] = train_time
        self.train_loss[epoch] = train_loss

    def mark_diverged(self) -> None:
        """The run's loss was not finite: it stopped (its later validations measure nothing)."""
        self._diverged = True

    def end(self) -> None:
        """Training ended (its wall time stops here)."""
        self._fit_end = time.perf_counter()

    def latest(self, records: Mapping[int, Any]) -> Any:
        """The value of the latest epoch in ``records`` (``val_acc``, ``train_loss``, ...); None when empty."""
        return records[max(records)] if records else None

    # --- Lightning's hooks ----------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.begin(trainer.max_epochs, getattr(pl_module, "model", pl_module))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Runs after Lightning restored the checkpoint (model, loops, this callback's records), if any."""
        self.start(trainer.current_epoch, trainer.global_step, trainer.ckpt_path)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_start, self._val_time = time.perf_counter(), 0.0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        skipped = outputs is None or (isinstance(outputs, Mapping) and outputs.get("loss") is None)
        self.trained(0 if skipped else len(batch[0]), trainer.global_step)
        self._read_divergence(pl_module)

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._read_divergence(pl_module)
        if self._diverged:  # the stop-time validation of a broken model: not a measurement
            return
        self._val_time += time.perf_counter() - self._val_start
        value = _metric(trainer.callback_metrics, self.val_metric)
        if value is not None:
            self.validated(trainer.current_epoch + 1, value, trainer.global_step,
                           _metric(trainer.callback_metrics, self.test_metric), getattr(pl_module, "test_correct", None))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        elapsed = time.perf_counter() - self._epoch_start
        self.epoch_ended(trainer.current_epoch + 1, elapsed, max(elapsed - self._val_time, 0.0),
                         _metric(trainer.callback_metrics, self.train_metric))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._read_divergence(pl_module)
        self.end()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self._read_divergence(pl_module)
        self.end()

    def _read_divergence(self, pl_module: pl.LightningModule) -> None:
        if getattr(pl_module, "diverged", False):
            self.mark_diverged()

    # --- checkpointing ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"val_acc": self.val_acc, "test_acc": self.test_acc, "val_steps": self.val_steps,
                "train_loss": self.train_loss, "test_correct": self.test_correct,
                "epoch_times": self.epoch_times, "train_times": self.train_times, "images_seen": self.images_seen,
                "elapsed": self.wall_time_s(), "global_step": self.global_step, "diverged": self._diverged}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in ("val_acc", "val_steps", "train_loss", "epoch_times", "train_times"):
            setattr(self, key, dict(state_dict[key]))
        self.test_acc = dict(state_dict.get("test_acc", {}))  # a run without a test split has none
        self.test_correct = state_dict.get("test_correct")
        self.images_seen = int(state_dict["images_seen"])
        self.elapsed_before = float(state_dict["elapsed"])
        self.global_step = int(state_dict.get("global_step", 0))
        self._diverged = bool(state_dict.get("diverged", False))

    # --- results ----------------------------------------------------------------------------------------------
    def wall_time_s(self) -> float:
        """Wall time of fit so far (incl. the earlier fits of a resumed run)."""
        return self.elapsed_before + self._session_s()

    def _session_s(self) -> float:
        if self._fit_start is None:
            return 0.0
        end = self._fit_end if self._fit_end is not None else time.perf_counter()
        return end - self._fit_start

    def this_process(self) -> dict[str, Any]:
        """Where this fit started (as it was restored) and what it trained itself."""
        start = self._start
        return {
            "resumed_from_checkpoint": start["global_step"] > 0,
            "resumed_checkpoint": None if start["global_step"] == 0 else start["checkpoint"],
            "start_epoch": int(start["epoch"]),
            "start_global_step": int(start["global_step"]),
            "epochs_this_process": sum(1 for epoch in self.epoch_times if epoch > start["epoch"]),
            "steps_this_process": int(self.global_step - start["global_step"]),
            "images_this_process": int(self.images_seen - start["images_seen"]),
            "wall_time_this_process_s": self._session_s(),
        }

    @property
    def diverged(self) -> bool:
        return self._diverged or any(v is not None and not math.isfinite(v) for v in self.train_loss.values())

    def summary(self) -> dict[str, Any]:
        """The end-of-run summary (see :func:`summarize`); callable at any time, e.g. after an exception."""
        last = max([*self.val_acc, *self.epoch_times, 0])
        epochs = range(1, last + 1)
        val_epochs = range(1, max([*self.val_acc, 0]) + 1)
        return summarize(
            val_acc=[self.val_acc.get(e) for e in val_epochs],
            test_acc=[self.test_acc.get(e) for e in val_epochs] if self.test_acc else [],
            train_loss=[self.train_loss.get(e) for e in epochs],
            steps=[self.val_steps.get(e) for e in val_epochs],
            epoch_times=[self.epoch_times[e] for e in epochs if e in self.epoch_times],
            train_times=[self.train_times[e] for e in epochs if e in self.train_times],
            images_seen=self.images_seen,
            max_epochs=self.max_epochs or max(last, 1),
            thresholds=self.thresholds,
            diverged=self.diverged,
            param_count=self.param_count,
            wall_time_s=self.wall_time_s(),
        ) | self.this_process() | self._test_correct(max([*self.val_acc, 0]))

    def _test_correct(self, last_epoch: int) -> dict[str, str]:
        """``test_correct``: the per-image test results (:func:`lit_modules.predictions.pack`) of the epoch whose
        test accuracy is the summary's ``test_acc`` (the last validated one); none when that epoch has none."""
        if self.test_correct is None or self.test_correct[0] != last_epoch:
            return {}
        return {"test_correct": self.test_correct[1]}


class StepTimer(pl.Callback):
    """A Lightning callback that times the first training batches of a compiled run: the first batch includes
    ``torch.compile``'s tracing and code generation (forward and backward), the later ones do not, so
    compile time ≈ first batch − median of the next ones (up to ``batches``)."""

    def __init__(self, batches: int = 8) -> None:
        self.batches = batches
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if len(self.times) < self.batches:
            self.times.append(time.perf_counter() - self._start)

    def compile_time_s(self) -> float | None:
        """First batch minus the median of the others; None with fewer than two batches timed."""
        if len(self.times) < 2:
            return None
        return max(0.0, self.times[0] - statistics.median(self.times[1:]))
