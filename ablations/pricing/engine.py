"""What a study costs on a GPU through the engine, from a measured stacked step: the dry run's engine lines.

A study-size trial on a GPU is bound by kernel launches, so its cost is its steps times a step's time, and the
engine trains the K trials of a cell in one step (:mod:`ablations.run.stacked`). The step time is measured, never
assumed: section 13 of a CUDA bench (``python -m ablations.bench --device cuda --sections engine``, which
``scripts/gpu_measure.py`` runs) times the stacked step of K runs replayed as a CUDA graph (``stacked K graph``) at
the study size. Each stack of the study is priced at

    steps × max(the measured call's time at the nearest measured K, scaled by depth,
                K × images per step × 3 × forward FLOPs per image / the GPU's measured FLOP rate)

(training batches, plus evaluation batches at :data:`ablations.pricing.gpu_hours.EVAL_STEP_SHARE` of a step): the
launch floor of a small model, or the arithmetic of a large one. Without such a measurement the dry run says so
and prices nothing.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import layout
from ..engine.loop import cell_key
from ..machine.modes import tokens as token_count
from .gpu_hours import (
    EVAL_STEP_SHARE,
    choose_basis,
    find_measurements,
    forward_flops,
    gpu_class_of,
    resolve_precision,
    trial_batches,
)

# Imported where they are used, not here: the datasets (data: torch). Each takes from a tenth of a second to seconds
# to import, and the command-line tools start without them.


@dataclass(frozen=True, eq=False)
class EngineStep:
    """The stacked CUDA-graph step times of one model size measured by a CUDA bench's section 13."""

    gpu: str
    gpu_class: str | None
    calls_s: dict[int, float]  # K -> seconds per call (median over rounds)
    depth: int
    embed_dim: int
    tokens: int
    batch: int
    source: str
    date: str

    def call_s(self, k: int, depth: int) -> float:
        """One stacked step of ``k`` runs at ``depth`` blocks: the smallest measured K >= k (a launch-bound call
        costs about the same for fewer runs), else the largest scaled by k / K; in proportion to the depth."""
        measured = sorted(self.calls_s)
        above = [m for m in measured if m >= k]
        seconds = self.calls_s[above[0]] if above else self.calls_s[measured[-1]] * k / measured[-1]
        return seconds * depth / self.depth


def find_engine_steps(results_dir: str | Path = layout.RESULTS_DIR) -> list[EngineStep]:
    """Every CUDA bench report's section 13 model under ``<results_dir>/device``, newest first."""
    root = layout.device_dir(results_dir)
    found = []
    for path in sorted(root.rglob("bench.json")) if root.is_dir() else []:
        try:
            report = json.loads(path.read_text())
            meta = report["meta"]
            section = report["sections"].get("engine")
            if meta.get("device") != "cuda" or not section or section.get("error"):
                continue
            gpu = meta["machine"].get("gpu")
            for model in section["data"]["models"]:
                calls = {int(name.split()[1]): statistics.median(times)
                         for name, times in model["times_s"].items() if name.startswith("stacked") and "graph" in name}
                if not calls:
                    continue
                size = model["size"]
                found.append(EngineStep(gpu, gpu_class_of(gpu), calls, int(size["depth"]), int(size["embed_dim"]),
                                        (size["img_size"] // size["patch_size"]) ** 2 + 1, int(model["batch"]),
                                        str(path), str(meta.get("started", ""))))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return sorted(found, key=lambda s: s.date, reverse=True)


def nearest(steps: Sequence[EngineStep], gpu: str, embed_dim: int, tokens: int) -> EngineStep | None:
    """The measurement of class ``gpu`` (else any) nearest (log width, log tokens); newest on ties."""
    pool = [s for s in steps if s.gpu_class == gpu] or list(steps)
    if not pool:
        return None
    return min(pool, key=lambda s: math.log(s.embed_dim / embed_dim) ** 2 + math.log(s.tokens / tokens) ** 2)


def stacks(configs: Sequence[Any], stack: int) -> list[tuple[Any, int]]:
    """(a config, K) for every stack the engine would train: the configs grouped by cell, each cell cut into stacks
    of at most ``stack`` runs."""
    cells: dict[str, list] = {}
    for config in configs:
        cells.setdefault(cell_key(config), []).append(config)
    out = []
    for members in cells.values():
        for start in range(0, len(members), stack):
            out.append((members[start], len(members[start:start + stack])))
    return out


def engine_lines(configs: Sequence[Any], gpu: str, results_dir: str | Path = layout.RESULTS_DIR,
                 stack: int = 32) -> list[str]:
    """The dry run's lines for ``configs`` (every trial the run would train, tuning stage included) trained by the
    engine on a ``gpu``-class GPU (module docstring)."""
    from data import dataset_shape

    steps = find_engine_steps(results_dir)
    if not configs:
        return []
    if not steps:
        return [f"engine (--device cuda: stacks of up to {stack} trials of a cell, each step one CUDA graph): no "
                "stacked step measured on a GPU yet, so not priced (scripts/gpu_measure.py measures one: "
                "docs/gpu-engine.md)"]
    measurements = find_measurements(results_dir)
    total, used, launch_bound = 0.0, [], 0
    groups = stacks(configs, stack)
    for config, k in groups:
        shape = dataset_shape(config)
        step = nearest(steps, gpu, config.embed_dim, token_count(shape["img_size"], config.patch_size
                                                                   or shape["patch_size"]))
        if step not in used:
            used.append(step)
        train, evaluation = trial_batches(config)
        rate = choose_basis(gpu, resolve_precision(config, "cuda", results_dir), measurements).flops_per_s
        arithmetic = k * config.batch_size * 3 * forward_flops(config, shape) / rate
        launches = step.call_s(k, config.depth)
        launch_bound += launches >= arithmetic
        total += (train + EVAL_STEP_SHARE * evaluation) * max(launches, arithmetic)
    sources = "; ".join(f"{s.gpu}: stacked step at width {s.embed_dim}, {s.tokens} tokens, depth {s.depth}, batch "
                        f"{s.batch}, " + ", ".join(f"K={k} {v * 1e3:.3g} ms" for k, v in sorted(s.calls_s.items()))
                        + f" ({s.source}, {s.date})" for s in used)
    return [f"engine (--device cuda: {len(groups)} stacks of up to {stack} trials of a cell, each step one CUDA "
            f"graph): {total / 3600:.3g} GPU-hours ({total / 60:.3g} min on one GPU, one stack at a time; "
            f"{launch_bound} of {len(groups)} stacks bound by launches, the others by arithmetic at the measured "
            f"FLOP rate); measured: {sources}"]
