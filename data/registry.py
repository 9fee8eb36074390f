"""The dataset registry: each name's DataModule class, ``build_datamodule`` and what a dataset's shape is before
loading (``dataset_shape``). Imported through ``data`` on first use."""

from __future__ import annotations

from importlib import import_module
from typing import Any

from data.base import DataModuleBase, TrainAugment
from data.names import DATASET_CLASSES

UNKNOWN_SIZES = (10000, 2000)  # (train, val) assumed for a dataset whose size is only known after loading

#: dataset name -> its DataModule class (``data.names.DATASET_CLASSES``, imported)
DATASETS: dict[str, type[DataModuleBase]] = {
    name: getattr(import_module(path.split(":")[0]), path.split(":")[1]) for name, path in DATASET_CLASSES.items()
}


def build_datamodule(
    name: str,
    *,
    data_dir: str | None = None,
    batch_size: int = 128,
    val_fraction: float = 0.2,
    test_fraction: float = 0.2,
    seed: int = 0,
    augment: bool = True,
    num_workers: int = 0,
    train_augment: TrainAugment | None = None,
    **kwargs: Any,
) -> DataModuleBase:
    """Construct the DataModule registered as ``name``; dataset-specific options go in ``kwargs``.

    Raises ValueError for an unknown name and DataError (a ValueError) for a missing or malformed data folder.
    Construction is cheap (no data is loaded until ``setup()``).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid choices: {', '.join(sorted(DATASETS))}")
    common = dict(
        data_dir=data_dir,
        batch_size=batch_size,
        val_fraction=val_fraction,
        test_fraction=test_fraction,
        seed=seed,
        augment=augment,
        num_workers=num_workers,
        train_augment=train_augment,
    )
    return DATASETS[name](**common, **kwargs)


def dataset_shape(config: Any) -> dict:
    """What the dataset class knows before loading: img_size, in_chans, num_classes, default patch size and the
    (train, val + test) images a trial trains on and evaluates per epoch (:func:`data.base.split_sizes` of its pool
    or official splits, at the config's fractions; otherwise :data:`UNKNOWN_SIZES`). From the constructed
    DataModule (cheap), else the class attributes."""
    from data.base import split_sizes

    try:
        dm = build_datamodule(config.dataset, data_dir=config.data_dir, **config.dataset_options)
    except Exception:  # noqa: BLE001 - e.g. a folder dataset not on this machine: the class still knows its shape
        dm = DATASETS.get(config.dataset)
    sizes = split_sizes(getattr(dm, "pool_size", None), getattr(dm, "official_sizes", None), config.val_fraction,
                        config.test_fraction)
    return {"img_size": getattr(dm, "img_size", 32), "in_chans": getattr(dm, "in_chans", 3),
            "num_classes": getattr(dm, "num_classes", 10), "patch_size": getattr(dm, "default_patch_size", 4),
            "sizes": (sizes[0], sizes[1] + sizes[2]) if sizes else UNKNOWN_SIZES}
