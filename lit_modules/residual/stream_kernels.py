"""The per-token passes of the multi-stream residuals (Hyper-Connections, mHC) in two implementations, chosen per
model like timm's fused attention (``VisionTransformer.set_stream_kernels``):

- ``"eager"``: PyTorch operations, one kernel each (``bmm`` for the n×n mixing, ``stream_sum`` for sums over the
  n streams). The reference, and the only form under an outer ``torch.compile`` (that compile fuses them itself).
- ``"compiled"``: the read and write written as broadcasts and sums and compiled by ``torch.compile``
  (inductor): each pass becomes one or two loops over the tokens that read a token's n×D streams once, where the
  eager form runs 2-5 kernels over the whole n-fold stream (at n = 4, 2,080 tokens, width 192, AVX2: the
  write's backward 4.2 ms instead of 14.4, its forward 2.1 instead of 4.0); on an AVX2-only CPU the eager passes
  are most of mHC's extra cost. The first call of each kernel compiles it (seconds; inductor
  caches the code on disk for the next process); a later batch size compiles once more with the token dimension
  dynamic.

``"auto"`` (the training default) resolves to ``"compiled"`` on a CPU where inductor's CPU backend builds
kernels (``compiler_works``) and to ``"eager"`` elsewhere (the compiled kernels were not measured on a GPU);
the environment variable ``ABLATIONS_STREAM_KERNELS`` (eager or compiled) overrides what ``auto`` picks. Both
compute the same function (``tests/test_fast_paths.py``: outputs and gradients to 1e-6 in float64); in float32
they differ by rounding, as two orders of summation do.

Each kernel takes contiguous tensors with the tokens first: x (T, n, D), read / write (T, n), mix (T, n, n),
f (T, D). A backward takes ``total``, a gradient for x already summed elsewhere (``StreamGrad``), or None, and
returns x's gradient plus ``total`` (None when ``need_x`` is False).
"""

from __future__ import annotations

import functools
import os
import shutil
import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch

from ..names import STREAM_KERNEL_NAMES as KERNELS

# Imported where they are used, not here: torch's compiler (inductor, dynamo). Each takes from a tenth of a second to
# seconds to import, and the command-line tools start without them.

ENV = "ABLATIONS_STREAM_KERNELS"
RECOMPILE_LIMIT = 64  # graphs per kernel: n, dtype, a first static and a dynamic batch, with and without a total


class Kernels(NamedTuple):
    read_forward: Callable
    read_backward: Callable
    write_forward: Callable
    write_backward: Callable


def stream_sum(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Σ_j weight_j x_j over the n streams: x (T, n, D), weight (T, n) -> (T, D), as one multiply and n − 1 fused
    multiply-adds over (T, D) slices. A broadcast multiply summed over n takes 2-3x as long in eager mode, and a
    (1×n)·(n×D) ``bmm`` per token is fast at n = 4 but 5-15x slower at n = 1 and 2."""
    out = x[:, 0] * weight[:, 0:1]
    for j in range(1, x.shape[1]):
        out.addcmul_(x[:, j], weight[:, j:j + 1])
    return out


# --- eager ----------------------------------------------------------------------------------------------------------
def eager_read_forward(x: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    """h = readᵀ H."""
    return stream_sum(x, read)


def eager_read_backward(x: torch.Tensor, read: torch.Tensor, grad: torch.Tensor, total: torch.Tensor | None,
                        need_x: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    """∂H = read ⊗ ∂h (+ total), ∂read = Σ_D H ⊙ ∂h."""
    grad = grad.unsqueeze(1)
    grad_x = None
    if need_x:
        grad_x = read.unsqueeze(-1) * grad if total is None else total.addcmul_(read.unsqueeze(-1), grad)
    return grad_x, (x * grad).sum(dim=-1)


def eager_write_forward(x: torch.Tensor, mix: torch.Tensor, write: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """M·H + write ⊗ f."""
    return torch.bmm(mix, x).addcmul_(write.unsqueeze(-1), f.unsqueeze(1))


def eager_write_backward(x: torch.Tensor, mix: torch.Tensor, write: torch.Tensor, f: torch.Tensor,
                         grad: torch.Tensor, total: torch.Tensor | None, need_x: bool
                         ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
    """∂H = Mᵀ·G (+ total) and ∂M = G·Hᵀ as ``bmm``, ∂write = Σ_D G ⊙ f, ∂f = Σ_n write ⊙ G. (One ``bmm`` of
    [M | write] by [H; f], to get ∂M and ∂write from one product, timed no faster: the concatenation costs what
    it saves.)"""
    grad_x = None
    if need_x:
        grad_x = torch.bmm(mix.transpose(1, 2), grad)
        grad_x = grad_x if total is None else total.add_(grad_x)
    return (grad_x, torch.bmm(grad, x.transpose(1, 2)), (grad * f.unsqueeze(1)).sum(dim=-1),
            stream_sum(grad, write))


EAGER = Kernels(eager_read_forward, eager_read_backward, eager_write_forward, eager_write_backward)


# --- the formulas inductor fuses ------------------------------------------------------------------------------------
def fused_read_forward(x: torch.Tensor, read: torch.Tensor) -> torch.Tensor:
    return (read.unsqueeze(-1) * x).sum(dim=1)


def fused_read_backward(x: torch.Tensor, read: torch.Tensor, grad: torch.Tensor, total: torch.Tensor | None,
                        need_x: bool) -> tuple[torch.Tensor | None, torch.Tensor]:
    grad = grad.unsqueeze(1)
    grad_x = None
    if need_x:
        grad_x = read.unsqueeze(-1) * grad
        grad_x = grad_x if total is None else total + grad_x
    return grad_x, (x * grad).sum(dim=-1)


def fused_write_forward(x: torch.Tensor, mix: torch.Tensor, write: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    return (mix.unsqueeze(-1) * x.unsqueeze(1)).sum(dim=2) + write.unsqueeze(-1) * f.unsqueeze(1)


def fused_write_backward(x: torch.Tensor, mix: torch.Tensor, write: torch.Tensor, f: torch.Tensor,
                         grad: torch.Tensor, total: torch.Tensor | None, need_x: bool
                         ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]:
    grad_x = None
    if need_x:
        grad_x = (mix.unsqueeze(-1) * grad.unsqueeze(2)).sum(dim=1)  # (Mᵀ G)_j = Σ_i M_ij G_i
        grad_x = grad_x if total is None else total + grad_x
    return (grad_x, (grad.unsqueeze(2) * x.unsqueeze(1)).sum(dim=-1), (grad * f.unsqueeze(1)).sum(dim=-1),
            (write.unsqueeze(-1) * grad).sum(dim=1))


class StaticStreams:
    """A compiled kernel whose tensors keep every dimension but the first (the tokens) static. Dynamo's automatic
    dynamic shapes would otherwise make n dynamic once one process has run two stream counts (HC at n = 2 and mHC
    at n = 4, as the bench does): the write's forward at n = 4 then took 7.9 ms instead of 6.0."""

    def __init__(self, fn: Callable) -> None:
        self.fn = torch.compile(fn, fullgraph=True)

    def __call__(self, *args):
        for a in args:
            if isinstance(a, torch.Tensor):
                for dim in range(1, a.dim()):
                    torch._dynamo.mark_static(a, dim)
        return self.fn(*args)


def pin_vector_width() -> None:
    """Make the vector width inductor picks for the CPU (``ATEN_CPU_CAPABILITY`` caps it) explicit, as
    ``cpp.simdlen``, so that it is part of inductor's on-disk cache key: without it, code compiled for AVX-512 was
    loaded under ``ATEN_CPU_CAPABILITY=avx2`` on the same machine and computed wrong gradients, and AVX2 code
    loaded uncapped corrupted the heap. Also for a whole-model ``torch.compile`` (``--compile``)."""
    from torch._inductor import config as inductor
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    if inductor.cpp.simdlen is None and (isa := pick_vec_isa()):
        inductor.cpp.simdlen = isa.bit_width()


@functools.cache
def compiled() -> Kernels:
    """The fused formulas through ``torch.compile`` (built once per process; each compiles on its first call).
    mHC's Sinkhorn (``mhc.SinkhornKnopp``) has no compiled form: its (n, n, tokens) normalisations are already two
    vector operations each, and compiled (the 2·iters iterates the backward needs written out by one graph, or
    recomputed) it timed 1.5-2.6x slower (n = 4, 2,080 tokens, AVX2)."""
    import torch._dynamo

    # the limit is per kernel: past it dynamo would run the broadcasts uncompiled, materialising (T, n, n, D)
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    pin_vector_width()
    fused = (StaticStreams(fn) for fn in (
        fused_read_forward, fused_read_backward, fused_write_forward, fused_write_backward))
    return Kernels(*fused)


def check(name: str) -> None:
    """ValueError (one line) unless ``name`` is a kernel set a site can run."""
    if name not in KERNELS[1:]:
        raise ValueError(f"stream_kernels={name!r} is not one of: {', '.join(KERNELS[1:])}")


def kernels(name: str) -> Kernels:
    """The kernels a site named ``name`` ("eager" or "compiled") runs now: always the eager ones while an outer
    ``torch.compile`` traces the model."""
    check(name)
    if name == "eager" or torch.compiler.is_compiling():
        return EAGER
    return compiled()


def cpp_compiler() -> str | None:
    """The C++ compiler inductor's CPU backend would call, if it is installed."""
    from torch._inductor import config

    names = config.cpp.cxx if isinstance(config.cpp.cxx, tuple) else (config.cpp.cxx,)
    return next((path for name in names if name and (path := shutil.which(name))), None) or shutil.which("g++")


def _probe(x: torch.Tensor) -> torch.Tensor:
    return (x * 2.0).sum(dim=1)


@functools.cache
def compiler_works() -> bool:
    """Whether inductor can build a CPU kernel here: a C++ compiler, Python's and torch's headers and OpenMP
    (a compiler alone is not enough: e.g. a missing Python.h fails the first compile). Compiles one tiny
    reduction once per process (seconds cold, less with inductor's cache); on failure one warning, False."""
    if cpp_compiler() is None:
        return False
    try:
        pin_vector_width()
        torch.compile(_probe, fullgraph=True)(torch.ones(4, 3))
    except Exception as exc:  # noqa: BLE001 (any failure of the toolchain means: use the eager kernels)
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        warnings.warn(f"stream_kernels auto: torch.compile cannot build CPU kernels here ({type(exc).__name__}: "
                      f"{first}); Hyper-Connections and mHC use the eager kernels", stacklevel=2)
        return False
    return True


def resolve(name: str, device: str) -> str:
    """``auto``: ``ABLATIONS_STREAM_KERNELS`` if set, else ``compiled`` on a CPU where inductor can build kernels
    (``compiler_works``), else ``eager``; ``eager`` and ``compiled`` as given. ValueError (one line) for any
    other name."""
    if name not in KERNELS:
        raise ValueError(f"stream_kernels={name!r} is not one of: {', '.join(KERNELS)}")
    if name != "auto":
        return name
    chosen = os.environ.get(ENV, "")
    if chosen:
        if chosen not in KERNELS[1:]:
            raise ValueError(f"{ENV}={chosen!r} is not one of: {', '.join(KERNELS[1:])}")
        return chosen
    return "compiled" if device == "cpu" and compiler_works() else "eager"
