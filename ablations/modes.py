"""The fastest train-step mode for a device and a model size: precision x attention kernel, measured or by rule.

A mode is Lightning's precision (``32-true`` or ``bf16-mixed``: bf16 autocast of forward and loss) and the
attention kernel (fused ``scaled_dot_product_attention`` or the explicit softmax(QKᵀ)V). Which one is fastest
depends on the device and on the model's width and token count, so it is measured:

    python -m ablations.bench --sections modes --device cpu --out results/device   # writes modes-cpu.json

times one train step (forward, cross-entropy, backward, AdamW) in all four modes per (width, tokens) cell of a
small grid, interleaved and paired (``ablations.bench``'s method), and writes ``<out>/modes-<device>.json``.
``choose_mode`` reads such a table and answers the fastest mode of the cell nearest the model in
(log width, log tokens):

- ``cuda``: the user's measured table ``results/device/modes-cuda.json`` if there is one, else the rule
  bf16 autocast + fused attention (the tensor cores' fast path; no CUDA table ships with the project).
- ``cpu``: ``results/device/modes-cpu.json`` (the user's own measurement) if there is one, else the table that
  ships with the project, ``ablations/modes_cpu.json``, measured on the project's development machine.

What was known of that machine's CPU (AMD EPYC, 2 cores, avx512_bf16, no AMX) before the table: bf16 autocast is
1.3-4x *slower* with fused attention (the CPU SDPA kernel in bf16), but 1.25-2x *faster* with explicit attention
at width >= 128; in fp32, explicit attention is 1.19-1.31x faster than fused SDPA at 17-50 tokens and equal at 5.
The packaged table (ViT depth 4, batch 64, 2 threads, torch 2.14; widths 16-384 x 5/17/65 tokens; step time vs
fp32 + fused, paired) agrees on bf16 + explicit attention where the model is big enough: 1.25-2.1x faster at width
>= 128, and from 17 tokens at width >= 32. It differs elsewhere: the smallest models (5 tokens up to width 64;
width 16 at 17 tokens) are fastest in fp32 (bf16 is 1.2-1.4x slower at width 16-32: its casts cost more than its
matmuls save), bf16 + fused attention was not slower at width >= 128, and fp32 explicit attention was 0.85-1.11x
of fused SDPA, not 1.19-1.31x faster. Its ``machine`` key has the load average it was measured under.
A CPU with AMX (Sapphire Rapids and later) or without avx512_bf16 can differ completely: measure it.

Torch-free at import: a training run's configuration step can call ``auto_mode`` cheaply.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import layout

PRECISIONS = ("32-true", "bf16-mixed")  # Lightning's names
DEVICE_TYPES = ("cpu", "cuda")
PACKAGED = {"cpu": Path(__file__).with_name("modes_cpu.json")}  # measured tables that ship with the project


@dataclass(frozen=True)
class Mode:
    """A train-step mode: Lightning precision, fused SDPA or explicit attention, and where the choice came from."""

    precision: str
    fused_attn: bool
    source: str = ""

    @property
    def key(self) -> str:
        return mode_key(self.precision, self.fused_attn)


def mode_key(precision: str, fused_attn: bool) -> str:
    """The key of a mode in a table's ``times_s``: ``32-true/fused``, ``bf16-mixed/explicit``, ..."""
    return f"{precision}/{'fused' if fused_attn else 'explicit'}"


MODE_KEYS = {mode_key(p, f): (p, f) for p in PRECISIONS for f in (True, False)}  # the table's keys, in tie order
CUDA_RULE = Mode("bf16-mixed", True, "rule: CUDA -> bf16 autocast + fused attention")


def tokens(img_size: int, patch_size: int) -> int:
    """The token count of a ViT on ``img_size``² images cut into ``patch_size``² patches: the patches plus the
    class token (what a table cell's ``tokens`` counts, and what a run is looked up by)."""
    return (img_size // patch_size) ** 2 + 1


def measured_path(device_type: str, results_dir: str | Path = layout.RESULTS_DIR) -> Path:
    """``<results_dir>/device/modes-<device>.json``: where the user's own measurement is looked for."""
    return Path(results_dir) / "device" / f"modes-{device_type}.json"


def load_table(path: str | Path) -> dict:
    """A modes table read from ``path`` and checked; a malformed one raises a one-line ValueError."""
    path = Path(path)
    try:
        table = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read modes table {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"modes table {path} is not JSON: {exc.msg} at line {exc.lineno}") from None
    return check_table(table, str(path))


def check_table(table: Any, where: str = "modes table") -> dict:
    """``table`` itself if it has the format ``ablations.bench`` writes, else a one-line ValueError naming the fault:
    ``{"device": "cpu"|"cuda", "cells": [{"embed_dim": int, "tokens": int, "times_s": {"32-true/fused": s, ...}}]}``
    where ``times_s`` holds each mode's seconds per train step (the bench writes the paired estimate: the
    reference mode's median time x the mode's median in-round ratio to it); extra keys, such as ``machine``,
    ``median_s``, ``ratios`` and ``best``, are allowed."""
    def bad(what: str) -> ValueError:
        return ValueError(f"{where}: {what}")

    if not isinstance(table, dict):
        raise bad(f"expected a JSON object, got {type(table).__name__}")
    if table.get("device") not in DEVICE_TYPES:
        raise bad(f"'device' must be one of {', '.join(DEVICE_TYPES)}, got {table.get('device')!r}")
    cells = table.get("cells")
    if not isinstance(cells, list) or not cells:
        raise bad("'cells' must be a non-empty list")
    for i, cell in enumerate(cells):
        if not isinstance(cell, dict):
            raise bad(f"cell {i} is not an object")
        for name in ("embed_dim", "tokens"):
            value = cell.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise bad(f"cell {i}: '{name}' must be a positive integer, got {value!r}")
        times = cell.get("times_s")
        if not isinstance(times, dict) or not times:
            raise bad(f"cell {i}: 'times_s' must be a non-empty object of mode -> seconds")
        for key, seconds in times.items():
            if key not in MODE_KEYS:
                raise bad(f"cell {i}: unknown mode '{key}'; valid: {', '.join(MODE_KEYS)}")
            if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not seconds > 0 \
                    or not math.isfinite(seconds):
                raise bad(f"cell {i}: time of '{key}' must be a positive number, got {seconds!r}")
    return table


def fastest(cell: dict) -> tuple[str, bool]:
    """(precision, fused_attn) of the cell's smallest time (ties: the first in ``MODE_KEYS`` order)."""
    times = cell["times_s"]
    return MODE_KEYS[min((k for k in MODE_KEYS if k in times), key=lambda k: times[k])]


def nearest_cell(table: dict, embed_dim: int, tokens: int) -> dict:
    """The cell nearest (embed_dim, tokens) in (log width, log tokens); ties: the first in the table."""
    def distance(cell: dict) -> float:
        return math.log(cell["embed_dim"] / embed_dim) ** 2 + math.log(cell["tokens"] / tokens) ** 2

    return min(table["cells"], key=distance)


def choose_mode(device_type: str, embed_dim: int, tokens: int, table: dict | str | Path | None = None, *,
                results_dir: str | Path = layout.RESULTS_DIR) -> Mode:
    """The fastest train-step mode for a ``device_type`` (``cpu`` or ``cuda``) and a model of ``embed_dim`` width
    and ``tokens`` tokens (patches + class token): from ``table`` (a table or its path) when given, else from the
    user's measured table under ``results_dir``, else the packaged table (CPU) or the rule (CUDA). See the module
    docstring. A malformed table, or one measured on another device type, raises a one-line ValueError."""
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"device_type must be one of {', '.join(DEVICE_TYPES)}, got {device_type!r}")
    if embed_dim < 1 or tokens < 1:
        raise ValueError(f"embed_dim and tokens must be positive, got {embed_dim} and {tokens}")
    if isinstance(table, (str, Path)):
        where, table = str(table), load_table(table)
    elif table is not None:
        where, table = "given table", check_table(table, "given modes table")
    else:
        where = None
        for path in (measured_path(device_type, results_dir), PACKAGED.get(device_type)):
            if path is not None and path.is_file():
                where, table = str(path), load_table(path)
                break
        if table is None:
            if device_type == "cuda":
                return CUDA_RULE
            raise ValueError(f"no modes table for {device_type}: the packaged {PACKAGED[device_type]} is missing")
    if table["device"] != device_type:
        raise ValueError(f"{where} was measured on {table['device']}, not {device_type}")
    cell = nearest_cell(table, embed_dim, tokens)
    precision, fused = fastest(cell)
    return Mode(precision, fused, f"measured: {where}, nearest cell width {cell['embed_dim']}, {cell['tokens']} tokens")


def auto_mode(accelerator: str, embed_dim: int, tokens: int, *,
              results_dir: str | Path = layout.RESULTS_DIR) -> Mode:
    """``choose_mode`` for Lightning's ``accelerator`` (``cpu``, ``gpu``/``cuda``, or ``auto``: CUDA when torch sees
    a device, else the CPU) — what a training run asks for its precision and attention kernel."""
    if accelerator == "auto":
        import torch

        accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    device_type = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda"}.get(accelerator)
    if device_type is None:
        raise ValueError(f"accelerator must be one of auto, cpu, gpu, cuda, got {accelerator!r}")
    return choose_mode(device_type, embed_dim, tokens, results_dir=results_dir)
