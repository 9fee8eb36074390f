"""Which engine trains a study's runs: ``plain`` (one Lightning run per trial) or ``stacked`` (the trials of a cell as
one stack, :mod:`ablations.run.stacked`), chosen per device and, on a CPU, per machine and model size.

- ``--engine plain`` / ``--engine stacked`` decide for every cell.
- ``--engine auto`` (the default): on CUDA, ``stacked`` (with the step replayed as a CUDA graph): a study-size step
  there is bound by kernel launches, which a stack of K runs shares. On a CPU, ``stacked`` only where it measured at
  least :data:`MIN_GAIN` faster per trial than the plain step *on this machine* (:func:`measure_cell`: a paired,
  interleaved timing of both steps at the cell's width, tokens and batch, depth at most 2, in the precision the run
  trains in), as precision ``auto`` decides per machine: the measurement is cached with this CPU's signature
  (``<results>/device/engine-cpu-<signature>.json``) and applies only to a machine with the same one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import layout

ENGINES = ("auto", "plain", "stacked")
#: a CPU stacks a cell's runs only when a stacked step per trial takes at most this share of the plain step
MIN_GAIN = 0.90
#: the probe: K runs stacked, depth at most PROBE_DEPTH, batch at most PROBE_BATCH, rounds x steps
PROBE_K, PROBE_DEPTH, PROBE_BATCH, PROBE_REPS, PROBE_STEPS = 4, 2, 64, 5, 2


@dataclass(frozen=True)
class Choice:
    """The engine of a cell and why (``source``)."""

    engine: str
    source: str

    @property
    def stacked(self) -> bool:
        return self.engine == "stacked"


def check(engine: str) -> str:
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; valid choices: {', '.join(ENGINES)}")
    return engine


def cache_path(signature: dict[str, Any], results_dir: str | Path = layout.RESULTS_DIR) -> Path:
    from ..machine.modes import signature_key

    return layout.device_dir(results_dir) / f"engine-cpu-{signature_key(signature)}.json"


def cell_of(size: dict[str, Any], batch: int, precision: str, fused_attn: bool) -> dict[str, Any]:
    """The probe's cell: the model's width, heads, MLP ratio, geometry, depth (capped), batch (capped), mode."""
    return {"embed_dim": size["embed_dim"], "num_heads": size["num_heads"], "mlp_ratio": size["mlp_ratio"],
            "img_size": size["img_size"], "patch_size": size["patch_size"], "in_chans": size["in_chans"],
            "num_classes": size["num_classes"], "depth": min(size["depth"], PROBE_DEPTH),
            "batch": min(batch, PROBE_BATCH), "precision": precision, "fused_attn": fused_attn, "k": PROBE_K}


def measure_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """Time the plain step against the stacked step (K = ``cell["k"]``) per trial, interleaved and paired
    (:func:`ablations.machine.timing.interleave`); the global RNGs are left as they were."""
    import torch

    from ..machine.timing import interleave, median
    from .measure import plain_step, stacked_step

    size = {k: cell[k] for k in ("embed_dim", "num_heads", "mlp_ratio", "img_size", "patch_size", "in_chans",
                                 "num_classes", "depth")}
    with torch.random.fork_rng(devices=[]):
        fns = {"plain": plain_step(size, cell["batch"], precision=cell["precision"], fused_attn=cell["fused_attn"]),
               "stacked": stacked_step(size, cell["batch"], cell["k"], precision=cell["precision"],
                                       fused_attn=cell["fused_attn"])}
        times = interleave(fns, reps=PROBE_REPS, steps=PROBE_STEPS, warmup=1)
    ratios = [s / cell["k"] / p for s, p in zip(times["stacked"], times["plain"], strict=True)]
    return {"plain_s": median(times["plain"]), "stacked_s": median(times["stacked"]),
            "per_trial_ratio": median(ratios)}


def choose(engine: str, device: str, cell: dict[str, Any] | None = None, *,
           results_dir: str | Path = layout.RESULTS_DIR, threads: int | None = None,
           measure: Callable[[dict], dict] | None = measure_cell) -> Choice:
    """The engine of a cell (module docstring). ``cell``: :func:`cell_of` (needed on a CPU under ``auto``);
    ``measure=None``: never measure (a dry run), say what a run would do."""
    check(engine)
    if engine != "auto":
        return Choice(engine, f"--engine {engine}")
    if device == "cuda":
        return Choice("stacked", "rule: CUDA -> stacked trials, each step one CUDA graph replay")
    from ..machine.modes import cpu_signature, locked, write_atomically

    signature = cpu_signature(threads)
    path = cache_path(signature, results_dir)
    table = _read(path, signature)
    found = next((c for c in table["cells"] if c["cell"] == cell), None)
    if found is None:
        if measure is None:
            return Choice("plain", "auto: not measured on this CPU yet (a run measures stacked vs plain first)")
        with locked(path):
            table = _read(path, signature)
            found = next((c for c in table["cells"] if c["cell"] == cell), None)
            if found is None:
                found = {"cell": cell, **measure(cell)}
                table["cells"].append(found)
                write_atomically(path, json.dumps(table, indent=1) + "\n")
    ratio = found["per_trial_ratio"]
    verdict = "stacked" if ratio <= MIN_GAIN else "plain"
    return Choice(verdict, f"auto: stacked {cell['k']} measured at {ratio:.2f}x the plain step per trial on this CPU "
                           f"({path}; stacks at <= {MIN_GAIN:.2f}x)")


def _read(path: Path, signature: dict[str, Any]) -> dict:
    if path.is_file():
        try:
            table = json.loads(path.read_text())
            if table.get("machine") == signature and isinstance(table.get("cells"), list):
                return table
        except (OSError, json.JSONDecodeError):
            pass
    return {"machine": dict(signature), "cells": []}


def for_config(config: Any, engine: str, results_dir: str | Path = layout.RESULTS_DIR, *,
               measure: Callable[[dict], dict] | None = measure_cell) -> Choice:
    """The engine of a run's cell (:func:`choose`): its device as the run resolves its accelerator, and on a CPU its
    model size in the mode precision ``auto`` gives it (a measured mode table or probe, as the run itself does)."""
    from data import dataset_shape

    from ..machine.modes import auto_mode, model_size, probe, tokens
    from .loop import device_of

    check(engine)
    device = device_of(config).type
    if engine != "auto" or device == "cuda":
        return choose(engine, device)
    shape = dataset_shape(config)
    patch = config.patch_size or shape["patch_size"]
    size = model_size(config, shape["img_size"], patch, shape["in_chans"], shape["num_classes"])
    if config.precision == "auto":
        mode = auto_mode("cpu", config.embed_dim, tokens(shape["img_size"], patch), results_dir=results_dir,
                         threads=config.threads, measure=probe(size, config.batch_size) if measure else None)
        precision, fused = mode.precision, mode.fused_attn if config.fused_attn is None else config.fused_attn
    else:
        precision, fused = config.precision, config.fused_attn is not False
    return choose(engine, "cpu", cell_of(size, config.batch_size, precision, fused), results_dir=results_dir,
                  threads=config.threads, measure=measure)
