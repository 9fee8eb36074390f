"""Speed, FLOP utilisation and memory of the backbone, measured as ratios side by side in one process.

    python -m ablations.bench                        # every section at full size (~25 min on 2 quiet cores)
    python -m ablations.bench --quick                # every section at small sizes (~3 min on 2 quiet cores)
    python -m ablations.bench --sections timm,mfu --threads 2 --out /tmp/bench
    python -m ablations.bench --compile              # also time model.compile() (cold compiles take minutes)
    python -m ablations.bench --device cuda --sections variants,memory,modes \
        --variants "standard,dca (default),dca k=2,dca grn_v3" --out results/device   # the GPU path

Writes ``<out>/bench.md`` (each figure beside its goal with a pass/miss mark, plus the machine facts) and
``<out>/bench.json`` (the raw timings). Sections: 1 timm, 2 variants, 3 lightning, 4 mfu, 5 study, 6 memory,
7 data, 8 modes, 9 compile (only with ``--compile``), 10 auto (precision auto vs both fixed precisions), 11 overhead. Section 8 also writes ``<out>/modes-<device>.json``, the
table ``ablations.modes`` chooses a training run's precision and attention kernel from: it looks for the user's own
at ``results/device/modes-<device>.json`` (hence ``--out results/device`` above).

Device (``--device cpu|cuda``): models and batches live there; on CUDA every timed function ends with
``torch.cuda.synchronize()`` (added in ``interleave``) so a time covers the kernels, not their launch. The timed
train steps run in the device's fast mode: fp32 with fused attention on the CPU (as always), bf16 autocast with
fused attention on CUDA; each section's setup line says which. Section 8 times all four modes.

Method: everything timed (a train step, a training loop, a matmul) is a zero-argument function. A section builds
all of its functions first, calls each untimed (warm-up), then runs ``reps`` rounds; in a round every function in
turn is timed over ``steps`` back-to-back calls (A/B/C/A/B/C..., the first one rotating from round to round).
A time is the median over rounds; a ratio is the median over rounds of the ratio within a round (paired: both
sides ran seconds apart under the same machine load). On a busy machine
every figure is noise: the load average at the start and end of the run is part of the report. Never run two
benchmarks (or a benchmark and tests) at once: with more busy threads than cores, timings are meaningless.

Memory (section 6) on the CPU runs one forward per variant at depth 24 at batch 16 (--quick: 8). Before DCA's GRN
became a fused Function, full DCA at batch 64 saved ~9 GiB for backward and the run was OOM-killed on a 24 GiB
machine; batch 16 keeps the section short and far from that.

Data (section 7) times one epoch of the training data path alone (``ablations.training.build_datamodule`` on an
in-memory CIFAR-shaped synthetic set, recipes ``basic`` and ``paper``) against section 1's train step, both in
images/s: an in-memory loader runs between steps, so its time adds to every step. Modes (section 8) times the train
step in the four modes precision x attention kernel on a grid of widths and token counts (``ablations.modes``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import logging
import os
import platform
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from . import layout
from .cli import OneLineParser
from .timing import interleave, median, paired_ratio, round_ratios, synchronised, train_step

SECTIONS = ("timm", "variants", "lightning", "mfu", "study", "memory", "data", "modes", "compile", "auto",
            "overhead")
DEFAULT_SECTIONS = tuple(name for name in SECTIONS if name != "compile")  # compile is opt-in
STUDY = "residual_variants"


@dataclass(frozen=True)
class Settings:
    """Sizes of one benchmark mode. The model of sections 1, 2, 4, 6, 7, 9 is ViT-Tiny width on 32x32 inputs."""

    mode: str = "full"
    device: str = "cpu"  # --device: "cpu" or "cuda"
    embed_dim: int = 192
    num_heads: int = 3
    img_size: int = 32
    patch_size: int = 4
    depth: int = 12  # sections 1, 4, 7
    variant_depth: int = 12  # section 2
    batch: int = 64
    warmup: int = 2  # untimed calls per function before the first round
    reps: int = 7  # rounds
    steps: int = 3  # timed calls per function per round
    variants: tuple[str, ...] | None = None  # labels of costs.all_configs() for sections 2 and 6 (None: all)
    defaults_only: bool = False  # sections 2 and 6: only the registry's variants at their defaults (no extra forms)
    mm_size: int = 2048  # section 4: side of the square fp32 matmul that measures the peak on the CPU
    cuda_mm_size: int = 8192  # ... and of the bf16 matmul on CUDA
    loop_steps: int = 60  # section 3: optimizer steps per training loop
    loop_reps: int = 9  # the loops differ by a few percent: rounds are cheap, noise is not
    trial_overrides: dict = field(default_factory=dict)  # sections 3, 5: RunConfig fields over the study's
    study_epochs: int | None = None  # section 5: epochs of each timed trial (None: the study's own)
    study_depths: int | None = None  # section 5: time only the first N depths of the grid (None: all)
    run_estimate: bool = True  # section 5: also show ablations.run's FLOP-based estimate of each trial
    memory_depth: int = 24
    memory_batch: int = 16  # batch 64 at depth 24 OOM-killed the 24 GiB machine (full DCA saves ~9 GiB)
    compile_variants: tuple[str, ...] = ("standard", "dca (default)")
    data_samples: int = 2560  # section 7: synthetic CIFAR-shaped pool (train split: 80%)
    modes_widths: tuple[int, ...] = (16, 32, 64, 128, 192, 384)  # section 8: the grid (heads = max(2, width // 64)) ...
    modes_patches: tuple[int, ...] = (16, 8, 4)  # ... x patch sizes on img_size 32: 5, 17, 65 tokens
    modes_depth: int = 4
    overhead_depth: int = 6  # section 11: the new designs at issue 27's size (depth 6, batch 32) ...
    overhead_batch: int = 32
    overhead_reps: int = 9  # ... in more rounds than section 2: the goals are tight, the rounds cheap

    @property
    def precision(self) -> str:
        """The timed train steps' precision: the device's fast mode (fp32 on the CPU, bf16 autocast on CUDA)."""
        return "bf16-mixed" if self.device == "cuda" else "32-true"

    def mode_text(self, attention: str = "fused attention") -> str:
        if self.device == "cuda":
            return f"CUDA, bf16 autocast (bf16-mixed), {attention}"
        return f"fp32, {attention}"

    def vit(self, depth: int) -> dict:
        return dict(img_size=self.img_size, patch_size=self.patch_size, in_chans=3, num_classes=10,
                    embed_dim=self.embed_dim, depth=depth, num_heads=self.num_heads, mlp_ratio=4.0)

    def describe(self, depth: int, batch: int | None = None) -> str:
        return (f"embed {self.embed_dim}, {self.num_heads} heads, depth {depth}, {self.img_size}x{self.img_size} "
                f"patch {self.patch_size}, 10 classes, batch {batch or self.batch}")


FULL = Settings()
QUICK = replace(FULL, mode="quick", batch=32, variant_depth=6, warmup=1, reps=3, steps=2, loop_steps=24,
                loop_reps=3, study_epochs=2, memory_batch=8, compile_variants=("standard",), defaults_only=True,
                data_samples=1280, modes_widths=(64, 192), modes_patches=(8, 4))
TINY = replace(FULL, mode="tiny", embed_dim=32, num_heads=2, patch_size=8, depth=2, variant_depth=4, batch=4,
               warmup=1, reps=2, steps=1, mm_size=256, loop_steps=3, loop_reps=2,
               trial_overrides={"embed_dim": 16, "num_heads": 2, "diagnostics_every": 0}, study_epochs=1,
               study_depths=1, run_estimate=False,
               memory_depth=4, memory_batch=2, compile_variants=("standard",), data_samples=40,
               modes_widths=(32,), modes_patches=(8,), modes_depth=1, overhead_depth=2, overhead_batch=4,
               overhead_reps=2)


# --- timing: ablations.timing (shared with precision auto's measurement) -------------------------------------------


def ratio_cell(ratios: list[float], percent: bool = False) -> str:
    """The median ratio and, in brackets, the smallest and largest round's: the spread is this machine's noise."""
    if percent:
        return f"{100 * (median(ratios) - 1):+.1f}% [{100 * (min(ratios) - 1):+.0f}, {100 * (max(ratios) - 1):+.0f}]"
    return f"{median(ratios):.3f}x [{min(ratios):.2f}-{max(ratios):.2f}]"


# --- models and data -----------------------------------------------------------------------------------------------
def ours(residual: str, options: dict, size: dict, fused: bool = True, backbone: dict | None = None):
    from lit_modules import VisionTransformer

    return VisionTransformer(residual, options, fused_attn=fused, **size, **(backbone or {}))


def set_fused_attn(model, enabled: bool):
    """Fused SDPA or explicit attention on every timm ``Attention`` (ours, timm's, and DCA's cross-attention)."""
    from timm.layers import Attention

    for m in model.modules():
        if isinstance(m, Attention):
            m.fused_attn = enabled
    return model


def random_batch(s: Settings, batch: int | None = None):
    """A fixed (images, labels) batch on the device (drawn on the CPU: the same numbers on every device)."""
    import torch

    g = torch.Generator().manual_seed(0)
    n = batch or s.batch
    x, y = torch.randn(n, 3, s.img_size, s.img_size, generator=g), torch.randint(0, 10, (n,), generator=g)
    return x.to(s.device), y.to(s.device)


def parse_variants(text: str, labels: list[str]) -> tuple[str, ...]:
    """Comma-separated labels of ``costs.all_configs()`` (a label may itself hold a comma: the longest match of
    consecutive items is taken); ``standard``, the reference of sections 2 and 6, is always included, first."""
    items, chosen, i = text.split(","), ["standard"], 0
    while i < len(items):
        j = next((j for j in range(len(items), i, -1) if ",".join(items[i:j]).strip() in labels), None)
        if j is None:
            if items[i].strip():
                raise argparse.ArgumentTypeError(f"unknown variant '{items[i].strip()}'; valid: {', '.join(labels)}")
            i += 1
            continue
        label = ",".join(items[i:j]).strip()
        if label not in chosen:
            chosen.append(label)
        i = j
    return tuple(chosen)


def selected_configs(s: Settings) -> list[tuple[str, str, dict, dict]]:
    """(label, residual, options, backbone options) of sections 2 and 6: ``s.variants`` (plus standard) when given,
    else all of ``costs.all_configs()`` or, with ``defaults_only``, the registry's variants at their defaults."""
    from ablations.costs import all_configs
    from lit_modules import RESIDUALS

    if s.variants is not None:
        return [c for c in all_configs() if c[0] in s.variants or c[0] == "standard"]
    return list(all_configs()[:len(RESIDUALS)] if s.defaults_only else all_configs())  # the registry's rows first


def is_dca(residual: str, options: dict) -> bool:
    """DCA proper (its seed form is built as LAuReL-RW and priced like the others)."""
    return residual == "dca" and options.get("form", "dca") != "seed"


def study_trial(s: Settings):
    """The RunConfig of the study's representative trial (first variant, middle depth, seed 0) with the mode's
    overrides, and the spec."""
    from ablations.run.spec import load_spec

    spec = load_spec(STUDY)
    grid = spec.grid()
    depths = sorted({p["depth"] for p in grid if "depth" in p})
    point = next(p for p in grid if not depths or p["depth"] == depths[len(depths) // 2])
    return spec, spec.run_config(point, s.trial_overrides)


# --- report pieces -------------------------------------------------------------------------------------------------
@dataclass
class Section:
    """One section of the report: a Markdown table, its goals (for the summary) and raw numbers (for the JSON)."""

    name: str
    title: str
    setup: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    goals: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    wall_s: float = 0.0
    error: str | None = None

    def goal(self, what: str, value: float, limit: float, text: str, shown: str, at_most: bool = True,
             rounds: list[float] | None = None) -> list[str]:
        """Record a goal and return its two table cells: the goal text and the pass/miss mark. With ``rounds``
        (the per-round values whose median is ``value``) the mark also says in how many rounds the goal held:
        a goal that holds in some rounds and not in others is within this machine's timing noise."""
        meets = (lambda v: v <= limit) if at_most else (lambda v: v >= limit)  # noqa: E731
        passed = meets(value)
        entry = {"what": what, "value": value, "limit": limit, "goal": text, "result": shown, "passed": passed}
        if rounds:
            entry["rounds"], entry["rounds_meeting_goal"] = rounds, sum(map(meets, rounds))
        self.goals.append(entry)
        return [text, goal_mark(entry)]

    @property
    def passed(self) -> bool | None:
        if self.error:
            return False
        return all(g["passed"] for g in self.goals) if self.goals else None


def mark(passed: bool | None) -> str:
    return "—" if passed is None else "pass" if passed else "**miss**"


def goal_mark(goal: dict) -> str:
    rounds = f" ({goal['rounds_meeting_goal']}/{len(goal['rounds'])} rounds)" if goal.get("rounds") else ""
    return mark(goal["passed"]) + rounds


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f}"


def table(columns: list[str], rows: list[list[str]]) -> str:
    def numeric(i: int) -> bool:  # right-align a column whose filled cells are mostly numbers
        cells = [row[i] for row in rows if row[i]]
        return 2 * sum(c[0].isdigit() or c[0] in "+-" for c in cells) >= len(cells) > 0

    aligns = ["---:" if i and numeric(i) else "---" for i in range(len(columns))]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(aligns) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


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
    from ablations.costs import measure

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


# --- 3. Lightning loop vs a plain loop -----------------------------------------------------------------------------
def bench_lightning(s: Settings) -> Section:
    from ablations.training import build_datamodule, build_model

    _, config = study_trial(s)
    dm = build_datamodule(config)
    loader = dm.train_dataloader()
    classifier = build_model(config, dm)
    classifier.hparams.steps_per_epoch = len(loader)  # the schedule no longer needs a Trainer: same in every loop
    dev, precision = s.device, s.precision
    makers = {"plain PyTorch": lambda n: plain_loop(copy.deepcopy(classifier), loader, n, dev, precision),
              "Lightning, ViTClassifier": lambda n: lightning_loop(copy.deepcopy(classifier), loader, n, dev,
                                                                   precision),
              "Lightning, bare module": lambda n: lightning_loop(bare_module(copy.deepcopy(classifier)), loader, n,
                                                                 dev, precision)}
    loops = {f"{name} x{n}": make(n) for name, make in makers.items() for n in (s.loop_steps, 0)}
    with preserved_torch_state():  # the Trainer turns deterministic algorithms on: both loops run under them
        times = interleave(loops, reps=s.loop_reps, steps=1, warmup=1, device=s.device)
    per_step = {name: [(a - b) / s.loop_steps for a, b in zip(times[f"{name} x{s.loop_steps}"], times[f"{name} x0"],
                                                              strict=True)] for name in makers}
    sec = Section("lightning", "3. Lightning training loop vs a plain PyTorch loop",
                  f"the {STUDY} trial model ({config.dataset}, embed {config.embed_dim}, depth {config.depth}, "
                  f"{config.num_heads} heads, patch {config.patch_size}, batch {config.batch_size}); "
                  f"{s.mode_text('attention as in the trial config')}; AdamW + "
                  f"warmup-cosine LambdaLR from ViTClassifier.configure_optimizers, label smoothing "
                  f"{config.label_smoothing}; Lightning deterministic as in a trial (without the NaN fill of new tensors); "
                  f"no logger, progress bar, checkpointing or validation; each loop run "
                  f"for {s.loop_steps} and for 0 optimizer steps, {s.loop_reps} rounds",
                  ["loop", "set-up ms", "ms/step", "per step vs plain [round min-max]", "goal", "mark"])
    for name in makers:
        row = [name, ms(median(times[f"{name} x0"])), ms(median(per_step[name]))]
        if name == "plain PyTorch":
            sec.rows.append(row + ["reference", "", ""])
            continue
        ratios = round_ratios(per_step, name, "plain PyTorch")
        ratio = median(ratios)
        cells = (sec.goal(f"{name} / plain, per step", ratio, 1.05, "≤ 1.05x", f"{ratio:.3f}x", rounds=ratios)
                 if "ViTClassifier" in name else ["(loop alone)", "—"])
        sec.rows.append(row + [ratio_cell(ratios), *cells])
    sec.notes += ["set-up = a loop run for 0 steps (optimizer and scheduler, plus the Trainer and fit set-up for "
                  f"Lightning); ms/step = (time of {s.loop_steps} steps - set-up) / {s.loop_steps}, paired per round.",
                  "'bare module' is a LightningModule whose training_step only computes the loss: the gap from it to "
                  "the plain loop is Lightning's loop, the gap from it to ViTClassifier is the module's per-step "
                  "metrics and logging. The trial model's step is small (few tokens), so fixed per-step costs weigh "
                  "more here than at ViT-Tiny width."]
    sec.data = {"times_s": times, "per_step_s": per_step, "steps": s.loop_steps, "config": config.to_dict()}
    return sec


def plain_loop(classifier, loader, steps: int, device: str = "cpu",
               precision: str = "32-true") -> Callable[[], None]:
    import torch
    import torch.nn.functional as F

    classifier.to(device)
    bf16 = precision == "bf16-mixed"

    def fit() -> None:
        conf = classifier.configure_optimizers()
        optimizer, scheduler = conf["optimizer"], conf["lr_scheduler"]["scheduler"]
        model, smoothing = classifier.model, classifier.hparams.label_smoothing
        classifier.train()
        done = 0
        while done < steps:
            for x, y in loader:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)  # as Lightning does
                with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
                    loss = F.cross_entropy(model(x), y, label_smoothing=smoothing)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                scheduler.step()
                done += 1
                if done == steps:
                    break

    return fit


def lightning_loop(module, loader, steps: int, device: str = "cpu",
                   precision: str = "32-true") -> Callable[[], None]:
    """Lightning's fit loop over ``steps`` optimizer steps, deterministic as a trial's (``run_training``)."""
    import lightning.pytorch as pl

    from ablations.training import deterministic_without_nan_fill

    def fit() -> None:
        trainer = pl.Trainer(accelerator="gpu" if device == "cuda" else "cpu", devices=1, precision=precision,
                             max_steps=steps, logger=False, enable_progress_bar=False,
                             enable_checkpointing=False, enable_model_summary=False, limit_val_batches=0,
                             num_sanity_val_steps=0, **deterministic_without_nan_fill())
        trainer.fit(module, train_dataloaders=loader)

    return fit


def bare_module(classifier):
    """A LightningModule around the classifier's backbone whose training step only computes the loss."""
    import lightning.pytorch as pl
    import torch.nn.functional as F

    class Bare(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.inner = classifier

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.inner.model(x), y, label_smoothing=self.inner.hparams.label_smoothing)

        def configure_optimizers(self):
            return self.inner.configure_optimizers()

    return Bare()


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


# --- 5. study throughput -------------------------------------------------------------------------------------------
def bench_study(s: Settings) -> Section:
    import optuna

    from ablations.run.objective import Objective
    from ablations.run.plan import estimate_seconds
    from ablations.run.spec import load_spec

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = load_spec(STUDY)
    # a tuning stage's trials are grid points too (priced like the reported ones); the timed trial runs at the
    # study's own learning rate: a step costs the same at any rate
    tune_grid = spec.tune_stage().grid() if spec.tune is not None else []
    spec = dataclasses.replace(spec, tune=None)
    grid = spec.grid() + [{k: v for k, v in p.items() if k != "lr"} for p in tune_grid]
    depths = sorted({p["depth"] for p in grid})
    epochs = s.study_epochs or spec.base["max_epochs"]
    scale = spec.base["max_epochs"] / epochs
    variant = grid[0]["variant"]
    measured = {}
    with tempfile.TemporaryDirectory() as tmp, preserved_torch_state():
        overrides = dict(s.trial_overrides) | {"max_epochs": epochs, "threads": _threads(),
                                               "accelerator": "gpu" if s.device == "cuda" else "cpu"}
        objective = Objective(spec, log_root=Path(tmp), overrides=overrides)
        for depth in depths[: s.study_depths]:
            study = optuna.create_study(direction=spec.direction)
            study.enqueue_trial(next(p for p in grid if p["depth"] == depth and p["variant"] == variant))
            t0 = time.perf_counter()
            study.optimize(objective, n_trials=1)
            measured[depth] = (time.perf_counter() - t0) * scale
            if study.trials[0].state.name != "COMPLETE":
                raise RuntimeError(f"trial at depth {depth} ended {study.trials[0].state.name}")

    def trial_s(depth: int) -> float:  # a depth not timed: the nearest timed one, scaled by depth
        near = min(measured, key=lambda d: abs(d - depth))
        return measured[near] * depth / near

    grid_s = sum(trial_s(p["depth"]) for p in grid)
    trials_per_hour = 3600 * len(grid) / grid_s
    estimate = {}
    if s.run_estimate:
        estimate = {i: estimate_seconds(spec.run_config(p)) for i, p in enumerate(grid)}
    sec = Section("study", f"5. Study throughput: {STUDY} at its default size",
                  f"{len(grid)} trials ({len(spec.variants)} variants x depths {depths} x seeds "
                  f"{spec.axes.get('seed')}" + (f", plus {len(tune_grid)} of its tuning stage" if tune_grid else "")
                  + f"); one '{variant}' trial (seed 0) per depth timed end to end through "
                  f"ablations.run.objective.Objective ({epochs} epochs"
                  + (f", scaled linearly to the study's {spec.base['max_epochs']}" if scale != 1 else "")
                  + f"); one worker, {_threads()} threads, on the {s.device.upper()}, precision as the study "
                  f"configures it ({spec.run_config(grid[0]).precision})",
                  ["quantity", "value", "ablations.run --dry-run estimate", "goal", "mark"])
    for depth in depths:
        est = [estimate[i] for i, p in enumerate(grid) if p["depth"] == depth and p["variant"] == variant
               and estimate]
        timed = "" if depth in measured else " (extrapolated by depth)"
        sec.rows.append([f"trial wall time, depth {depth}", f"{trial_s(depth):.1f} s{timed}",
                         f"{est[0]:.1f} s" if est else "—", "", "—"])
    run_total = sum(estimate.values())
    sec.rows += [["trials per hour", f"{trials_per_hour:.0f}",
                  f"{3600 * len(grid) / run_total:.0f}" if estimate else "—", "", "—"],
                 ["whole grid", f"{grid_s / 60:.1f} min", f"{run_total / 60:.1f} min" if estimate else "—", "", "—"]]
    scaled = (f"each trial ran {epochs} epoch(s) and was scaled x{scale:g}, which over-counts its fixed set-up "
              "cost; " if scale != 1 else "")
    sec.notes.append(f"Extrapolation: every grid point is priced at the measured '{variant}' trial of its depth, "
                     f"so variant overheads (section 2: DCA, LAuReL) are not included; {scaled}the last column is "
                     "ablations.run's FLOP-based estimate (TRIAL_OVERHEAD_S, EFFECTIVE_GFLOPS), for calibration.")
    sec.data = {"measured_trial_s": measured, "trial_epochs": epochs, "scale_to_study_epochs": scale,
                "grid_trials": len(grid), "grid_estimate_s": grid_s, "trials_per_hour": trials_per_hour,
                "run_py_estimate_s": run_total if estimate else None}
    return sec


@contextlib.contextmanager
def preserved_torch_state():
    """run_training (and a deterministic Trainer) set the thread count, seeds, deterministic algorithms and their
    NaN fill for the process: undo it after."""
    import torch
    import torch.utils.deterministic

    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def _threads() -> int:
    import torch

    return torch.get_num_threads()


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
        return t  # kept alive by the graph until backward, so a data pointer identifies one storage

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


# --- 7. the data path ---------------------------------------------------------------------------------------------
DATA_RECIPES = {"basic": "the dataset's own crop/flip", "paper": "+ RandAugment 9/5, ColorJitter, random erasing, "
                "Mixup/CutMix"}


def data_configs(s: Settings) -> dict:
    """The RunConfig of each recipe whose training data path section 7 times: a CIFAR-shaped synthetic set (32x32,
    3 channels, uint8, 10 classes) held in memory, at the bench's batch, on the bench's device."""
    from ablations.config import RunConfig

    base = {"dataset": "synthetic", "batch_size": s.batch, "augment": True, "seed": 0,
            "dataset_options": {"img_size": s.img_size, "num_samples": s.data_samples, "num_classes": 10},
            "accelerator": "gpu" if s.device == "cuda" else "cpu"}
    return {recipe: RunConfig(**base, recipe=recipe) for recipe in DATA_RECIPES}


def epoch_fn(loader, images: dict, name: str, mix: Callable | None = None) -> Callable[[], None]:
    """One pass over ``loader`` (its batches are (images, labels)), each batch then through ``mix`` (the recipe's
    Mixup/CutMix, which the training step applies, seeded per batch as there); records the images it yielded."""
    from data.common import seeded_generator

    def epoch() -> None:
        n = 0
        for i, (x, y) in enumerate(loader):
            if mix is not None:
                x, _ = mix(x, y, seeded_generator(0, i))
            n += len(x)
        images[name] = n

    return epoch


def bench_data(s: Settings) -> Section:
    import torch

    from ablations.training import build_datamodule, mixup_options
    from data.augment import SeededMixup

    configs = data_configs(s)
    datamodules = {recipe: build_datamodule(config) for recipe, config in configs.items()}
    for dm in datamodules.values():
        dm.device = torch.device(s.device)  # no Trainer here: hold and augment the images on the bench's device
    loaders = {recipe: dm.train_dataloader() for recipe, dm in datamodules.items()}
    mixes = {recipe: SeededMixup(**mixup_options(config), label_smoothing=config.label_smoothing, num_classes=10)
             if config.mixes else None for recipe, config in configs.items()}
    images: dict[str, int] = {}
    fns = {recipe: epoch_fn(loader, images, recipe, mixes[recipe]) for recipe, loader in loaders.items()}
    step = "model train step"
    fns[step] = train_step(ours("standard", {}, s.vit(s.depth)).to(s.device), random_batch(s), s.precision)
    times = interleave(fns, reps=s.reps, steps=s.steps, warmup=s.warmup, device=s.device)
    per_call = images | {step: s.batch}
    rate = {name: [per_call[name] / t for t in ts] for name, ts in times.items()}
    sec = Section("data", "7. Training data path vs the model's train step, images/s",
                  f"ablations.training.build_datamodule + train_dataloader(), one epoch per call: synthetic "
                  f"CIFAR-shaped data held in memory (uint8, 3x{s.img_size}x{s.img_size}, 10 classes, "
                  f"{s.data_samples} images of which {images[next(iter(loaders))]} in the train split), batch "
                  f"{s.batch}, on the {s.device.upper()}; the model: section 1's ours standard, "
                  f"{s.describe(s.depth)}, {s.mode_text()}, AdamW; {s.reps} rounds x {s.steps} calls, interleaved",
                  ["path", "images/s", "data path / model step [round min-max]", "goal", "mark"])
    for recipe, what in DATA_RECIPES.items():
        ratios = round_ratios(rate, recipe, step)
        ratio = median(ratios)
        sec.rows.append([f"data: recipe={recipe} ({what})", f"{median(rate[recipe]):,.0f}", ratio_cell(ratios),
                         *sec.goal(f"data path recipe={recipe} / model step", ratio, 10.0,
                                   "≥ 10x (≤ 10% of a step)", f"{ratio:.1f}x", at_most=False, rounds=ratios)])
    sec.rows.append([f"{step} ({s.precision})", f"{median(rate[step]):,.0f}", "reference", "", ""])
    dm = datamodules["basic"]
    own = getattr(dm, "max_shift", None), getattr(dm, "hflip", None)
    sec.notes += ["In-memory loaders run in the training process, between steps, not beside them: the data path "
                  "adds its time to every step, so at 10x the model's images/s it costs 10% of the training. "
                  "The ratio is paired per round (images/s of the data path over images/s of the step).",
                  f"The dataset's own augmentation here: random shift {own[0]} px, horizontal flip {own[1]}"
                  + (" (the synthetic set has none: 'basic' is scaling and normalising only; CIFAR-10's is a 4 px "
                     "shift and a flip, cheap batched tensor ops)" if not any(own) else "") + "."]
    sec.data = {"recipes": {r: c.recipe_values() for r, c in configs.items()},
                "images_per_epoch": images, "images_per_s": rate, "times_s": times}
    return sec


# --- 8. the fastest mode per width and token count -----------------------------------------------------------------


def modes_grid(s: Settings) -> list[dict]:
    """The (width, heads, patch, tokens) cells of section 8."""
    from ablations.modes import tokens

    return [{"embed_dim": w, "num_heads": max(2, w // 64), "patch_size": p, "tokens": tokens(s.img_size, p)}
            for w in s.modes_widths for p in s.modes_patches]


def bench_modes(s: Settings) -> Section:
    from ablations.modes import MODE_KEYS, fastest, measure_cell, tokens

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
        size = dict(img_size=s.img_size, patch_size=cell["patch_size"], in_chans=3, num_classes=10,
                    embed_dim=cell["embed_dim"], depth=s.modes_depth, num_heads=cell["num_heads"], mlp_ratio=4.0)
        # each mode's time as the bench trusts it: the reference's median x the mode's paired ratio (a machine
        # whose load changes from round to round moves a raw median much more than an in-round ratio)
        measured = measure_cell(size, s.batch, device=s.device, reps=s.reps, steps=s.steps, warmup=s.warmup)
        times = measured["rounds_s"]
        precision, fused = fastest(measured)  # what ablations.modes.choose_mode answers for this cell
        best = f"{precision}/{'fused' if fused else 'explicit'}"
        cells.append({**cell, **measured, "best": {"precision": precision, "fused_attn": fused}})
        sec.rows.append([str(cell["embed_dim"]), str(cell["num_heads"]), str(cell["tokens"]),
                         ms(measured["median_s"][ref]),
                         *(ratio_cell(round_ratios(times, k, ref)) for k in keys[1:]), best])
    sec.notes += ["A ratio below 1 is faster than fp32 with fused attention (the bench's and timm's default). "
                  "'fastest' is what ablations.modes.choose_mode answers for the cell: the smallest 'times_s' in "
                  "the table this section writes, <out>/modes-<device>.json (each mode's time is the reference's "
                  "median times the mode's paired ratio; 'median_s': the raw medians), except that a bf16 mode must "
                  "be at least 5% faster than the fastest fp32 mode (ablations.modes.BF16_MARGIN).",
                  f"Tokens = (img / patch)² patches + the class token (patch "
                  f"{', '.join(map(str, s.modes_patches))} on {s.img_size}x{s.img_size}: "
                  f"{', '.join(str(tokens(s.img_size, p)) for p in s.modes_patches)})."]
    sec.data = {"device": s.device, "depth": s.modes_depth, "batch": s.batch, "img_size": s.img_size,
                "cells": cells}
    return sec


#: Section 10's models: the study sizes precision auto decides most often (RunConfig fields; batch of the study).
AUTO_SIZES = (
    ("residual_variants default (mnist5k 28x28, patch 7)",
     dict(img_size=28, patch_size=7, in_chans=1, num_classes=10, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0),
     64),
    ("ViT-Tiny width (32x32, patch 4)",
     dict(img_size=32, patch_size=4, in_chans=3, num_classes=10, embed_dim=192, depth=6, num_heads=3, mlp_ratio=4.0),
     32),
)


def bench_auto(s: Settings) -> Section:
    """Precision ``auto`` against both fixed precisions, on this machine, at the study sizes: the mode auto picks
    here (a table matching this machine's signature, else measured on the spot as a training run would) timed
    interleaved with ``32-true`` and ``bf16-mixed`` (both with timm's fused attention, the fixed modes' kernel)."""
    import torch

    from ablations.modes import auto_mode, probe, tokens

    sizes = AUTO_SIZES if s.mode != "tiny" else (("tiny", dict(AUTO_SIZES[0][1], embed_dim=16, depth=1), 8),)
    sec = Section("auto", "10. precision auto vs the fixed precisions",
                  f"ours standard at each size, on the {s.device.upper()}, {torch.get_num_threads()} threads; one "
                  f"train step (forward, cross-entropy, backward, AdamW), {s.reps} rounds x {s.steps} steps "
                  "interleaved; auto = the mode ablations.modes chooses here (its source in the last column)",
                  ["model", "32-true ms/step", "bf16-mixed vs 32-true", "auto's mode", "auto vs 32-true", "goal",
                   "mark", "auto's source"])
    data = []
    with tempfile.TemporaryDirectory() as tmp:  # a measurement made here is this section's alone
        for label, size, batch in sizes:
            count = tokens(size["img_size"], size["patch_size"])
            mode = auto_mode(s.device, size["embed_dim"], count, results_dir=tmp,
                             threads=torch.get_num_threads(), measure=probe(size, batch))
            g = torch.Generator().manual_seed(0)
            x = torch.randn(batch, size["in_chans"], size["img_size"], size["img_size"], generator=g).to(s.device)
            y = torch.randint(0, size["num_classes"], (batch,), generator=g).to(s.device)
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
                     "avx512_bf16/AMX flags, threads, torch) says bf16 is at least 5% faster (ablations.modes).")
    sec.data = {"models": data}
    return sec


def modes_table(meta: dict, sec: Section) -> dict:
    """The machine-readable table of section 8 (``ablations.modes.load_table`` reads it)."""
    d = sec.data
    return {"device": d["device"], "machine": meta["machine"], "started": meta["started"], "mode": meta["mode"],
            "settings": {"depth": d["depth"], "batch": d["batch"], "img_size": d["img_size"], "mlp_ratio": 4.0,
                         "reps": meta["settings"]["reps"], "steps": meta["settings"]["steps"]},
            "cells": [{k: v for k, v in c.items() if k != "rounds_s"} for c in d["cells"]]}


# --- 9. model.compile() --------------------------------------------------------------------------------------------
def bench_compile(s: Settings) -> Section:
    from ablations.costs import default_configs

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

# --- 10. the new designs' overhead ---------------------------------------------------------------------------------
#: issue 27's goals: train-step time vs standard of the designs whose extra work is depth aggregation or n streams
OVERHEAD_GOALS = {"attn_res": 1.3, "hyper_connections": 1.3, "dca": 1.3, "mhc": 1.5, "denseformer": 1.1}


def bench_overhead(s: Settings) -> Section:
    """Each of ``OVERHEAD_GOALS``' variants at its defaults vs standard, interleaved in one run (section 2's
    method at depth ``overhead_depth``, batch ``overhead_batch``): the cost of their implementation, not of their
    FLOPs (each adds ≤ 10 % FLOPs)."""
    from ablations.costs import measure

    size = s.vit(s.overhead_depth)
    labels = ["standard", *OVERHEAD_GOALS]
    models = {label: ours(label, {}, size) for label in labels}
    costs = {label: measure(label, {}, **size) for label in labels}
    batch = random_batch(s, s.overhead_batch)
    times = interleave({k: train_step(m.to(s.device), batch, s.precision) for k, m in models.items()},
                       reps=s.overhead_reps, steps=s.steps, warmup=s.warmup, device=s.device)
    sec = Section("overhead", "11. The new designs' step time vs standard (issue 27)",
                  f"{s.describe(s.overhead_depth, s.overhead_batch)}; {s.mode_text()}, AdamW; {s.overhead_reps} "
                  f"rounds x {s.steps} steps; each variant at its defaults",
                  ["variant", "+FLOPs", "ms/step", "time vs standard [round min-max]", "goal", "mark"])
    base = costs["standard"]["flops"]
    for label in labels:
        row = [label, f"{100.0 * (costs[label]['flops'] - base) / base:+.2f}%", ms(median(times[label]))]
        if label == "standard":
            sec.rows.append(row + ["reference", "", ""])
            continue
        ratios = round_ratios(times, label, "standard")
        ratio, limit = median(ratios), OVERHEAD_GOALS[label]
        sec.rows.append(row + [ratio_cell(ratios), *sec.goal(f"{label} / standard", ratio, limit, f"≤ {limit:.2f}x",
                                                             f"{ratio:.3f}x", rounds=ratios)])
    sec.data = {"ratios": {label: round_ratios(times, label, "standard") for label in OVERHEAD_GOALS},
                "times_s": times, "flops": {label: c["flops"] for label, c in costs.items()}}
    return sec


BENCHES = {"timm": bench_timm, "variants": bench_variants, "lightning": bench_lightning, "mfu": bench_mfu,
           "study": bench_study, "memory": bench_memory, "data": bench_data, "modes": bench_modes,
           "compile": bench_compile, "auto": bench_auto, "overhead": bench_overhead}


# --- report --------------------------------------------------------------------------------------------------------
def machine_facts(threads: int) -> dict:
    import lightning
    import timm
    import torch

    from ablations.modes import cpu_facts

    cpu, flags = cpu_facts()
    return {"cpu": cpu, "cpu_flags": flags, "logical_cores": os.cpu_count(), "threads": threads,
            "torch": torch.__version__, "timm": timm.__version__, "lightning": lightning.__version__,
            "python": platform.python_version(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "loadavg_start": list(os.getloadavg())}


def render(meta: dict, sections: list[Section]) -> str:
    m = meta["machine"]
    cores = m["logical_cores"] or 1  # others running at the start, or far more than our own threads at the end
    busy = m["loadavg_start"][0] > 0.5 * cores or m["loadavg_end"][0] > m["threads"] + 0.5 * cores
    out = ["# Benchmark: ViT backbone and its residual variants", "",
           f"Mode **{meta['mode']}**" + (" (small sizes: not the reference figures)" if meta["mode"] != "full" else "")
           + f" on the **{meta.get('device', 'cpu').upper()}**"
           + f"; sections {', '.join(s.name for s in sections)}; {meta['started']}; wall {meta['wall_s']:.0f} s. "
           "Generated by `python -m ablations.bench`; method in its docstring (interleaved rounds, medians, "
           "paired ratios, warm-up excluded). A ratio's brackets hold the smallest and largest per-round ratio; "
           "'(k/n rounds)' counts the rounds in which a goal held: a goal met in some rounds and missed in others "
           "is within this machine's timing noise.", "",
           "## Machine", "",
           table(["fact", "value"], [
               ["CPU", f"{m['cpu']} ({m['logical_cores']} logical cores; {', '.join(m['cpu_flags']) or 'no flags read'})"],
               ["threads", f"{m['threads']} (torch.set_num_threads)"],
               ["torch / timm / lightning / Python", f"{m['torch']} / {m['timm']} / {m['lightning']} / {m['python']}"],
               ["CUDA", (f"{m['cuda']} (the timed device)" if meta.get("device") == "cuda" else
                         f"{m['cuda']} (not used: --device cpu)") if m["cuda"] else "none"],
               ["load average (1 min) at start / end", f"{m['loadavg_start'][0]:.2f} / {m['loadavg_end'][0]:.2f}"
                + (" — **busy machine: timings are noise**" if busy else "")]]), "",
           "## Goals", "",
           table(["section", "measure", "result", "goal", "mark"],
                 [[s.title.split(" ", 1)[0].rstrip("."), g["what"], g["result"], g["goal"], goal_mark(g)]
                  for s in sections for g in s.goals]
                 + [[s.title.split(" ", 1)[0].rstrip("."), "section failed", s.error or "", "", "**miss**"]
                    for s in sections if s.error])]
    for s in sections:
        out += ["", f"## {s.title}", "", f"Setup: {s.setup}.", ""]
        out += [f"**Error:** `{s.error}`"] if s.error else [table(s.columns, s.rows)]
        if s.notes and not s.error:
            out += [""] + [f"- {note}" for note in s.notes]
        out += ["", f"Section wall time: {s.wall_s:.0f} s."]
    return "\n".join(out) + "\n"


def to_json(meta: dict, sections: list[Section]) -> dict:
    return {"meta": meta, "sections": {s.name: {"title": s.title, "setup": s.setup, "passed": s.passed,
                                                 "goals": s.goals, "error": s.error, "wall_s": s.wall_s,
                                                 "data": s.data} for s in sections}}


def write_results(out: Path, meta: dict, sections: list, start: float) -> None:
    meta["machine"]["loadavg_end"] = list(os.getloadavg())
    meta["wall_s"] = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(render(meta, sections))
    (out / "bench.json").write_text(json.dumps(to_json(meta, sections), indent=1, default=str) + "\n")
    for sec in sections:
        if sec.name == "modes" and not sec.error:
            table_json = json.dumps(modes_table(meta, sec), indent=1, default=str)
            (out / f"modes-{meta['device']}.json").write_text(table_json + "\n")


# --- CLI -----------------------------------------------------------------------------------------------------------
def parse_sections(text: str) -> list[str]:
    chosen = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        name = SECTIONS[int(item) - 1] if item.isdigit() and 1 <= int(item) <= len(SECTIONS) else item
        if name not in SECTIONS:
            raise argparse.ArgumentTypeError(f"unknown section '{item}'; valid: {', '.join(SECTIONS)} "
                                             f"(or 1-{len(SECTIONS)})")
        chosen.append(name)
    return chosen


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m ablations.bench", description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--quick", action="store_true", help="small sizes and fewer rounds (every section still runs)")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the test's sizes: seconds, meaningless
    p.add_argument("--out", default=layout.RESULTS_DIR,
                   help=f"folder for bench.md and bench.json (default: {layout.RESULTS_DIR})")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's own, the physical cores)")
    p.add_argument("--sections", type=parse_sections, help=f"comma-separated subset of {', '.join(SECTIONS)} "
                   f"(or numbers 1-{len(SECTIONS)}); default: all but compile")
    p.add_argument("--compile", action="store_true", help="also measure model.compile() (section 9)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where models and batches live and steps are timed (default: cpu); cuda times the train "
                        "steps in bf16 autocast with fused attention and synchronises after every timed call")
    p.add_argument("--variants", metavar="LABEL,...",
                   help="sections 2 and 6: only these labels of ablations.costs.all_configs() (standard, their "
                        "reference, is always included); default: all")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads is not None and args.threads < 1:
        build_parser().error(f"--threads must be >= 1, got {args.threads}")
    settings = replace(TINY if args.tiny else QUICK if args.quick else FULL, device=args.device)
    names = args.sections or list(DEFAULT_SECTIONS)
    if args.compile and "compile" not in names:
        names.append("compile")

    import lightning.pytorch  # noqa: F401  (imported first: it resets its loggers' level on import)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        build_parser().error("--device cuda: torch.cuda.is_available() is False (no CUDA device, or a CPU-only "
                             "torch build)")
    if args.variants is not None:
        from ablations.costs import all_configs

        try:
            settings = replace(settings, variants=parse_variants(args.variants, [c[0] for c in all_configs()]))
        except argparse.ArgumentTypeError as exc:
            build_parser().error(f"--variants: {exc}")

    for name in ("lightning.pytorch", "lightning.fabric"):  # "GPU available: ...", tips, "max_steps reached"
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in (".*validation_step.* no .val_dataloader", ".*treespec", ".*does not have many workers"):
        warnings.filterwarnings("ignore", message=message)  # section 3 runs no validation on purpose
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    meta = {"mode": settings.mode, "device": settings.device, "settings": asdict(settings),
            "machine": machine_facts(threads),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "sections": names}
    start = time.perf_counter()
    load = meta["machine"]["loadavg_start"][0]
    print(f"bench ({settings.mode}, {settings.device}): {', '.join(names)} on {threads} threads; "
          f"load average {load:.2f}"
          + (" — the machine is busy: timings will be noise (and with more threads than free cores, very slow)"
             if load > 0.5 * (os.cpu_count() or 1) else ""), file=sys.stderr)
    sections = []
    for name in names:
        t0 = time.perf_counter()
        try:
            sec = BENCHES[name](settings)
        except Exception as exc:  # report the failure and go on with the other sections
            traceback.print_exc()
            sec = Section(name, f"{SECTIONS.index(name) + 1}. {name}", "—", [], error=f"{type(exc).__name__}: {exc}")
        sec.wall_s = time.perf_counter() - t0
        torch.set_num_threads(threads)
        sections.append(sec)
        print(f"\n## {sec.title}  ({sec.wall_s:.0f} s)\n" + (f"ERROR {sec.error}" if sec.error else
                                                               table(sec.columns, sec.rows)), flush=True)
        write_results(Path(args.out), meta, sections, start)  # after every section: a crash keeps what ran
    out = Path(args.out)
    passed = sum(g["passed"] for s in sections for g in s.goals)
    total = sum(len(s.goals) for s in sections)
    written = [out / "bench.md", out / "bench.json"]
    if any(s.name == "modes" and not s.error for s in sections):
        written.append(out / f"modes-{settings.device}.json")
    print(f"\n{passed}/{total} goals met; wrote {', '.join(map(str, written))} ({meta['wall_s']:.0f} s)",
          file=sys.stderr)
    return 1 if any(s.error for s in sections) else 0


if __name__ == "__main__":
    raise SystemExit(main())
