"""The TensorBoard logger of every run: Lightning's ``TensorBoardLogger`` whose writer files scalars, images and
figures under :func:`ablations.dashboard.display_tag`'s reading-order groups (``1_train/``, ``2_val/``, ...).

Module-level classes (not built inside a function) so that a trainer holding the logger pickles into the ranks of
``ddp_spawn``. Imports torch and Lightning: import this module only where a run is trained.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from torch.utils.tensorboard import SummaryWriter

from .dashboard import display_tag


class GroupedSummaryWriter(SummaryWriter):
    """A ``SummaryWriter`` whose scalar, image and figure tags go under :func:`display_tag`'s groups (text keeps
    its name)."""

    def add_scalar(self, tag: str, *args: Any, **kwargs: Any) -> Any:
        return super().add_scalar(display_tag(tag), *args, **kwargs)

    def add_image(self, tag: str, *args: Any, **kwargs: Any) -> Any:
        return super().add_image(display_tag(tag), *args, **kwargs)

    def add_figure(self, tag: str, *args: Any, **kwargs: Any) -> Any:
        return super().add_figure(display_tag(tag), *args, **kwargs)


class GroupedTensorBoardLogger(TensorBoardLogger):
    """Lightning's ``TensorBoardLogger`` writing through a :class:`GroupedSummaryWriter`."""

    @property
    @rank_zero_experiment
    def experiment(self) -> GroupedSummaryWriter:
        if self._experiment is None:
            Path(self.log_dir).mkdir(parents=True, exist_ok=True)
            self._experiment = GroupedSummaryWriter(log_dir=self.log_dir, **self._kwargs)
        return self._experiment


def tensorboard_logger(save_dir: str | Path, version: str) -> GroupedTensorBoardLogger:
    """The logger of one run folder (``<save_dir>/<version>``); no ``hp_metric`` (runs register their ``hp/*``
    metrics themselves)."""
    return GroupedTensorBoardLogger(save_dir=str(save_dir), name="", version=version, default_hp_metric=False)
