"""What each DDP rank really did, observed from inside the rank (used by test_ddp.py).

:class:`DdpProbe` is a Lightning callback defined at module level, so it pickles into the ranks of ``ddp_spawn``
(the spawned processes inherit the test process's ``sys.path``, which holds tests/). Each rank records, per epoch,
a fingerprint of every training and validation image it was fed and a digest of its weights at the epoch's end, and
the process group it ran in, and writes them to ``<out_dir>/rank<global rank>.json`` at the end of fit.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch


def fingerprints(images: torch.Tensor, labels: torch.Tensor) -> list[str]:
    """One string per (image, label) row: a hash of the image's exact float bytes, then the label."""
    rows = images.detach().cpu().contiguous().flatten(1)
    return [f"{hashlib.sha1(row.numpy().tobytes()).hexdigest()}:{int(label)}"
            for row, label in zip(rows, labels.tolist(), strict=True)]


def weights_digest(module: torch.nn.Module) -> str:
    """A hash of every parameter's name, shape and exact bytes, in registration order."""
    digest = hashlib.sha1()
    for name, param in module.named_parameters():
        digest.update(f"{name}{tuple(param.shape)}".encode())
        digest.update(param.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class DdpProbe(pl.Callback):
    """Records what this rank trained and validated on; ``<out_dir>/rank<r>.json`` holds ``rank``,
    ``world_size``, ``loader_view`` (``data.loader.rank_and_world_size()`` as the loaders saw it), ``train`` and
    ``val`` (``{epoch: [fingerprint, ...]}`` in the order fed) and ``weights`` (``{epoch:`` :func:`weights_digest`
    ``}`` of the backbone at the end of each training epoch, after that epoch's validation)."""

    def __init__(self, out_dir: str | Path) -> None:
        self.out_dir = str(out_dir)
        self.train: dict[int, list[str]] = {}
        self.val: dict[int, list[str]] = {}
        self.loader_view: tuple[int, int] | None = None
        self.weights: dict[int, str] = {}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self.train.setdefault(trainer.current_epoch, []).extend(fingerprints(*batch))

    def on_validation_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        if not trainer.sanity_checking:
            self.val.setdefault(trainer.current_epoch, []).extend(fingerprints(*batch))

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        from data.loader import rank_and_world_size

        self.loader_view = rank_and_world_size()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.weights[trainer.current_epoch] = weights_digest(getattr(pl_module, "model", pl_module))

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        record = {"rank": trainer.global_rank, "world_size": trainer.world_size, "loader_view": self.loader_view,
                  "train": self.train, "val": self.val, "weights": self.weights}
        Path(self.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(self.out_dir) / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def read_probes(out_dir: str | Path, world_size: int) -> list[dict[str, Any]]:
    """The records of ranks ``0 .. world_size - 1``, epochs as ints."""
    records = []
    for rank in range(world_size):
        record = json.loads((Path(out_dir) / f"rank{rank}.json").read_text())
        for key in ("train", "val", "weights"):
            record[key] = {int(epoch): items for epoch, items in record[key].items()}
        records.append(record)
    return records
