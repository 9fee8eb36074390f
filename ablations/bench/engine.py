"""Section 13 (opt-in, ``--sections engine``): the training engine's levers per train step, at the study size and at
ViT-Tiny width — today's plain step, ``torch.compile`` of the step, K stacked runs of one cell per trial, and on
CUDA the hand-captured CUDA graphs of the plain and the stacked step (:mod:`ablations.engine.measure`)."""

from __future__ import annotations

import time

from ..machine.timing import interleave, median, round_ratios
from .harness import Section, Settings, ms, ratio_cell
from .precision import AUTO_SIZES

# Imported where they are used, not here: torch and the stacked engine. Each takes from a tenth of a second to
# seconds to import, and the command-line tools start without them.

#: K of the stacked rows (seeds or learning rates of one cell)
STACKS = (2, 4, 8)


def engine_sizes(s: Settings) -> tuple:
    """(label, size, batch) of the section's models: the study size and ViT-Tiny width (section 10's), or a tiny
    model under ``--tiny``."""
    if s.mode == "tiny":
        return (("tiny", dict(AUTO_SIZES[0][1], embed_dim=16, depth=1, num_heads=2), 4),)
    return AUTO_SIZES


def engine_functions(size: dict, batch: int, s: Settings) -> tuple[dict, dict]:
    """The timed functions of one model size and the seconds each one's first call took (compile, capture). Under
    ``--tiny`` (the test suite's seconds) only plain and stacked 2: a cold compile takes minutes; on CUDA compiled
    only with ``--compile``."""
    from ablations.engine.measure import plain_step, stacked_step

    cuda, tiny = s.device == "cuda", s.mode == "tiny"
    fused = cuda  # the CPU's fused SDPA has no vmap rule: stacked runs use the explicit kernel there, and so does plain
    builders = {"plain": lambda: plain_step(size, batch, precision=s.precision, fused_attn=fused, device=s.device)}
    if not tiny and s.engine_compile:
        builders["compiled"] = lambda: plain_step(size, batch, precision=s.precision, fused_attn=fused,
                                                  device=s.device, compile=True)
    if cuda:
        builders["graph"] = lambda: plain_step(size, batch, precision=s.precision, fused_attn=fused,
                                               device=s.device, graph=True)
    for k in (2,) if tiny else STACKS:
        builders[f"stacked {k}"] = lambda k=k: stacked_step(size, batch, k, precision=s.precision, fused_attn=fused,
                                                            device=s.device)
        if cuda:
            builders[f"stacked {k} graph"] = lambda k=k: stacked_step(size, batch, k, precision=s.precision,
                                                                      fused_attn=fused, device=s.device, graph=True)
    fns, first_s = {}, {}
    for name, build in builders.items():
        t0 = time.perf_counter()
        fn = build()
        fn()  # the first call: compile / capture / warm-up, timed apart
        if cuda:
            import torch

            torch.cuda.synchronize()
        first_s[name] = time.perf_counter() - t0
        fns[name] = fn
    return fns, first_s


def trials_of(name: str) -> int:
    """How many runs one call of a timed function trains (K for ``stacked K``)."""
    return int(name.split()[1]) if name.startswith("stacked") else 1


def bench_engine(s: Settings) -> Section:
    import torch

    sec = Section("engine", "13. The engine's levers per trial step (opt-in)",
                  f"on the {s.device.upper()}, {torch.get_num_threads()} threads, {s.mode_text('attention: fused on CUDA, explicit on the CPU')}; "
                  "one train step (forward, label-smoothed cross-entropy, backward, AdamW over the backbone's "
                  f"groups) per call, {s.reps} rounds x {s.steps} steps interleaved; a stacked call trains K runs "
                  "(seeds 0..K-1, learning rates 1e-3·2^k) and its time per trial is the call's time / K",
                  ["model", "lever", "ms/call", "ms/trial", "per trial vs plain [round min-max]", "images/s",
                   "first call s"])
    data = []
    for label, size, batch in engine_sizes(s):
        fns, first_s = engine_functions(size, batch, s)
        times = interleave(fns, reps=s.reps, steps=s.steps, warmup=s.warmup, device=s.device)
        per_trial = {name: [t / trials_of(name) for t in ts] for name, ts in times.items()}
        model = (f"{label}: width {size['embed_dim']}, depth {size['depth']}, "
                 f"{(size['img_size'] // size['patch_size']) ** 2 + 1} tokens, batch {batch}")
        for name in fns:
            ratios = round_ratios(per_trial, name, "plain")
            sec.rows.append([model, name, ms(median(times[name])), ms(median(per_trial[name])),
                             "reference" if name == "plain" else ratio_cell(ratios),
                             f"{batch / median(per_trial[name]):,.0f}", f"{first_s[name]:.1f}"])
            model = ""
        data.append({"model": label, "size": size, "batch": batch, "times_s": times, "first_call_s": first_s,
                     "per_trial_vs_plain": {n: median(round_ratios(per_trial, n, "plain")) for n in fns}})
    sec.notes += [
        "The CPU default (ablations.engine.choice) stacks a study's runs only where 'stacked K' per trial is at "
        "least 10% faster than 'plain' (a ratio <= 0.90) on the machine at hand.",
        "'compiled' = forward and loss through torch.compile (AOTAutograd compiles the backward; on CUDA "
        "mode='reduce-overhead'); 'graph' = the whole step captured as one CUDA graph by hand."]
    sec.data = {"device": s.device, "precision": s.precision, "models": data}
    return sec
