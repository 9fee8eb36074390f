"""The timing harness shared by the benchmark (:mod:`ablations.bench`) and precision ``auto``'s on-the-spot
measurement (:mod:`ablations.machine.modes`): zero-argument functions timed in interleaved rounds, medians and paired
in-round ratios, and one training step (forward, cross-entropy, backward, AdamW) as such a function.

Method: every function is called untimed first (warm-up), then ``reps`` rounds run; in a round every function in
turn is timed over ``steps`` back-to-back calls (A/B/C/A/B/C..., the first one rotating from round to round). A time
is the median over rounds; a ratio is the median over rounds of the ratio within a round (paired: both sides ran
seconds apart under the same machine load).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

from lit_modules.config import OptimConfig

# Imported where they are used, not here: torch and timm. Each takes from a tenth of a second to seconds to import,
# and the command-line tools start without them.

#: the timed step's AdamW settings: the optimiser's defaults (the ``basic`` recipe's)
LR, WEIGHT_DECAY = OptimConfig().lr, OptimConfig().weight_decay


def interleave(fns: dict[str, Callable[[], Any]], *, reps: int, steps: int, warmup: int,
               device: str = "cpu") -> dict[str, list[float]]:
    """Seconds per call of each function in each round: all warmed up first, then timed in interleaved rounds.
    On ``device="cuda"`` every call ends with ``torch.cuda.synchronize()``: a time covers the kernels it queued."""
    if device == "cuda":
        fns = {name: synchronised(fn) for name, fn in fns.items()}
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as timeit does: a full collection of a torch + Lightning process takes ~1 s
    try:
        for r in range(reps):
            for name in rotated(names, r):
                fn = fns[name]
                t0 = time.perf_counter()
                for _ in range(steps):
                    fn()
                times[name].append((time.perf_counter() - t0) / steps)
    finally:
        if gc_was_enabled:
            gc.enable()
    return times


def rotated(names: list | tuple, r: int) -> list:
    """``names`` starting at the one ``r`` places in (round ``r`` of an interleaved, rotating order)."""
    names = list(names)
    return names[r % len(names):] + names[:r % len(names)]


def synchronised(fn: Callable[[], Any]) -> Callable[[], None]:
    """``fn`` followed by ``torch.cuda.synchronize()``."""
    import torch

    def call() -> None:
        fn()
        torch.cuda.synchronize()

    return call


def median(values: list[float]) -> float:
    return statistics.median(values)


def round_ratios(times: dict[str, list[float]], a: str, b: str) -> list[float]:
    """time(a) / time(b) within each round."""
    return [ta / tb for ta, tb in zip(times[a], times[b], strict=True)]


def paired_ratio(times: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of time(a) / time(b) within the round."""
    return median(round_ratios(times, a, b))


def image_batch(batch: int, in_chans: int, img_size: int, num_classes: int, device: str = "cpu"):
    """A fixed random (images, labels) batch, drawn on the CPU from a generator seeded 0 (the same numbers on every
    device, and the global RNGs untouched), then moved to ``device``: what every timing here trains on."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, in_chans, img_size, img_size, generator=g)
    y = torch.randint(0, num_classes, (batch,), generator=g)
    return x.to(device), y.to(device)


def train_step(model, batch, precision: str = "32-true") -> Callable[[], None]:
    """One training step (forward, cross-entropy, backward, AdamW step) on a fixed batch, on the batch's device:
    fp32 (``32-true``), or forward and loss under bf16 autocast (``bf16-mixed``, as Lightning does)."""
    import torch
    import torch.nn.functional as F
    from timm.optim import param_groups_weight_decay

    if hasattr(model, "param_groups"):  # ours: timm's rule plus each variant's own no-decay parameters
        groups = model.param_groups(WEIGHT_DECAY)
    else:
        groups = param_groups_weight_decay(model, WEIGHT_DECAY, model.no_weight_decay())
    optimizer = torch.optim.AdamW(groups, lr=LR)
    x, y = batch
    model.train()
    if precision not in ("32-true", "bf16-mixed"):
        raise ValueError(f"precision must be 32-true or bf16-mixed, got {precision!r}")
    bf16 = precision == "bf16-mixed"

    def step() -> None:
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step
