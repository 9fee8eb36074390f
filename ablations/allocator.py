"""glibc's ``malloc`` set for training on a CPU: the memory a step frees stays in the process for the next step.

PyTorch's CPU tensors come straight from ``malloc``. glibc serves large blocks with ``mmap`` and gives freed memory
back to the kernel (``munmap``, or trimming the heap's top), so every step of a CPU training run asks the kernel for
its activations again and the kernel zero-fills each page on first touch. Measured on a 2-core EPYC, 1 thread: the
bench's overhead model (width 192, 2,080 tokens) took ~20,000 page faults per step (~80 MB) under glibc's defaults
and ~0 with freed memory kept. ``keep_freed_memory`` turns glibc's ``mmap`` path off (``M_MMAP_MAX = 0``: every block
comes from the heap) and its trimming off (``M_TRIM_THRESHOLD`` = 2 GiB − 1, ``M_TOP_PAD`` = 64 MiB): the process
keeps its peak memory, which a training step reaches anyway, and no computed value changes.

It leaves ``malloc`` as it is when the environment variable ``ABLATIONS_MALLOC`` is ``system``, when the user set
glibc's own ``MALLOC_*_`` variables or ``LD_PRELOAD`` (another allocator, e.g. jemalloc or tcmalloc), and outside
glibc (macOS, Windows, musl). What it did is the run's ``malloc`` fact.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform

ENV = "ABLATIONS_MALLOC"
CHOICES = ("keep", "system")
GLIBC_ENV = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4  # glibc's malloc.h
SETTINGS = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1), (M_TOP_PAD, 64 << 20))
KEPT = "keep (glibc: no mmap, no trim)"


def choice() -> str:
    """``ABLATIONS_MALLOC`` (default ``keep``); anything else is a one-line ValueError naming the choices."""
    value = os.environ.get(ENV, "keep")
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r} is not a malloc choice; valid choices: {', '.join(CHOICES)}")
    return value


@functools.cache
def keep_freed_memory() -> str:
    """Set glibc's ``malloc`` to keep freed memory (once per process) and say what was done: ``"keep (glibc: ...)"``
    or ``"system (<why not>)"``."""
    if choice() == "system":
        return f"system ({ENV}=system)"
    if any(name in os.environ for name in GLIBC_ENV):
        return "system (glibc's MALLOC_* variables are set)"
    if os.environ.get("LD_PRELOAD"):
        return "system (LD_PRELOAD is set)"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "system (not glibc)"
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    if not all(mallopt(param, value) == 1 for param, value in SETTINGS):
        return "system (mallopt refused)"
    return KEPT
