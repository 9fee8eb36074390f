"""Precision and attention-kernel sections: the fastest mode per width and token count (8, the table precision
``auto`` reads) and ``auto`` vs both fixed precisions (10)."""

from __future__ import annotations

import tempfile

from ablations.machine.modes import MODE_KEYS, auto_mode, fastest, measure_cell, probe, tokens
from lit_modules.config import preset

from ..machine.timing import image_batch, interleave, median, round_ratios, train_step
from .harness import BACKBONE, Section, Settings, ms, ours, ratio_cell

# Imported where they are used, not here: torch. Each takes from a tenth of a second to seconds to import, and the
# command-line tools start without them.


def modes_grid(s: Settings) -> list[dict]:
    """The (width, heads, patch, tokens) cells of section 8."""
    return [{"embed_dim": w, "num_heads": max(2, w // 64), "patch_size": p, "tokens": tokens(s.img_size, p)}
            for w in s.modes_widths for p in s.modes_patches]


def bench_modes(s: Settings) -> Section:
    keys = list(MODE_KEYS)
    ref = keys[0]
    sec = Section("modes", "8. Fastest train-step mode per width and token count",
                  f"ours standard, depth {s.modes_depth}, mlp 4, {s.img_size}x{s.img_size}, 10 classes, batch "
                  f"{s.batch}, heads = max(2, width / 64), on the {s.device.upper()}; each cell times one train "
                  f"step (forward, cross-entropy, backward, AdamW) in the four modes precision/attention, "
                  f"{s.reps} rounds x {s.steps} steps interleaved within the cell; bf16-mixed = bf16 autocast of "
                  "forward and loss", ["width", "heads", "tokens", f"{ref} ms/step",
                                       *(f"{k} vs {ref} [round min-max]" for k in keys[1:]), "fastest"])
    cells = []
    for cell in modes_grid(s):
        size = BACKBONE.replace(img_size=s.img_size, patch_size=cell["patch_size"], embed_dim=cell["embed_dim"],
                                depth=s.modes_depth, num_heads=cell["num_heads"]).size()
        # each mode's time as the bench trusts it: the reference's median x the mode's paired ratio (a machine
        # whose load changes from round to round moves a raw median much more than an in-round ratio)
        measured = measure_cell(size, s.batch, device=s.device, reps=s.reps, steps=s.steps, warmup=s.warmup)
        times = measured["rounds_s"]
        precision, fused = fastest(measured)  # what ablations.machine.modes.choose_mode answers for this cell
        best = f"{precision}/{'fused' if fused else 'explicit'}"
        cells.append({**cell, **measured, "best": {"precision": precision, "fused_attn": fused}})
        sec.rows.append([str(cell["embed_dim"]), str(cell["num_heads"]), str(cell["tokens"]),
                         ms(measured["median_s"][ref]),
                         *(ratio_cell(round_ratios(times, k, ref)) for k in keys[1:]), best])
    sec.notes += ["A ratio below 1 is faster than fp32 with fused attention (the bench's and timm's default). "
                  "'fastest' is what ablations.machine.modes.choose_mode answers for the cell: the smallest 'times_s' in "
                  "the table this section writes, <out>/modes-<device>.json (each mode's time is the reference's "
                  "median times the mode's paired ratio; 'median_s': the raw medians), except that a bf16 mode must "
                  "be at least 5% faster than the fastest fp32 mode (ablations.machine.modes.BF16_MARGIN).",
                  f"Tokens = (img / patch)² patches + the class token (patch "
                  f"{', '.join(map(str, s.modes_patches))} on {s.img_size}x{s.img_size}: "
                  f"{', '.join(str(tokens(s.img_size, p)) for p in s.modes_patches)})."]
    sec.data = {"device": s.device, "depth": s.modes_depth, "batch": s.batch, "img_size": s.img_size,
                "cells": cells}
    return sec


#: Section 10's models: the study sizes precision auto decides most often (RunConfig fields; batch of the study).
AUTO_SIZES = (
    ("residual_variants default (mnist5k 28x28, patch 7)", preset("study", img_size=28, patch_size=7, in_chans=1).size(),
     64),
    ("ViT-Tiny width (32x32, patch 4)", preset("vit_tiny", depth=6).size(), 32),
)


def bench_auto(s: Settings) -> Section:
    """Precision ``auto`` against both fixed precisions, on this machine, at the study sizes: the mode auto picks
    here (a table matching this machine's signature, else measured on the spot as a training run would) timed
    interleaved with ``32-true`` and ``bf16-mixed`` (both with timm's fused attention, the fixed modes' kernel)."""
    import torch

    sizes = AUTO_SIZES if s.mode != "tiny" else (("tiny", dict(AUTO_SIZES[0][1], embed_dim=16, depth=1), 8),)
    sec = Section("auto", "10. precision auto vs the fixed precisions",
                  f"ours standard at each size, on the {s.device.upper()}, {torch.get_num_threads()} threads; one "
                  f"train step (forward, cross-entropy, backward, AdamW), {s.reps} rounds x {s.steps} steps "
                  "interleaved; auto = the mode ablations.machine.modes chooses here (its source in the last column)",
                  ["model", "32-true ms/step", "bf16-mixed vs 32-true", "auto's mode", "auto vs 32-true", "goal",
                   "mark", "auto's source"])
    data = []
    with tempfile.TemporaryDirectory() as tmp:  # a measurement made here is this section's alone
        for label, size, batch in sizes:
            count = tokens(size["img_size"], size["patch_size"])
            mode = auto_mode(s.device, size["embed_dim"], count, results_dir=tmp,
                             threads=torch.get_num_threads(), measure=probe(size, batch))
            x, y = image_batch(batch, size["in_chans"], size["img_size"], size["num_classes"], s.device)
            fns = {"32-true": train_step(ours("standard", {}, size).to(s.device), (x, y), "32-true"),
                   "bf16-mixed": train_step(ours("standard", {}, size).to(s.device), (x, y), "bf16-mixed"),
                   "auto": train_step(ours("standard", {}, size, fused=mode.fused_attn).to(s.device), (x, y),
                                      mode.precision)}
            times = interleave(fns, reps=s.reps, steps=s.steps, warmup=s.warmup, device=s.device)
            bf16, auto = round_ratios(times, "bf16-mixed", "32-true"), round_ratios(times, "auto", "32-true")
            ratio = median(auto)
            sec.rows.append([f"{label}: width {size['embed_dim']}, {count} tokens, depth {size['depth']}, batch "
                             f"{batch}", ms(median(times["32-true"])), ratio_cell(bf16), mode.key, ratio_cell(auto),
                             *sec.goal(f"auto / 32-true, {label}", ratio, 1.05, "≤ 1.05x", f"{ratio:.3f}x",
                                       rounds=auto), mode.source.replace(tmp, "<measured here>")])
            data.append({"model": label, "size": size, "batch": batch, "mode": mode.key, "source": mode.source,
                         "times_s": times})
    sec.notes.append("auto never trains in bf16 on a CPU unless a table measured on this CPU signature (model, "
                     "avx512_bf16/AMX flags, threads, torch) says bf16 is at least 5% faster (ablations.machine.modes).")
    sec.data = {"models": data}
    return sec


def modes_table(meta: dict, sec: Section) -> dict:
    """The machine-readable table of section 8 (``ablations.machine.modes.load_table`` reads it)."""
    d = sec.data
    return {"device": d["device"], "machine": meta["machine"], "started": meta["started"], "mode": meta["mode"],
            "settings": {"depth": d["depth"], "batch": d["batch"], "img_size": d["img_size"], "mlp_ratio": BACKBONE.mlp_ratio,
                         "reps": meta["settings"]["reps"], "steps": meta["settings"]["steps"]},
            "cells": [{k: v for k, v in c.items() if k != "rounds_s"} for c in d["cells"]]}
