"""The diagnostics during training: ``DiagnosticsCallback`` runs ``collect_diagnostics`` (``diagnostics.py``) on a
fixed batch every N epochs and logs its scalars (``diagnostic_scalars``), matrices and heat maps to TensorBoard
(``log_diagnostics``); the tags and definitions are in ``diagnostics.py``."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor, nn

from .diagnostics import DEFAULT_SIM_K, DEFAULT_TAU, DEFINITIONS, TAGS, block_grad_norms, collect_diagnostics

# Imported where they are used, not here: Lightning. Each takes from a tenth of a second to seconds to import, and the
# command-line tools start without them.


# --- Lightning callback ---------------------------------------------------------------------------------------------
class DiagnosticsCallback(pl.Callback):
    """Logs the residual-stream diagnostics of ``pl_module.model`` to TensorBoard every ``every_n_epochs`` epochs
    (epochs n−1, 2n−1, …) and after the last epoch, on a fixed ``batch`` (images, labels) of normalised images.

    Runs at ``on_train_epoch_end`` (after that epoch's validation), never inside a training step; per-block
    gradient norms are taken once, at the first optimizer step of a diagnostic epoch (one ``_foreach_norm``, no
    host sync until the epoch-end logging). Steps of other epochs pay one boolean check. Only global rank 0
    computes and logs. ``history`` keeps each logged epoch's scalars ({tag: value}) for summaries.
    """

    def __init__(self, batch: tuple[Tensor, Tensor] | Tensor, every_n_epochs: int = 1, tau: float = DEFAULT_TAU,
                 k: int = DEFAULT_SIM_K) -> None:
        super().__init__()
        if not isinstance(every_n_epochs, int) or isinstance(every_n_epochs, bool) or every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be a positive integer, got {every_n_epochs!r}")
        if not 0.0 <= tau <= 1.0:
            raise ValueError(f"tau must be in [0, 1], got {tau}")
        images = batch[0] if isinstance(batch, (tuple, list)) else batch
        self.images = images.detach().cpu()
        self.every_n_epochs = every_n_epochs
        self.tau = float(tau)
        self.k = k
        self.history: list[dict[str, float]] = []
        self._device_images: Tensor | None = None
        self._grad_pending = False
        self._grad_norms: Tensor | None = None
        self._last_epoch_seen: int | None = None
        self._last_logged: int | None = None

    def is_diagnostic_epoch(self, epoch: int, max_epochs: int | None) -> bool:
        """Whether epoch ``epoch`` (0-based) of a run of ``max_epochs`` is diagnosed: every n-th, and the last."""
        last = max_epochs is not None and max_epochs > 0 and epoch >= max_epochs - 1
        return (epoch + 1) % self.every_n_epochs == 0 or last

    # --- the work, for either way of training (Lightning's hooks below; the stacked engine calls them itself) ---
    def define(self, experiment) -> None:
        """Write the definitions of the tags (the text ``diag/definitions``) to a ``SummaryWriter``."""
        if experiment is not None:
            experiment.add_text(TAGS["definitions"], DEFINITIONS.format(tau=self.tau, k=self.k), global_step=0)

    def diagnose(self, experiment, model: nn.Module, epoch: int, grad_norms: Tensor | None = None) -> None:
        """Diagnose ``model`` (a ``VisionTransformer``) after ``epoch`` (0-based) and log it to ``experiment``
        (None: kept in ``history`` only); ``grad_norms``: its per-block gradient norms at the epoch's first step."""
        self._last_logged = epoch
        device = next(model.parameters()).device
        if self._device_images is None or self._device_images.device != device:
            self._device_images = self.images.to(device)
        result = collect_diagnostics(model, self._device_images, tau=self.tau, k=self.k)
        scalars = diagnostic_scalars(result, None if grad_norms is None else grad_norms.tolist())
        self.history.append({"epoch": epoch} | scalars)
        if experiment is not None:
            log_diagnostics(experiment, result, scalars, epoch)

    def diagnosed(self, epoch: int) -> bool:
        """Whether the latest diagnostic is of ``epoch``."""
        return self._last_logged == epoch

    # --- hooks ---
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.define(self._experiment(trainer))

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._grad_norms = None
        self._grad_pending = trainer.is_global_zero and self.is_diagnostic_epoch(trainer.current_epoch,
                                                                                 trainer.max_epochs)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer) -> None:
        if self._grad_pending:
            self._grad_pending = False
            self._grad_norms = block_grad_norms(_backbone(pl_module))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        epoch = trainer.current_epoch
        self._last_epoch_seen = epoch
        if self.is_diagnostic_epoch(epoch, trainer.max_epochs):
            self._diagnose(trainer, pl_module, epoch)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # stopped early (EarlyStopping, max_steps, pruning): diagnose the last epoch that ran, once
        if self._last_epoch_seen is not None and not self.diagnosed(self._last_epoch_seen):
            self._diagnose(trainer, pl_module, self._last_epoch_seen)

    def _diagnose(self, trainer: pl.Trainer, pl_module: pl.LightningModule, epoch: int) -> None:
        grad_norms, self._grad_norms, self._grad_pending = self._grad_norms, None, False
        if trainer.is_global_zero:
            self.diagnose(self._experiment(trainer), _backbone(pl_module), epoch, grad_norms)
        else:
            self._last_logged = epoch

    @staticmethod
    def _experiment(trainer: pl.Trainer):
        from lightning.pytorch.loggers import TensorBoardLogger

        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                return logger.experiment
        return None


def _backbone(pl_module: nn.Module) -> nn.Module:
    model = getattr(pl_module, "model", pl_module)
    if not hasattr(model, "residual_sites"):
        raise TypeError(f"{type(pl_module).__name__}.model is not a lit_modules.VisionTransformer")
    return model


# --- logging ---------------------------------------------------------------------------------------------------------
def diagnostic_scalars(result: dict[str, Any], grad_norms: Sequence[float] | None = None) -> dict[str, float]:
    """All scalar tags of one diagnostic (``collect_diagnostics`` output plus optional per-block grad norms)."""
    scalars: dict[str, float] = {}
    ratio_means = []
    for key in ("ratio_mean", "ratio_rms", "update_ratio", "skip_scale"):
        for sublayer, values in result[key].items():
            for layer, v in enumerate(values.tolist()):
                if not math.isnan(v):
                    scalars[TAGS[key].format(sublayer=sublayer, layer=layer)] = v
                    if key == "ratio_mean":
                        ratio_means.append(v)
    for key in ("stream_rms", "attn_sim_adj", "attn_sim_ratio", "attn_sim_k", "attn_sim_k_ratio", "attn_entropy"):
        values = result[key].tolist()
        for layer, v in enumerate(values):
            scalars[TAGS[key].format(layer=layer)] = v
        if key != "stream_rms" and values:
            scalars[TAGS[f"{key}_mean"]] = sum(values) / len(values)
    pairs = len(result["attn_sim_k_ratio"])
    if pairs:  # L ≥ 2: blocks 0..L−2 each have a following block
        count = int(result["similar_blocks"])
        scalars[TAGS["similar_blocks"]] = float(count)
        scalars[TAGS["similar_blocks_fraction"]] = count / pairs
    if ratio_means:
        scalars[TAGS["ratio_mean_avg"]] = sum(ratio_means) / len(ratio_means)
    for layer, v in enumerate(grad_norms or []):
        scalars[TAGS["grad_norm"].format(layer=layer)] = float(v)
    gain = result.get("composite_gain")
    if gain is not None:
        scalars[TAGS["composite_gain_forward"]] = gain["forward"]
        scalars[TAGS["composite_gain_backward"]] = gain["backward"]
    for sublayer, per_layer in result["params"].items():
        for layer, stats in per_layer.items():
            for k, v in stats.items():
                scalars[TAGS["param"].format(sublayer=sublayer, layer=layer, key=k)] = v
    return scalars


def log_diagnostics(experiment, result: dict[str, Any], scalars: dict[str, float], step: int) -> None:
    """Write scalars, heat-map images and JSON text of one diagnostic to a ``SummaryWriter`` at ``step``."""
    for tag, value in scalars.items():
        experiment.add_scalar(tag, value, global_step=step)
    sim = result["attn_sim_full"]
    experiment.add_figure(TAGS["attn_sim_full"], heatmap(
        sim, title=f"attention column similarity (epoch {step})", xlabel="layer q", ylabel="layer p",
        vmin=0.0, vmax=1.0), global_step=step)
    experiment.add_text(TAGS["attn_sim_full_json"], json.dumps(_json_matrix(sim)), global_step=step)
    sublayers = result["sublayers"]  # the per-layer branch/stream ratios at a glance: one row per sublayer
    experiment.add_figure(TAGS["ratio_map"], heatmap(
        torch.stack([result["ratio_mean"][s] for s in sublayers]), title=f"branch/stream ratio ‖b‖/‖x‖ (epoch {step})",
        xlabel="layer", ylabel="sublayer", row_labels=sublayers), global_step=step)
    weights = result.get("depth_weights")
    if weights is not None:
        rows = result.get("depth_weights_rows") or [str(i) for i in range(weights.shape[0])]
        experiment.add_figure(TAGS["depth_weights"], heatmap(
            weights, title=f"depth weights (epoch {step})", xlabel=result.get("depth_weights_columns") or "source j",
            ylabel="consumer", row_labels=rows), global_step=step)
        experiment.add_text(TAGS["depth_weights_json"], json.dumps(_json_matrix(weights)), global_step=step)


def _json_matrix(matrix: Tensor) -> list[list[float | None]]:
    return [[None if math.isnan(v) else v for v in row] for row in matrix.tolist()]


def heatmap(matrix: Tensor, *, title: str, xlabel: str, ylabel: str, vmin: float | None = None,
            vmax: float | None = None, row_labels: Sequence[str] | None = None):
    """A matplotlib Figure (Agg canvas, no pyplot state) of a matrix, NaN cells blank, values annotated when small."""
    data = matrix.detach().double().cpu().numpy()
    rows, cols = data.shape
    width, height = 2.0 + 0.45 * max(cols, 4), 1.0 + 0.4 * max(rows, 4)
    fig = Figure(figsize=(width, height), dpi=80)
    FigureCanvasAgg(fig)
    # fixed margins (inches) instead of tight_layout, which costs more than the rest of the figure
    fig.subplots_adjust(left=0.9 / width, right=1 - 0.6 / width, bottom=0.55 / height, top=1 - 0.35 / height)
    ax = fig.add_subplot()
    image = ax.imshow(data, vmin=vmin, vmax=vmax, cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.05, pad=0.03)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xticks(range(cols))
    ax.set_yticks(range(rows), labels=list(row_labels) if row_labels is not None else None)
    if rows * cols <= 256:
        for i in range(rows):
            for j in range(cols):
                if not math.isnan(data[i, j]):
                    bright = image.norm(data[i, j]) > 0.6  # viridis turns yellow: dark text there
                    ax.text(j, i, f"{data[i, j]:.2f}", ha="center", va="center", fontsize=6,
                            color="k" if bright else "w")
    return fig
