"""glibc's ``malloc`` set for training on a CPU so that the memory a step frees stays in the process (the default).

PyTorch's CPU tensors come straight from ``malloc``. glibc serves large blocks with ``mmap`` and gives freed memory
back to the kernel (``munmap``, or trimming the heap's top), so a CPU training step can ask the kernel for its
activations again every step, and the kernel zero-fills each page on first touch. ``ABLATIONS_MALLOC=keep`` (the
default) turns glibc's ``mmap`` path off (``M_MMAP_MAX = 0``: the main thread's blocks come from the heap; another
thread's arena may still map a very large block) and its trimming off (``M_TRIM_THRESHOLD`` = 2 GiB − 1,
``M_TOP_PAD`` = 64 MiB): the process keeps its peak memory, and no computed value changes. ``system`` leaves glibc as
it is. The setting is the calling process's: processes a strategy spawns (``ddp_spawn``) start with glibc's
defaults.

Why it is the default: ``python -m ablations.bench --sections malloc --threads 2`` (child processes per setting, 5
rounds, a 2-core AMD EPYC with avx512_bf16; ``results/device/cpu-avx512bf16/bench-malloc-2threads``) measured
section 11's model (width 192, 2,080 tokens) at 0.61x the step time under ``keep`` for ``standard`` (15,829 faults a
step to 130) and 0.81x for mHC (6,992 to 4); at the studies' small size neither setting faults (1.04x and 1.01x).
``keep`` costs only the peak memory staying mapped.

``keep`` is not applied when the user set glibc's own ``MALLOC_*_`` variables, ``glibc.malloc.*`` tunables in
``GLIBC_TUNABLES`` or ``LD_PRELOAD`` (another allocator, e.g. jemalloc or tcmalloc), nor outside glibc (macOS,
Windows, musl). What was done is the run's ``malloc`` fact.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

ENV = "ABLATIONS_MALLOC"
CHOICES = ("system", "keep")
DEFAULT = "keep"
GLIBC_ENV = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4  # glibc's malloc.h
SETTINGS = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1), (M_TOP_PAD, 64 << 20))
KEPT = "keep (glibc: no mmap, no trim)"


def glibc() -> bool:
    """Whether this process runs on Linux with glibc (whose ``mallopt`` ``keep`` calls)."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def without_user_malloc(env: dict[str, str]) -> dict[str, str]:
    """``env`` without the variables that make ``keep`` stand down (glibc's own settings, ``LD_PRELOAD``)."""
    return {k: v for k, v in env.items() if k not in ("LD_PRELOAD", "GLIBC_TUNABLES", *GLIBC_ENV)}


def choice() -> str:
    """``ABLATIONS_MALLOC`` (default ``keep``); anything else is a one-line ValueError naming the choices."""
    value = os.environ.get(ENV, DEFAULT)
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r} is not a malloc choice; valid choices: {', '.join(CHOICES)}")
    return value


@functools.cache
def set_malloc() -> str:
    """Under ``ABLATIONS_MALLOC=keep``, set glibc's ``malloc`` to keep freed memory (once per process); say what was
    done: ``"keep (glibc: ...)"`` or ``"system (<why>)"``."""
    if choice() == "system":
        return f"system ({ENV}=system)"
    if any(name in os.environ for name in GLIBC_ENV) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return "system (glibc's MALLOC_* variables or malloc tunables are set)"
    if os.environ.get("LD_PRELOAD"):
        return "system (LD_PRELOAD is set)"
    if not glibc():
        return "system (not glibc)"
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    refused = [name for name, (param, value) in zip(("M_MMAP_MAX", "M_TRIM_THRESHOLD", "M_TOP_PAD"), SETTINGS,
                                                     strict=True) if mallopt(param, value) != 1]
    if refused:
        return f"keep, partly (mallopt refused {', '.join(refused)})"
    return KEPT
