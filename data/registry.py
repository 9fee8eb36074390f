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


def fitted_options(name: str, options: dict, patch_size: int | None) -> dict:
    """A dataset's options with a run's patch size, for a dataset whose image size follows it (``imagefolder``:
    ``img_size: auto`` cuts the images to a whole number of the run's patches)."""
    import inspect

    cls = DATASETS.get(name)
    accepts = cls is not None and "patch_size" in inspect.signature(cls.__init__).parameters
    return options | {"patch_size": patch_size} if accepts and patch_size and "patch_size" not in options else options


def describe(config: Any) -> str:
    """One line on a run's data before anything is loaded: its own description (``imagefolder``: what its images
    are and the geometry and augmentation chosen for them), else its name, size, channels and classes; a folder
    that cannot be read says why."""
    try:
        dm = build_datamodule(config.dataset, data_dir=config.data_dir,
                              **fitted_options(config.dataset, config.dataset_options, config.patch_size))
    except (TypeError, ValueError) as exc:
        return f"{config.dataset}: {' '.join(str(exc).split())}"
    if hasattr(dm, "describe"):
        return dm.describe()
    patch = config.patch_size or dm.default_patch_size
    return (f"{config.dataset}: {dm.img_size}x{dm.img_size}, {dm.in_chans} channel(s), {dm.num_classes} classes, "
            f"patch {patch} ({(dm.img_size // patch) ** 2} tokens)")


def dataset_shape(config: Any) -> dict:
    """What the dataset class knows before loading: img_size, in_chans, num_classes, default patch size and the
    (train, val + test) images a trial trains on and evaluates per epoch (:func:`data.base.split_sizes` of its pool
    or official splits, at the config's fractions; otherwise :data:`UNKNOWN_SIZES`). From the constructed
    DataModule (cheap), else the class attributes."""
    try:
        dm = build_datamodule(config.dataset, data_dir=config.data_dir,
                              **fitted_options(config.dataset, config.dataset_options, config.patch_size))
    except Exception:  # noqa: BLE001 - e.g. a folder dataset not on this machine: the class still knows its shape
        dm = DATASETS.get(config.dataset)
    sizes = split_sizes(getattr(dm, "pool_size", None), getattr(dm, "official_sizes", None), config.val_fraction,
                        config.test_fraction)
    return {"img_size": getattr(dm, "img_size", 32), "in_chans": getattr(dm, "in_chans", 3),
            "num_classes": getattr(dm, "num_classes", 10), "patch_size": getattr(dm, "default_patch_size", 4),
            "sizes": (sizes[0], sizes[1] + sizes[2]) if sizes else UNKNOWN_SIZES}
