"""The dataset registry: each name's DataModule class, ``build_datamodule`` and what a dataset's shape is before
loading (``dataset_shape``). Imported through ``data`` on first use."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from data.base import DataModuleBase, split_sizes
from data.names import DATASET_CLASSES

UNKNOWN_SIZES = (10000, 2000)  # (train, val) assumed for a dataset whose size is only known after loading

#: dataset name -> its DataModule class (``data.names.DATASET_CLASSES``, imported)
DATASETS: dict[str, type[DataModuleBase]] = {
    name: getattr(import_module(path.split(":")[0]), path.split(":")[1]) for name, path in DATASET_CLASSES.items()
}


def build_datamodule(name: str, **kwargs: Any) -> DataModuleBase:
    """Construct the DataModule registered as ``name``: ``kwargs`` are :class:`data.base.DataModuleBase`'s
    arguments (``data_dir``, ``batch_size``, the split fractions, ``seed``, ``augment``, ``num_workers``,
    ``train_augment``; their defaults are declared there, once) and the dataset's own options.

    Raises ValueError for an unknown name and DataError (a ValueError) for a missing or malformed data folder.
    Construction is cheap (no data is loaded until ``setup()``).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid choices: {', '.join(sorted(DATASETS))}")
    return DATASETS[name](**kwargs)


def dataset_shape(config: Any) -> dict:
    """What the dataset class knows before loading: img_size, in_chans, num_classes, default patch size and the
    (train, val + test) images a trial trains on and evaluates per epoch (:func:`data.base.split_sizes` of its pool
    or official splits, at the config's fractions; otherwise :data:`UNKNOWN_SIZES`). From the constructed
    DataModule (cheap), else the class attributes."""
    try:
        dm = build_datamodule(config.dataset, data_dir=config.data_dir, **config.dataset_options)
    except Exception:  # noqa: BLE001 - e.g. a folder dataset not on this machine: the class still knows its shape
        dm = DATASETS.get(config.dataset)
    sizes = split_sizes(getattr(dm, "pool_size", None), getattr(dm, "official_sizes", None), config.val_fraction,
                        config.test_fraction)
    return {"img_size": getattr(dm, "img_size", 32), "in_chans": getattr(dm, "in_chans", 3),
            "num_classes": getattr(dm, "num_classes", 10), "patch_size": getattr(dm, "default_patch_size", 4),
            "sizes": (sizes[0], sizes[1] + sizes[2]) if sizes else UNKNOWN_SIZES}
