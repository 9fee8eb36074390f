"""Train-step sections: our backbone vs timm's (1), every variant vs standard (2), MFU (4), memory (6),
model.compile() (9) and the new designs' overhead (11)."""

from __future__ import annotations

import copy
import time

from ablations.costs import default_configs, measure

from ..machine.timing import interleave, median, paired_ratio, rotated, round_ratios, synchronised, train_step
from . import child
from .harness import (
    Sampled,
    Section,
    Settings,
    is_dca,
    mib,
    ms,
    ours,
    random_batch,
    ratio_cell,
    runs_of,
    selected_configs,
    set_fused_attn,
)

# Imported where they are used, not here: timm, torch and the model (lit_modules: torch). Each takes from a tenth of a
# second to seconds to import, and the command-line tools start without them.


# --- 1. our backbone vs timm's --------------------------------------------------------------------------------------
def bench_timm(s: Settings) -> Section:
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    size = s.vit(s.depth)
    models = {
        "timm": set_fused_attn(TimmViT(**size), True),
        "ours standard": ours("standard", {}, size),
        "timm init_values=1e-5": set_fused_attn(TimmViT(**size, init_values=1e-5), True),
        "ours layerscale 1e-5": ours("layerscale", {"init_value": 1e-5}, size),
    }
    batch = random_batch(s)
    times = interleave({k: train_step(m.to(s.device), batch, s.precision) for k, m in models.items()},
                       reps=s.reps, steps=s.steps, warmup=s.warmup, device=s.device)
    sec = Section("timm", "1. Train step: our backbone vs timm's VisionTransformer",
                  f"{s.describe(s.depth)}; {s.mode_text()}, AdamW; {s.reps} rounds x {s.steps} steps",
                  ["model", "ms/step", "vs timm (same config) [round min-max]", "goal", "mark"])
    for name, reference in (("timm", None), ("ours standard", "timm"), ("timm init_values=1e-5", None),
                            ("ours layerscale 1e-5", "timm init_values=1e-5")):
        row = [name, ms(median(times[name]))]
        if reference is None:
            row += ["reference", "", ""]
        else:
            ratios = round_ratios(times, name, reference)
            ratio = median(ratios)
            row += [ratio_cell(ratios), *sec.goal(f"{name} / {reference}", ratio, 1.02, "≤ 1.02x", f"{ratio:.3f}x",
                                                  rounds=ratios)]
        sec.rows.append(row)
    sec.data = {"times_s": times}
    return sec


# --- 2. every variant vs standard ----------------------------------------------------------------------------------
def bench_variants(s: Settings) -> Section:
    size = s.vit(s.variant_depth)
    configs = selected_configs(s)
    models = {label: ours(res, opts, size, backbone=kw) for label, res, opts, kw in configs}
    costs = {label: measure(res, opts, **size, **kw) for label, res, opts, kw in configs}
    batch = random_batch(s)
    times = interleave({k: train_step(m.to(s.device), batch, s.precision) for k, m in models.items()},
                       reps=s.reps, steps=s.steps, warmup=s.warmup, device=s.device)
    sec = Section("variants", "2. Each variant vs standard: train-step time, parameters, FLOPs",
                  f"{s.describe(s.variant_depth)}; {s.mode_text()}, AdamW; {s.reps} rounds x {s.steps} steps; "
                  "FLOPs: forward, batch 1, explicit attention (ablations.costs)",
                  ["variant", "params", "+params", "+FLOPs", "ms/step", "time vs standard [round min-max]", "goal", "mark"])
    base = costs["standard"]
    rows = {}
    for label, res, opts, kw in configs:
        c = costs[label]
        flop_oh = 100.0 * (c["flops"] - base["flops"]) / base["flops"]
        ratios = round_ratios(times, label, "standard")
        ratio = median(ratios)
        row = [label, f"{c['params']:,}", f"{100.0 * (c['params'] - base['params']) / base['params']:+.2f}%",
               f"{flop_oh:+.2f}%", ms(median(times[label])), ratio_cell(ratios, percent=not is_dca(res, opts))]
        if label == "standard":
            row += ["reference", ""]
        elif is_dca(res, opts):
            row += sec.goal(f"{label}: time vs standard", ratio, 1.5, "≤ 1.50x (paper: 1.31-1.54x)", f"{ratio:.3f}x",
                            rounds=ratios)
        else:
            limit = 1.0 + (flop_oh + 10.0) / 100.0
            row += sec.goal(f"{label}: time overhead", ratio, limit, f"≤ {flop_oh + 10:+.1f}% (FLOPs + 10 pp)",
                            f"{100 * (ratio - 1):+.1f}%", rounds=ratios)
        sec.rows.append(row)
        rows[label] = {"residual": res, "options": opts, "backbone": kw, **c, "flops_overhead_pct": flop_oh,
                       "time_ratio": ratio, "time_ratios": ratios}
    sec.notes.append("DCA rows have the DCA goal (≤ 1.5x per step) instead of FLOPs + 10 pp: its extra work is "
                     "elementwise and memory-bound, which a FLOP count does not see. Per token and block, GRN-v3 "
                     "touches outputs x t x D values (t = stack size) against ~24 D² multiply-adds of the block's "
                     "matmuls, so its relative cost grows with depth and shrinks with width: at D = 192 it is larger "
                     "than at the paper's widths. The fig10_B GRN runs as one fused, chunked autograd Function "
                     "(lit_modules/residual/dca.py: ReLUMix).")
    sec.data = {"variants": rows, "times_s": times}
    return sec


# --- 4. model FLOPs utilisation ------------------------------------------------------------------------------------
def bench_mfu(s: Settings) -> Section:
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    cuda = s.device == "cuda"
    model = ours("standard", {}, s.vit(s.depth)).to(s.device)
    batch = random_batch(s)
    set_fused_attn(model, False)  # the counter has no formula for the CPU SDPA kernel: count explicit attention
    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(model(batch[0]), batch[1]).backward()
    step_flops = counter.get_total_flops()
    model.zero_grad(set_to_none=True)
    set_fused_attn(model, True)
    size, dtype = (s.cuda_mm_size, torch.bfloat16) if cuda else (s.mm_size, torch.float32)
    g = torch.Generator(device=s.device).manual_seed(0)
    a, b = (torch.randn(size, size, generator=g, device=s.device, dtype=dtype) for _ in range(2))
    times = interleave({"train step": train_step(model, batch, s.precision), "matmul": lambda: torch.mm(a, b)},
                       reps=s.reps, steps=s.steps, warmup=s.warmup, device=s.device)
    step_rate = step_flops / median(times["train step"])
    peak = 2 * size**3 / median(times["matmul"])
    mfu = median([step_flops / ts / (2 * size**3 / tm) for ts, tm in zip(times["train step"], times["matmul"],
                                                                         strict=True)])
    kind = "bf16" if cuda else "fp32"
    sec = Section("mfu", "4. Model FLOPs utilisation of the train step",
                  f"ours standard, {s.describe(s.depth)}; {s.mode_text()} (FLOPs counted with explicit "
                  f"attention, forward + backward); peak = {kind} torch.mm {size}x{size}"
                  + (" on the GPU" if cuda else ", same threads")
                  + f"; {s.reps} rounds x {s.steps} calls, interleaved",
                  ["quantity", "value", "goal", "mark"])
    mfu_cells = (["report only", "—"] if cuda else
                 sec.goal("MFU", mfu, 0.55, "≥ 55%", f"{100 * mfu:.1f}%", at_most=False))
    sec.rows += [["train-step FLOPs (fwd + bwd)", f"{step_flops / 1e9:.2f} GFLOP", "", ""],
                 ["train-step time", f"{ms(median(times['train step']))} ms", "", ""],
                 ["train-step FLOP rate", f"{step_rate / 1e9:.0f} GFLOP/s", "", ""],
                 [f"{kind} matmul peak ({size}²)", f"{peak / 1e9:.0f} GFLOP/s", "", ""],
                 ["MFU", f"{100 * mfu:.1f}%", *mfu_cells]]
    sec.notes.append("The optimizer step (elementwise) adds no counted FLOPs but costs time, as it would in "
                     "any MFU figure. MFU is the median over rounds of the in-round ratio.")
    if cuda:
        sec.notes.append("On a GPU the CPU's 55% goal does not apply: a ViT-Tiny step at batch 64 is a few GFLOP "
                         "spread over hundreds of small kernels, bound by their launches and by memory traffic, "
                         "not by the tensor cores; the figure is reported, not judged.")
    sec.data = {"train_step_flops": step_flops, "step_flops_per_s": step_rate, "peak_flops_per_s": peak,
                "mfu": mfu, "times_s": times}
    return sec


# --- 6. memory -----------------------------------------------------------------------------------------------------
def bench_memory(s: Settings) -> Section:
    cuda = s.device == "cuda"
    batch = random_batch(s, s.memory_batch)
    sec = Section("memory", f"6. Peak training memory per variant at depth {s.memory_depth}",
                  f"{s.describe(s.memory_depth, s.memory_batch)}; {s.mode_text()}, AdamW; "
                  + ("torch.cuda.max_memory_allocated over one training step (after one warm-up step)" if cuda else
                     "CPU: bytes of the unique storages autograd saves for backward during the forward "
                     "(torch.autograd.graph.saved_tensors_hooks; parameters excluded) + parameters, gradients and "
                     "AdamW's two moments (4x parameter bytes)"),
                  ["variant", "params", "peak allocated MiB" if cuda else "saved activations MiB", "params+grads+AdamW MiB",
                   "total MiB", "vs standard", "goal", "mark"])
    configs = selected_configs(s)
    rows = {}
    for label, res, opts, kw in configs:
        model = ours(res, opts, s.vit(s.memory_depth), backbone=kw)
        state = 4 * sum(p.numel() * p.element_size() for p in model.parameters())
        activations = None if cuda else saved_activation_bytes(model, batch)
        rows[label] = {"params": sum(p.numel() for p in model.parameters()), "saved_activation_bytes": activations,
                       "state_bytes": state,
                       "total_bytes": cuda_peak_bytes(model, batch, s.precision) if cuda else activations + state}
        del model
    full_dca = next((label for label, res, opts, _ in configs if res == "dca" and not opts), None)
    for label, res, opts, _ in configs:
        r = rows[label]
        row = [label, f"{r['params']:,}", mib(r["total_bytes"] if cuda else r["saved_activation_bytes"]),
               mib(r["state_bytes"]), mib(r["total_bytes"]), f"{r['total_bytes'] / rows['standard']['total_bytes']:.2f}x"]
        if full_dca and res == "dca" and "k" in opts:
            full = rows[full_dca]["total_bytes"]
            row += sec.goal(f"{label} vs {full_dca}", r["total_bytes"], full, f"< {full_dca} ({mib(full)} MiB)",
                            f"{100 * (1 - r['total_bytes'] / full):.0f}% less")
        else:
            row += ["", ""]
        sec.rows.append(row)
    sec.notes.append("Not counted on CPU: short-lived temporaries inside single ops and allocator overhead; "
                     "the saved activations are at their peak at the end of the forward, before backward frees them.")
    sec.data = {"method": "cuda.max_memory_allocated" if cuda else "saved_tensors_hooks + 4x params",
                "variants": rows}
    return sec


def saved_activation_bytes(model, batch) -> int:
    import torch
    import torch.nn.functional as F

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        # kept alive by the graph until it is freed, so a data pointer identifies one storage. Detached: a saved
        # output packed as itself holds its own grad_fn, a cycle that kept every measured model's graph alive
        # (the full run grew by each variant's activations and was killed for memory at 22 GiB)
        return t.detach()

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = F.cross_entropy(model(batch[0]), batch[1])
    del loss
    return sum(saved.values())


def cuda_peak_bytes(model, batch, precision: str = "32-true") -> int:
    import torch

    model = model.cuda()
    step = train_step(model, tuple(t.cuda() for t in batch), precision)
    step()  # optimizer state exists from here on
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    model.cpu()
    torch.cuda.empty_cache()
    return peak


# --- 9. model.compile() --------------------------------------------------------------------------------------------
def bench_compile(s: Settings) -> Section:
    size = s.vit(s.depth)
    batch = random_batch(s)
    fns, compile_s = {}, {}
    for label in s.compile_variants:
        _, res, opts = next(c for c in default_configs() if c[0] == label)
        eager = ours(res, opts, size).to(s.device)
        compiled = copy.deepcopy(eager)
        compiled.compile()  # in place (nn.Module.compile): parameter names unchanged
        fns[f"{label} eager"] = train_step(eager, batch, s.precision)
        fns[f"{label} compiled"] = train_step(compiled, batch, s.precision)
        first = synchronised(fns[f"{label} compiled"]) if s.device == "cuda" else fns[f"{label} compiled"]
        t0 = time.perf_counter()
        first()  # first call: dynamo + inductor compile forward and backward
        compile_s[label] = time.perf_counter() - t0
    times = interleave(fns, reps=s.reps, steps=s.steps, warmup=s.warmup, device=s.device)
    sec = Section("compile", "9. model.compile() (opt-in)",
                  f"{s.describe(s.depth)}; {s.mode_text()}, AdamW (not compiled); {s.reps} rounds x {s.steps} "
                  "steps; compile time = first compiled step minus a compiled step",
                  ["variant", "eager ms/step", "compiled ms/step", "compiled vs eager", "compile time", "goal", "mark"])
    for label in s.compile_variants:
        e, c = f"{label} eager", f"{label} compiled"
        ratio = paired_ratio(times, c, e)
        sec.rows.append([label, ms(median(times[e])), ms(median(times[c])), f"{ratio:.3f}x",
                         f"{compile_s[label] - median(times[c]):.1f} s", "report only", "—"])
    sec.notes.append("Inductor caches compiled kernels on disk: a second run compiles much faster than a cold one.")
    sec.data = {"times_s": times, "first_compiled_step_s": compile_s}
    return sec


# --- 11. the depth-aggregation and multi-stream designs' overhead ---------------------------------------------------------------------------------
#: the goals: train-step time vs standard of the designs whose extra work is depth aggregation or n streams
OVERHEAD_GOALS = {"attn_res": 1.3, "hyper_connections": 1.3, "dca": 1.3, "mhc": 1.5, "denseformer": 1.1}


def overhead_model(label: str, s: Settings, kernels: str):
    """One model of section 11: ``label`` is a design at its defaults, or "<design> (eager kernels)"."""
    model = ours(label.split(" (")[0], {}, s.vit(s.overhead_depth))
    if model.multi_stream_sites():
        model.set_stream_kernels("eager" if label.endswith("(eager kernels)") else kernels)
    return model.to(s.device)


def overhead_labels(kernels: str) -> list[str]:
    """Section 11's rows: standard, each design of ``OVERHEAD_GOALS``, and the multi-stream ones again with the eager
    kernels when training's pick here (``kernels``) is the compiled ones."""
    from lit_modules import RESIDUALS
    from lit_modules.residual.hyper_connections import MultiStreamSite

    multi = [label for label in OVERHEAD_GOALS if issubclass(RESIDUALS[label], MultiStreamSite)]
    return ["standard", *OVERHEAD_GOALS, *([f"{label} (eager kernels)" for label in multi] if kernels != "eager" else [])]


def overhead_times(s: Settings) -> dict:
    """Section 11's measurement: every model of ``overhead_labels`` interleaved in ``s.overhead_reps`` rounds in this
    process or, with ``s.isolate`` = K, each in a fresh process of its own (``one_model_time``) in K rounds; their
    times, FLOPs and the kernels (JSON: a child returns it)."""
    from lit_modules.residual import stream_kernels

    kernels = stream_kernels.resolve("auto", s.device)
    labels = overhead_labels(kernels)
    if s.isolate:
        times = isolated_times(s, labels)
    else:
        batch = random_batch(s, s.overhead_batch)
        times = interleave({label: train_step(overhead_model(label, s, kernels), batch, s.precision)
                            for label in labels}, reps=s.overhead_reps, steps=s.steps, warmup=s.warmup, device=s.device)
    flops = {label: measure(label, {}, **s.vit(s.overhead_depth))["flops"] for label in ["standard", *OVERHEAD_GOALS]}
    return {"times_s": times, "flops": flops, "stream_kernels": kernels}


def isolated_times(s: Settings, labels: list[str]) -> dict[str, list[float]]:
    """``s.isolate`` rounds; in each, every label's model in a fresh child process of its own (one model, as a
    training run holds), the order rotating from round to round: per label, each round's median seconds a step."""
    import torch

    times: dict[str, list[float]] = {label: [] for label in labels}
    for r in range(s.isolate):
        for label in rotated(labels, r):
            times[label].append(child.run("one_model", s, torch.get_num_threads(), label=label)["s"])
    return times


def one_model_time(s: Settings, label: str) -> dict:
    """In a child process (task ``one_model``): ``label``'s model alone, warmed up, then ``s.overhead_reps`` rounds
    of ``s.steps`` steps; the median seconds a step."""
    from lit_modules.residual import stream_kernels

    step = train_step(overhead_model(label, s, stream_kernels.resolve("auto", s.device)),
                      random_batch(s, s.overhead_batch), s.precision)
    return {"s": median(interleave({label: step}, reps=s.overhead_reps, steps=s.steps, warmup=s.warmup,
                                   device=s.device)[label])}


#: measured with five processes of every design (results/device/cpu-avx2/bench-overhead-1thread-5processes)
ONE_PROCESS_NOTE = ("One process: a ratio can differ between processes by more than between its rounds (on a "
                    "2-core VM mHC's ranged 1.35-1.41x over five); `--processes K` samples K of them.")


def bench_overhead(s: Settings) -> Section:
    """Each of ``OVERHEAD_GOALS``' variants at its defaults vs standard, interleaved in one run (section 2's
    method at depth ``overhead_depth``, batch ``overhead_batch``): the cost of their implementation, not of their
    FLOPs (each adds ≤ 10 % FLOPs). The multi-stream variants run the kernels training picks here
    (``stream_kernels: auto``); when those are the compiled ones, a row per variant with the eager kernels too.

    ``processes`` > 1 (``--processes K``): the same measurement in K fresh processes (``runs_of``, ``Sampled``): a
    ratio is the median of the processes' median ratios, its brackets the smallest and largest process's."""
    sampled = Sampled(runs_of(s, "overhead", overhead_times))
    first = sampled.runs[0]
    labels, kernels, flops = list(first["times_s"]), first["stream_kernels"], first["flops"]
    rounds = f"{s.overhead_reps} rounds x {s.steps} steps"
    if s.isolate:
        rounds = (f"every model in a fresh process of its own (one model, as a training run holds), {s.isolate} "
                  f"rounds in rotating order, each process's time the median of its {rounds}; a ratio pairs a "
                  f"design's process with standard's of the same round")
    sec = Section("overhead", "11. The depth-aggregation and multi-stream designs' step time vs standard",
                  f"{s.describe(s.overhead_depth, s.overhead_batch)}; {s.mode_text()}, AdamW; "
                  f"{sampled.how(rounds)}; each variant at its defaults; "
                  f"multi-stream kernels: {kernels} (what stream_kernels auto picks here)",
                  ["variant", "+FLOPs", "ms/step", f"time vs standard {sampled.bracket()}", "goal", "mark"])
    base, ratios = flops["standard"], {}
    for label in labels:
        variant = label.split(" (")[0]
        row = [label, f"{100.0 * (flops[variant] - base) / base:+.2f}%", ms(sampled.median("times_s", label))]
        if label == "standard":
            sec.rows.append(row + ["reference", "", ""])
            continue
        ratios[label] = sampled.ratios("times_s", label, "standard")
        if label not in OVERHEAD_GOALS:  # the eager kernels: for comparison, no goal
            sec.rows.append(row + [ratio_cell(ratios[label]), "", ""])
            continue
        ratio, limit = median(ratios[label]), OVERHEAD_GOALS[label]
        sec.rows.append(row + [ratio_cell(ratios[label]), *sec.goal(
            f"{label} / standard", ratio, limit, f"≤ {limit:.2f}x", f"{ratio:.3f}x", rounds=ratios[label],
            unit=sampled.unit)])
    sec.notes += sampled.notes() or ([] if s.isolate else [ONE_PROCESS_NOTE])
    sec.data = {"ratios": ratios, "flops": flops, "stream_kernels": kernels} | sampled.data("times_s")
    return sec

