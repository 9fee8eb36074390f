"""The fastest train-step mode for a device and a model size: precision x attention kernel, measured.

A mode is Lightning's precision (``32-true`` or ``bf16-mixed``: bf16 autocast of forward and loss) and the
attention kernel (fused ``scaled_dot_product_attention`` or the explicit softmax(QKᵀ)V). Which one is fastest
depends on the device, on the CPU itself and on the model's width and token count, so it is measured, and a
measurement applies only to the machine it was made on:

- **A table's machine signature.** A CPU table records the CPU model, the instruction-set features that decide
  bf16 speed (``avx2``, ``avx512f``, ``avx512_bf16``, ``amx_tile``, ``amx_bf16``: those torch uses in the
  process, :func:`usable_flags`), the torch thread count and the torch version (:func:`cpu_signature`). It is
  used only where all of them are the same: the same bf16 autocast
  that is 2x faster on a CPU with avx512_bf16 is 5-10x *slower* on an AVX2-only one (no native bf16), and the
  trade-off moves with the thread count.
- **Lookup, CPU** (:func:`choose_mode`): the user's bench table ``results/device/modes-cpu.json`` (``python -m
  ablations.bench --sections modes --out results/device``), then this machine's cache of measured cells
  ``results/device/modes-cpu-<signature>.json``, then the table that ships with the project
  (``ablations/machine/modes_cpu.json``, measured on a 2-core AMD EPYC) — each only if its signature is this
  machine's. A grid table answers with its nearest cell in (log width, log tokens); the cache only for the exact
  (width, tokens) cell.
- **Otherwise it measures** (:func:`measure_cell`, when the caller allows it: a training run and the study runner
  do; a dry run does not): one train step of a small model of the run's width, heads, MLP ratio and token count
  (depth 2, batch ≤ 64) in the four modes, interleaved and paired as the bench does (a few seconds), appended to
  the cache under a file lock so that parallel workers measure a cell once. ``mode_source`` in the run summary
  says which of these it was. Without a measurement the rule is fp32 with timm's fused attention.
- **A margin for bf16.** A bf16 mode is chosen only when it is at least :data:`BF16_MARGIN` faster than the
  fastest fp32 mode of the same cell, so that timing noise never trades a 1-2 % gain for a numerics change or
  sends a borderline cell to a mode that is slower on the day.
- **CUDA**: the user's measured ``results/device/modes-cuda.json`` if there is one, else the rule bf16 autocast +
  fused attention (the tensor cores' fast path).

The packaged CPU table (AMD EPYC with avx512_bf16, no AMX, 2 threads, torch 2.14; ViT depth 4, batch 64; widths
16-384 x 5/17/65 tokens) found bf16 + explicit attention 1.25-2.1x faster at width >= 128 and from 17 tokens at
width >= 32, and fp32 fastest for the smallest models. On an AVX2-only EPYC, bf16 autocast was 10.6x slower
(forward + backward of ten study-size models: 226 ms fp32 vs 2,409 ms bf16): the reason tables never travel.

Torch-free at import: a training run's configuration step can call ``choose_mode`` cheaply.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import platform
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .. import layout
from .timing import image_batch, interleave, median, round_ratios, train_step

# Imported where they are used, not here: torch and the model (lit_modules: torch). Each takes from a tenth of a
# second to seconds to import, and the command-line tools start without them.

PRECISIONS = ("32-true", "bf16-mixed")  # Lightning's names
DEVICE_TYPES = ("cpu", "cuda")
PACKAGED = {"cpu": Path(__file__).with_name("modes_cpu.json")}  # measured tables that ship with the project
#: CPU features that decide bf16 speed (and the signature's): native bf16 dot products are avx512_bf16 / AMX.
SIGNATURE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: A bf16 mode must take at most this fraction of the fastest fp32 mode's time to be chosen.
BF16_MARGIN = 0.95
#: Explicit attention must take at most this fraction of the fused kernel's time (same precision) to be chosen: the
#: two compute the same function and often tie at small widths, where a choice by noise would differ between two
#: measurements of one machine (two checkouts, a loaded and an idle machine) and mix a study's numerics.
KERNEL_MARGIN = 0.95
#: The on-the-spot measurement: a small model of the run's width (depth 2, batch <= 64), rounds x steps per mode.
PROBE_DEPTH, PROBE_MAX_BATCH, PROBE_REPS, PROBE_STEPS, PROBE_WARMUP = 2, 64, 5, 2, 1


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


def mode_text(precision: str, fused_attn: bool, cuda: bool = False) -> str:
    """``<precision> + <fused|explicit> attention[ on cuda]``: a mode as runs.csv's ``mode`` column and the report
    name it (a CPU is not named)."""
    return f"{precision} + {'fused' if fused_attn else 'explicit'} attention" + (" on cuda" if cuda else "")


def ran_on_cuda(device: str | None, accelerator: str | None) -> bool:
    """Whether a run trained on a GPU: its recorded ``device`` (``cpu``/``cuda``; an imported row's comes from its
    mode), else, for a run that recorded none, its config's ``accelerator``."""
    return device == "cuda" if device else accelerator in ("gpu", "cuda")


MODE_KEYS = {mode_key(p, f): (p, f) for p in PRECISIONS for f in (True, False)}  # the table's keys, in tie order
CUDA_RULE = Mode("bf16-mixed", True, "rule: CUDA -> bf16 autocast + fused attention")
CPU_RULE = ("32-true", True)  # no measurement for this CPU: fp32 with timm's fused attention


def tokens(img_size: int, patch_size: int) -> int:
    """The token count of a ViT on ``img_size``² images cut into ``patch_size``² patches: the patches plus the
    class token (what a table cell's ``tokens`` counts, and what a run is looked up by)."""
    return (img_size // patch_size) ** 2 + 1


# --- machine signature -------------------------------------------------------------------------------------------
def cpu_facts() -> tuple[str, list[str]]:
    """(CPU model name, the :data:`SIGNATURE_FLAGS` it has) from ``/proc/cpuinfo`` (``unknown``, [] elsewhere)."""
    name, flags = platform.processor() or "unknown", []
    with contextlib.suppress(OSError):
        info = Path("/proc/cpuinfo").read_text()
        name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), name)
        words = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
        flags = [f for f in SIGNATURE_FLAGS if f in words]
    return name, usable_flags(flags)


def usable_flags(flags: list[str]) -> list[str]:
    """The CPU's flags whose instructions torch uses in this process: AVX-512 only when ATen's kernels run at that
    level (``ATEN_CPU_CAPABILITY`` can cap them, or a build lack them), native bf16 and AMX only when oneDNN has bf16
    here (``ONEDNN_MAX_CPU_ISA`` can cap it). A capped CPU is another machine for speed, so it gets its own
    signature; ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` makes an AVX-512 CPU one without native bf16."""
    import torch

    dropped = set()
    if "AVX512" not in torch.backends.cpu.get_cpu_capability():
        dropped.add("avx512f")
    try:
        onednn_bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (AttributeError, RuntimeError):  # a build without oneDNN's op: the flags as the CPU reports them
        onednn_bf16 = True
    if not onednn_bf16:
        dropped |= {*NATIVE_BF16_FLAGS, "amx_tile"}
    return [f for f in flags if f not in dropped]


def machine_text(device_type: str) -> str:
    """What a run trained on, as its summary records it (``machine``): the GPU's name and CUDA version, or the CPU's
    model name with the flags torch uses here (:func:`usable_flags`: they change its kernels, so its numerics), and
    torch's version. The same seed gives the same weights, data and batch order on any machine, but two machines of
    different kinds do not compute the same floats: a seed's runs on two of them are paired only up to that."""
    import torch

    if device_type == "cuda" and torch.cuda.is_available():
        where = f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    else:
        where = cpu_text(*cpu_facts())
    return f"{where}, torch {torch.__version__.split('+')[0]}"


def cpu_text(name: str, flags: list[str]) -> str:
    """``<model name> (<flags torch uses>)``, as a run's ``machine`` and a signature's description name a CPU."""
    return f"{name} ({', '.join(flags) or 'no avx2/avx512/amx'})"


def _torch_version() -> str:
    """torch's ``major.minor`` without importing it (its kernels, and so the fastest mode, change between them)."""
    try:
        return ".".join(version("torch").split("+")[0].split(".")[:2])
    except PackageNotFoundError:
        return "none"


def cpu_signature(threads: int | None = None) -> dict[str, Any]:
    """This machine's CPU signature for ``threads`` torch threads (default: all logical cores): what a CPU modes
    table must match to be used here."""
    name, flags = cpu_facts()
    return {"cpu": name, "cpu_flags": flags, "threads": int(threads or os.cpu_count() or 1),
            "torch": _torch_version()}


def table_signature(table: dict) -> dict[str, Any] | None:
    """The signature a CPU table was measured under (from its ``machine``), None when it records none."""
    machine = table.get("machine") or {}
    if not {"cpu", "cpu_flags", "threads", "torch"} <= set(machine):
        return None
    flags = [f for f in SIGNATURE_FLAGS if f in machine["cpu_flags"]]
    torch_version = ".".join(str(machine["torch"]).split("+")[0].split(".")[:2])
    return {"cpu": machine["cpu"], "cpu_flags": flags, "threads": int(machine["threads"]), "torch": torch_version}


def signature_key(signature: dict[str, Any]) -> str:
    """A short stable name for a signature (the cache file's suffix)."""
    text = json.dumps(signature, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def native_bf16(signature: dict[str, Any]) -> bool:
    """Whether the CPU has native bf16 dot products (avx512_bf16 or AMX); without them bf16 autocast is slow."""
    return any(f in signature["cpu_flags"] for f in NATIVE_BF16_FLAGS)


def describe_signature(signature: dict[str, Any]) -> str:
    return f"{cpu_text(signature['cpu'], signature['cpu_flags'])}, {signature['threads']} threads, torch {signature['torch']}"


# --- tables ------------------------------------------------------------------------------------------------------
def measured_path(device_type: str, results_dir: str | Path = layout.RESULTS_DIR) -> Path:
    """``<results_dir>/device/modes-<device>.json``: where the user's own bench measurement is looked for."""
    return layout.device_dir(results_dir) / f"modes-{device_type}.json"


def cache_path(signature: dict[str, Any], results_dir: str | Path = layout.RESULTS_DIR) -> Path:
    """``<results_dir>/device/modes-cpu-<signature key>.json``: this machine's cells measured on first use."""
    return layout.device_dir(results_dir) / f"modes-cpu-{signature_key(signature)}.json"


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


def fastest(cell: dict, margin: float = BF16_MARGIN, kernel_margin: float = KERNEL_MARGIN) -> tuple[str, bool]:
    """(precision, fused_attn) of the cell's smallest time (ties: the first in ``MODE_KEYS`` order); a bf16 mode
    only when its time is at most ``margin`` x the fastest fp32 mode's (a cell without fp32 times: the fastest), and
    explicit attention only when its time is at most ``kernel_margin`` x the fused kernel's at that precision (else
    the fused kernel, timm's default)."""
    times = cell["times_s"]
    ordered = [k for k in MODE_KEYS if k in times]
    best = min(ordered, key=lambda k: times[k])
    fp32 = [k for k in ordered if MODE_KEYS[k][0] == "32-true"]
    if MODE_KEYS[best][0] != "32-true" and fp32:
        best_fp32 = min(fp32, key=lambda k: times[k])
        if times[best] > margin * times[best_fp32]:
            best = best_fp32
    precision, fused = MODE_KEYS[best]
    fused_key = mode_key(precision, True)
    if not fused and fused_key in times and times[best] > kernel_margin * times[fused_key]:
        best = fused_key
    return MODE_KEYS[best]


def nearest_cell(table: dict, embed_dim: int, tokens: int) -> dict:
    """The cell nearest (embed_dim, tokens) in (log width, log tokens); ties: the first in the table."""
    def distance(cell: dict) -> float:
        return math.log(cell["embed_dim"] / embed_dim) ** 2 + math.log(cell["tokens"] / tokens) ** 2

    return min(table["cells"], key=distance)


def exact_cell(table: dict, embed_dim: int, tokens: int) -> dict | None:
    """The last cell measured for exactly (embed_dim, tokens), None if there is none."""
    found = [c for c in table["cells"] if c["embed_dim"] == embed_dim and c["tokens"] == tokens]
    return found[-1] if found else None


def _from_cell(cell: dict, where: str, what: str = "nearest cell") -> Mode:
    precision, fused = fastest(cell)
    return Mode(precision, fused, f"measured: {where}, {what} width {cell['embed_dim']}, {cell['tokens']} tokens")


def _matching(path: Path, signature: dict[str, Any]) -> dict | None:
    """The table at ``path`` if it exists and was measured under ``signature``, else None."""
    if not path.is_file():
        return None
    table = load_table(path)
    return table if table["device"] == "cpu" and table_signature(table) == signature else None


def _cached_cell(path: Path, signature: dict[str, Any], embed_dim: int, tokens: int) -> tuple[dict | None, dict | None]:
    """(the table at ``path`` if measured under ``signature``, its cell for exactly (embed_dim, tokens)); None where
    either is missing."""
    found = _matching(path, signature)
    return found, exact_cell(found, embed_dim, tokens) if found else None


#: ``measure(embed_dim, tokens) -> times_s`` of one cell (:func:`measure_cell` bound to a model's other sizes).
Measure = Callable[[int, int], dict[str, float]]


def choose_mode(device_type: str, embed_dim: int, tokens: int, table: dict | str | Path | None = None, *,
                results_dir: str | Path = layout.RESULTS_DIR, threads: int | None = None,
                measure: Measure | None = None) -> Mode:
    """The fastest train-step mode for a ``device_type`` (``cpu`` or ``cuda``) and a model of ``embed_dim`` width
    and ``tokens`` tokens (patches + class token), on ``threads`` torch threads (default all cores): from ``table``
    (a table or its path) when given, else as the module docstring says — a CPU table only where its signature is
    this machine's, else a cell measured now with ``measure`` and cached, else the fp32 rule. A malformed table,
    or one measured on another device type, raises a one-line ValueError."""
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"device_type must be one of {', '.join(DEVICE_TYPES)}, got {device_type!r}")
    if embed_dim < 1 or tokens < 1:
        raise ValueError(f"embed_dim and tokens must be positive, got {embed_dim} and {tokens}")
    if table is not None:
        where, table = ((str(table), load_table(table)) if isinstance(table, (str, Path))
                        else ("given table", check_table(table, "given modes table")))
        if table["device"] != device_type:
            raise ValueError(f"{where} was measured on {table['device']}, not {device_type}")
        return _from_cell(nearest_cell(table, embed_dim, tokens), where)
    if device_type == "cuda":
        path = measured_path("cuda", results_dir)
        if not path.is_file():
            return CUDA_RULE
        table = load_table(path)
        if table["device"] != "cuda":
            raise ValueError(f"{path} was measured on {table['device']}, not cuda")
        return _from_cell(nearest_cell(table, embed_dim, tokens), str(path))
    signature = cpu_signature(threads)
    own = measured_path("cpu", results_dir)
    if (found := _matching(own, signature)) is not None:
        return _from_cell(nearest_cell(found, embed_dim, tokens), str(own))
    cache = cache_path(signature, results_dir)
    if (cell := _cached_cell(cache, signature, embed_dim, tokens)[1]) is not None:
        return _from_cell(cell, str(cache), "cell")
    if (found := _matching(PACKAGED["cpu"], signature)) is not None:
        return _from_cell(nearest_cell(found, embed_dim, tokens), str(PACKAGED["cpu"]))
    if measure is None:
        precision, fused = CPU_RULE
        return Mode(precision, fused, f"rule: no modes table for this CPU ({describe_signature(signature)}) -> fp32 "
                                      "+ fused attention")
    with locked(cache):  # parallel workers: the first measures, the others find its cell
        found, cell = _cached_cell(cache, signature, embed_dim, tokens)
        if cell is None:
            cell = {"embed_dim": embed_dim, "tokens": tokens, "times_s": measure(embed_dim, tokens)}
            cell |= getattr(measure, "probe", {})  # the probe model's depth and batch: what a time estimate scales
            check_table({"device": "cpu", "cells": [cell]}, "measured cell")
            table = found or {"device": "cpu", "machine": dict(signature), "cells": []}
            table["cells"].append(cell)
            write_atomically(cache, json.dumps(table, indent=1) + "\n")
            return _from_cell(cell, f"{cache} (measured now)", "cell")
    return _from_cell(cell, str(cache), "cell")


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive ``flock`` on ``<path>.lock`` (created with its folder) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def auto_mode(accelerator: str, embed_dim: int, tokens: int, *, results_dir: str | Path = layout.RESULTS_DIR,
              threads: int | None = None, measure: Measure | None = None) -> Mode:
    """``choose_mode`` for Lightning's ``accelerator`` (``cpu``, ``gpu``/``cuda``, or ``auto``: CUDA when torch sees
    a device, else the CPU) — what a training run asks for its precision and attention kernel."""
    if accelerator == "auto":
        import torch

        accelerator = "cuda" if torch.cuda.is_available() else "cpu"
    device_type = {"cpu": "cpu", "gpu": "cuda", "cuda": "cuda"}.get(accelerator)
    if device_type is None:
        raise ValueError(f"accelerator must be one of auto, cpu, gpu, cuda, got {accelerator!r}")
    return choose_mode(device_type, embed_dim, tokens, results_dir=results_dir, threads=threads, measure=measure)


# --- measuring one cell ------------------------------------------------------------------------------------------
def measure_cell(size: dict[str, Any], batch: int, *, device: str = "cpu", reps: int = PROBE_REPS,
                 steps: int = PROBE_STEPS, warmup: int = PROBE_WARMUP) -> dict[str, Any]:
    """Time one train step of ``standard`` (``size``: VisionTransformer's img_size, patch_size, in_chans,
    num_classes, embed_dim, depth, num_heads, mlp_ratio) on a fixed random batch in the four modes, interleaved
    (:mod:`ablations.machine.timing`). Returns ``times_s`` (the reference ``32-true/fused``'s median x each mode's median
    in-round ratio to it: the paired estimate), ``median_s``, ``ratios`` and ``rounds_s``. The global RNGs are left
    as they were (a training run measures between seeding and building its model)."""
    import torch

    from lit_modules import VisionTransformer

    with torch.random.fork_rng(devices=[]):
        x, y = image_batch(batch, size["in_chans"], size["img_size"], size["num_classes"], device)
        fns = {mode_key(p, f): train_step(VisionTransformer("standard", {}, fused_attn=f, **size).to(device), (x, y),
                                          p) for p, f in MODE_KEYS.values()}
        times = interleave(fns, reps=reps, steps=steps, warmup=warmup, device=device)
    keys = list(MODE_KEYS)
    ref = keys[0]
    ratios = {k: round_ratios(times, k, ref) for k in keys[1:]}
    paired = {ref: median(times[ref])} | {k: median(times[ref]) * median(r) for k, r in ratios.items()}
    return {"times_s": paired, "median_s": {k: median(times[k]) for k in keys},
            "ratios": {k: median(r) for k, r in ratios.items()}, "rounds_s": times}


def model_size(config: Any, img_size: int, patch_size: int, in_chans: int, num_classes: int) -> dict[str, Any]:
    """``VisionTransformer``'s size arguments of a run's model: its ``RunConfig`` (width, depth, heads, MLP ratio)
    on its dataset's geometry (what :func:`probe` measures a smaller copy of)."""
    shape = {"img_size": img_size, "patch_size": patch_size, "in_chans": in_chans, "num_classes": num_classes}
    return config.model_config(shape).replace(patch_size=patch_size).size()  # the patch as given


def probe(size: dict[str, Any], batch: int) -> Measure:
    """The ``measure`` of a training run: :func:`measure_cell` of a depth-:data:`PROBE_DEPTH` model with the run's
    other sizes and ``embed_dim`` (heads kept from ``size``), at the run's batch capped at :data:`PROBE_MAX_BATCH`."""
    def measure(embed_dim: int, tokens: int) -> dict[str, float]:
        del tokens  # given by size's img_size / patch_size
        model = size | {"embed_dim": embed_dim, "depth": min(size.get("depth", PROBE_DEPTH), PROBE_DEPTH)}
        return measure_cell(model, min(batch, PROBE_MAX_BATCH))["times_s"]

    measure.probe = {"probe_depth": min(size.get("depth", PROBE_DEPTH), PROBE_DEPTH),
                     "probe_batch": min(batch, PROBE_MAX_BATCH), "probe_mlp_ratio": size.get("mlp_ratio", 4.0)}
    return measure


def measured_step(embed_dim: int, tokens: int, *, threads: int | None = None,
                  results_dir: str | Path = layout.RESULTS_DIR, mode: Mode | None = None) -> dict[str, Any] | None:
    """This machine's own measurement of a train step for (embed_dim, tokens) on ``threads`` threads: the cached
    probe cell (:func:`probe`) as ``{"seconds", "mode", "depth", "batch", "mlp_ratio", "path"}`` — the step time
    of ``mode`` (default: the one ``auto`` picks), of a ``depth``-block ``standard`` model at ``batch`` images — or
    None where this CPU's cache has no such cell (or one measured before the cells recorded the probe's size).
    What a dry run prices its trials with."""
    signature = cpu_signature(threads)
    path = cache_path(signature, results_dir)
    cell = _cached_cell(path, signature, embed_dim, tokens)[1]
    if cell is None or not {"probe_depth", "probe_batch", "probe_mlp_ratio"} <= cell.keys():
        return None
    key = mode_key(*fastest(cell)) if mode is None else mode.key
    return {"seconds": cell["times_s"][key], "mode": key, "depth": cell["probe_depth"], "batch": cell["probe_batch"],
            "mlp_ratio": cell["probe_mlp_ratio"], "path": str(path)}
