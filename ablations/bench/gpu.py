"""Section 14 (opt-in, ``--sections gpu``): what the training engine makes of a GPU.

1. **Study-size aggregate throughput**: the headline study's cell (width 64, depth 4, 17 tokens, batch 64) trained
   as ``--workers W --stack K`` trains it — W processes, each a stack of K runs replayed as one CUDA graph — all at
   once on the device: training images per second of all of them together (goal: a million).
2. **The paper recipe's model step**: width 384, depth 6, 6 heads, 65 tokens (patch 4 on 32 px), batch 1024, bf16
   autocast with fused attention: images/s and MFU (3 × forward FLOPs per image × images/s over the GPU's dense
   bf16 peak, ``ablations.pricing.gpu_hours``) of the plain eager step and of the engine's step as one CUDA graph
   (goal: 40 % MFU).
3. **The multi-stream designs' step against standard's** at section 11's size (ViT-Tiny width, depth 6, batch 32),
   each as the engine trains it (one run, one CUDA graph replay): the ratio of their step times (the CPU goals
   beside them), where before the launches made the ratio.

On a CPU (``--tiny``, the test suite's seconds) the same code runs at tiny sizes without graphs: the figures mean
nothing there.
"""

from __future__ import annotations

from ablations.costs import measure as count
from lit_modules.config import ViTConfig

from ..machine.timing import interleave, median, round_ratios
from ..pricing.gpu_hours import gpu_class_of, peak_flops
from .harness import Section, Settings, ms, ratio_cell
from .precision import AUTO_SIZES
from .steps import OVERHEAD_GOALS

# Imported where they are used, not here: torch and the stacked engine. Each takes from a tenth of a second to
# seconds to import, and the command-line tools start without them.

#: (1) processes and runs per stack on a GPU; seconds each trains
AGGREGATE_WORKERS, AGGREGATE_STACK, AGGREGATE_SECONDS = 8, 32, 10.0
AGGREGATE_GOAL = 1_000_000
#: (2) the paper recipe's model (residual_variants' paper budget at depth 6) and its batch
PAPER = {"img_size": 32, "patch_size": 4, "in_chans": 3, "num_classes": 10, "embed_dim": 384, "depth": 6,
         "num_heads": 6, "mlp_ratio": 4.0}
PAPER_BATCH, MFU_GOAL = 1024, 0.40


def bench_gpu(s: Settings) -> Section:
    import torch

    cuda, tiny = s.device == "cuda", s.mode == "tiny"
    sec = Section("gpu", "14. The engine on the device (opt-in)",
                  f"on the {s.device.upper()}" + (f" ({torch.cuda.get_device_name(0)})" if cuda else "")
                  + f", {s.mode_text()}; steps as the engine trains them ("
                  + ("each a CUDA graph replay" if cuda else "eager: no CUDA graphs on a CPU") + ")",
                  ["measure", "setup", "result", "goal", "mark"])
    data = {"device": s.device}
    data["aggregate"] = _aggregate(s, sec, cuda, tiny)
    data["paper"] = _paper(s, sec, cuda, tiny)
    data["designs"] = _designs(s, sec, cuda, tiny)
    sec.notes += [
        "(1) is what a study's workers reach together; the study run itself also evaluates, checkpoints and logs "
        "every epoch (scripts/gpu_study.py measures the whole).",
        "(3)'s CPU goals were set for CPU steps; on a GPU without graphs these ratios counted launches "
        "(results/device/cuda/bench-overhead-batch*)."]
    sec.data = data
    return sec


def _aggregate(s: Settings, sec: Section, cuda: bool, tiny: bool) -> dict:
    from ablations.engine.measure import aggregate_throughput

    size = AUTO_SIZES[0][1] if not tiny else dict(AUTO_SIZES[0][1], embed_dim=16, depth=1, num_heads=2)
    batch = AUTO_SIZES[0][2] if not tiny else 8
    workers, k, seconds = (AGGREGATE_WORKERS, AGGREGATE_STACK, AGGREGATE_SECONDS) if cuda else (1, 2, 1.0)
    result = aggregate_throughput(size, batch, k, workers, device=s.device, precision=s.precision, graph=cuda,
                                  seconds=seconds)
    rate = result["images_per_s"]
    sec.rows.append(["study-size aggregate images/s", f"width {size['embed_dim']}, depth {size['depth']}, batch "
                     f"{batch}; {workers} processes x {k} stacked runs, {seconds:g} s", f"{rate:,.0f}",
                     *sec.goal("study-size aggregate images/s", rate, AGGREGATE_GOAL, ">= 1,000,000", f"{rate:,.0f}",
                               at_most=False)])
    return result | {"size": size}


def _paper(s: Settings, sec: Section, cuda: bool, tiny: bool) -> dict:
    from ablations.engine.measure import plain_step, stacked_step

    size = PAPER if not tiny else dict(PAPER, embed_dim=16, depth=1, num_heads=2)
    batch = PAPER_BATCH if not tiny else 4
    fns = {"plain": plain_step(size, batch, precision=s.precision, fused_attn=True, device=s.device)}
    if cuda:
        fns["engine graph"] = stacked_step(size, batch, 1, precision=s.precision, fused_attn=True, device=s.device,
                                           graph=True)
    times = interleave(fns, reps=s.reps, steps=s.steps, warmup=s.warmup, device=s.device)
    flops = 3 * float(count(ViTConfig(**size))["flops"])
    gpu = None
    if cuda:
        import torch

        gpu = gpu_class_of(torch.cuda.get_device_name(0))
    peak = peak_flops(gpu, "bf16") if gpu else None
    out = {"size": size, "batch": batch, "times_s": times, "train_flops_per_image": flops, "peak_flops_per_s": peak,
           "gpu_class": gpu}
    for name in fns:
        rate = batch / median(times[name])
        mfu = rate * flops / peak if peak else None
        out[f"{name}_images_per_s"], out[f"{name}_mfu"] = rate, mfu
        shown = f"{rate:,.0f} images/s" + (f", MFU {100 * mfu:.1f}%" if mfu is not None else "")
        cells = (sec.goal(f"paper recipe MFU ({name})", mfu, MFU_GOAL, ">= 40% MFU", f"{100 * mfu:.1f}%",
                          at_most=False) if mfu is not None else ["MFU needs a GPU of a known class", "—"])
        sec.rows.append([f"paper recipe model step, {name}", f"width {size['embed_dim']}, depth {size['depth']}, "
                         f"65 tokens, batch {batch}; {ms(median(times[name]))} ms/step", shown, *cells])
    return out


def _designs(s: Settings, sec: Section, cuda: bool, tiny: bool) -> dict:
    from ablations.engine.measure import stacked_step

    size = s.vit(s.overhead_depth)
    batch = s.overhead_batch
    labels = ["standard", *OVERHEAD_GOALS]
    fns, eager = {}, []
    for label in labels:
        try:
            fns[label] = stacked_step(size, batch, 1, precision=s.precision, fused_attn=cuda, device=s.device,
                                      graph=cuda, residual=label)
        except Exception:  # noqa: BLE001 - a step that cannot be captured is timed eagerly, and said so
            if not cuda:
                raise
            eager.append(label)
            fns[label] = stacked_step(size, batch, 1, precision=s.precision, fused_attn=cuda, device=s.device,
                                      residual=label)
    if eager:
        sec.notes.append(f"(3) {', '.join(eager)}: the step could not be captured as a CUDA graph; timed eagerly.")
    times = interleave(fns, reps=s.overhead_reps, steps=s.steps, warmup=s.warmup, device=s.device)
    ratios = {}
    for label in labels[1:]:
        per_round = round_ratios(times, label, "standard")
        ratios[label] = median(per_round)
        sec.rows.append([f"{label} step vs standard's", f"depth {size['depth']}, width {size['embed_dim']}, batch "
                         f"{batch}; standard {ms(median(times['standard']))} ms", ratio_cell(per_round),
                         *sec.goal(f"{label} / standard (engine step)", ratios[label], OVERHEAD_GOALS[label],
                                   f"<= {OVERHEAD_GOALS[label]:g}x (the CPU goal)", f"{ratios[label]:.2f}x",
                                   rounds=per_round)])
    return {"times_s": times, "ratios": ratios, "depth": size["depth"], "batch": batch, "eager": eager}
