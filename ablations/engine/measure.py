"""Train-step timings of the engine's levers, as zero-argument functions for :func:`ablations.machine.timing.interleave`.

Each function runs one optimizer step of the plain run's arithmetic (``ViTClassifier``: cross-entropy with label
smoothing 0.1, AdamW over the backbone's parameter groups, ``fused=True``) on a fixed random batch:

- ``plain``: today's path (eager);
- ``compiled``: forward and loss through ``torch.compile`` (AOTAutograd compiles the backward with it; on CUDA
  ``mode="reduce-overhead"``, which replays both as CUDA graphs), then the fused AdamW step;
- ``graph``: (CUDA) the whole plain step — forward, backward, optimizer — captured as one CUDA graph by hand;
- ``stacked K``: K runs of the same shape in one :class:`~ablations.engine.stack.StackedModel` with
  :class:`~ablations.engine.optim.StackedAdam` (:class:`~ablations.engine.step.StackedStep`), eager; one call
  trains all K, so its time per trial is the call's time / K;
- ``stacked K graph``: (CUDA) the same, replayed as one captured CUDA graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from lit_modules.classifier import WarmupCosine
from lit_modules.config import OptimConfig

_BASIC = OptimConfig()  # the timed step's settings: the optimiser's defaults (the basic recipe's)
LABEL_SMOOTHING, LR, WEIGHT_DECAY = _BASIC.label_smoothing, _BASIC.lr, _BASIC.weight_decay


def _models(size: dict[str, Any], fused_attn: bool, count: int, device: str, residual: str = "standard",
            options: dict | None = None) -> list:
    from lit_modules import VisionTransformer

    models = []
    for seed in range(count):
        torch.manual_seed(seed)
        models.append(VisionTransformer(residual, dict(options or {}), fused_attn=fused_attn, **size).to(device))
    return models


def _batch(size: dict[str, Any], batch: int, k: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(k, batch, size["in_chans"], size["img_size"], size["img_size"], generator=g)
    y = torch.randint(0, size["num_classes"], (k, batch), generator=g)
    return x.to(device), y.to(device)


def _autocast(device: str, precision: str):
    return torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16-mixed", cache_enabled=False)


def plain_step(size: dict[str, Any], batch: int, *, precision: str = "32-true", fused_attn: bool = True,
               device: str = "cpu", compile: bool = False, graph: bool = False, residual: str = "standard",
               options: dict | None = None) -> Callable[[], None]:
    """One plain train step (module docstring); ``compile``: forward and loss compiled; ``graph``: the whole step
    as a hand-captured CUDA graph (a ``capturable`` AdamW)."""
    model = _models(size, fused_attn, 1, device, residual, options)[0].train()
    x, y = _batch(size, batch, 1, device)
    x, y = x[0], y[0]
    optimizer = torch.optim.AdamW(model.param_groups(WEIGHT_DECAY), lr=LR, fused=True,
                                  capturable=graph)

    def loss_of(images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        with _autocast(device, precision):
            return F.cross_entropy(model(images), labels, label_smoothing=LABEL_SMOOTHING)

    forward = torch.compile(loss_of, mode="reduce-overhead" if device == "cuda" else None) if compile else loss_of

    def step() -> None:
        forward(x, y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=not graph)

    if not graph:
        return step
    return _captured(step)


def _captured(step: Callable[[], None], warmup: int = 3) -> Callable[[], None]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def stacked_step(size: dict[str, Any], batch: int, k: int, *, precision: str = "32-true", fused_attn: bool = False,
                 device: str = "cpu", graph: bool = False, residual: str = "standard",
                 options: dict | None = None) -> Callable[[], None]:
    """One step of K stacked runs (module docstring): K models of seeds 0..K-1, each at its own learning rate
    (1e-3 · 2^k), on their own random batches; ``graph``: replayed as a captured CUDA graph."""
    from .optim import StackedAdam, schedule_table
    from .stack import StackedModel, group_scales
    from .step import StackedStep

    models = _models(size, fused_attn, k, device, residual, options)
    stacked = StackedModel(models).train()
    steps = 10_000
    table = schedule_table([LR * 2 ** i for i in range(k)], [WarmupCosine(0, steps)] * k, steps)
    optimizer = StackedAdam(stacked.weights, stacked.grads, kind="adamw", lr_table=table,
                            weight_decay=[WEIGHT_DECAY] * k, decay=stacked.columns(group_scales(models[0]).decay, 0.0))
    step = StackedStep(stacked, optimizer, precision=precision, label_smoothing=LABEL_SMOOTHING,
                       top5=size["num_classes"] > 5)
    x, y = _batch(size, batch, k, device)
    weight = torch.ones(k, batch, device=device)
    if not graph:
        return lambda: step(x, y, y, weight)
    step.capture(x, y, y, weight)
    return lambda: step.replay(x, y, y, weight)



# --- many processes at once: the aggregate throughput of a study on one device -----------------------------------
def _throughput_worker(size: dict, batch: int, k: int, device: str, precision: str, graph: bool, seconds: float,
                       threads: int, ready, go, results) -> None:
    """One process of :func:`aggregate_throughput`: build and warm its stack, wait for the others, then train for
    ``seconds`` and report (steps, images, elapsed)."""
    import time

    torch.set_num_threads(threads)
    step = stacked_step(size, batch, k, precision=precision, fused_attn=device == "cuda", device=device, graph=graph)
    step()
    if device == "cuda":
        torch.cuda.synchronize()
    ready.wait()
    go.wait()
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
        if device == "cuda" and steps % 20 == 0:
            torch.cuda.synchronize()
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    results.put({"steps": steps, "images": steps * k * batch, "seconds": elapsed})


def aggregate_throughput(size: dict[str, Any], batch: int, k: int, workers: int, *, device: str = "cpu",
                         precision: str = "32-true", graph: bool = False, seconds: float = 10.0,
                         threads: int = 1) -> dict[str, Any]:
    """Training images per second of ``workers`` processes each training a stack of ``k`` runs at once on one device
    (as ``ablations.run --workers W --stack K`` trains a study): each builds and warms its stacked step
    (:func:`stacked_step`; a CUDA graph with ``graph``), all start together, each trains ``seconds``. Returns the
    aggregate images/s (all images over the longest process's time) and each process's figures."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # CUDA in children needs spawn
    ready, go, results = ctx.Barrier(workers + 1), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_throughput_worker, args=(size, batch, k, device, precision, graph, seconds, threads,
                                                          ready, go, results)) for _ in range(workers)]
    for p in procs:
        p.start()
    try:
        ready.wait(timeout=600)
        go.set()
        runs = [results.get(timeout=600 + seconds) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    images = sum(r["images"] for r in runs)
    longest = max(r["seconds"] for r in runs)
    return {"images_per_s": images / longest, "workers": workers, "k": k, "batch": batch, "processes": runs}
