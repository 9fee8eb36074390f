"""Loop sections: Lightning's loop vs a plain PyTorch loop (3), study throughput (5) and the data path (7)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ablations.config import RunConfig
from ablations.run.objective import Objective
from ablations.run.plan import estimate_seconds
from ablations.studies.spec import load_spec
from ablations.training import build_datamodule, build_model, deterministic_without_nan_fill, mixup_options

from ..machine.timing import interleave, median, round_ratios, train_step
from .harness import STUDY, Sampled, Section, Settings, ms, ours, random_batch, ratio_cell, runs_of, study_trial

# Imported where they are used, not here: torch, Lightning, Optuna and the datasets (data: torch). Each takes from a
# tenth of a second to seconds to import, and the command-line tools start without them.

# --- 3. Lightning loop vs a plain loop -----------------------------------------------------------------------------
LOOPS = ("plain PyTorch", "Lightning, ViTClassifier", "Lightning, bare module")


def lightning_times(s: Settings) -> dict:
    """Section 3's measurement in this process: each loop of ``LOOPS`` run for ``loop_steps`` and for 0 optimizer
    steps in ``loop_reps`` interleaved rounds; the rounds' times, the per-step times (paired per round) and the
    trial config (JSON: a child returns it)."""
    _, config = study_trial(s)
    dm = build_datamodule(config)
    loader = dm.train_dataloader()
    classifier = build_model(config, dm)
    classifier.hparams.steps_per_epoch = len(loader)  # the schedule needs no Trainer: same in every loop
    dev, precision = s.device, s.precision
    makers = dict(zip(LOOPS, (
        lambda n: plain_loop(copy.deepcopy(classifier), loader, n, dev, precision),
        lambda n: lightning_loop(copy.deepcopy(classifier), loader, n, dev, precision),
        lambda n: lightning_loop(bare_module(copy.deepcopy(classifier)), loader, n, dev, precision)), strict=True))
    loops = {f"{name} x{n}": make(n) for name, make in makers.items() for n in (s.loop_steps, 0)}
    with preserved_torch_state():  # the Trainer turns deterministic algorithms on: both loops run under them
        times = interleave(loops, reps=s.loop_reps, steps=1, warmup=1, device=s.device)
    per_step = {name: [(a - b) / s.loop_steps for a, b in zip(times[f"{name} x{s.loop_steps}"], times[f"{name} x0"],
                                                              strict=True)] for name in makers}
    return {"times_s": times, "per_step_s": per_step, "config": config.to_dict()}


def bench_lightning(s: Settings) -> Section:
    """``LOOPS`` against each other (``lightning_times``), in this process or in ``s.processes`` fresh ones
    (``runs_of``, ``Sampled``: a ratio is then the median of the processes' median ratios)."""
    sampled = Sampled(runs_of(s, "lightning", lightning_times))
    c = sampled.runs[0]["config"]
    sec = Section("lightning", "3. Lightning training loop vs a plain PyTorch loop",
                  f"the {STUDY} trial model ({c['dataset']}, embed {c['embed_dim']}, depth {c['depth']}, "
                  f"{c['num_heads']} heads, patch {c['patch_size']}, batch {c['batch_size']}); "
                  f"{s.mode_text('attention as in the trial config')}; AdamW + "
                  f"warmup-cosine LambdaLR from ViTClassifier.configure_optimizers, label smoothing "
                  f"{c['label_smoothing']}; Lightning deterministic as in a trial (without the NaN fill of new "
                  f"tensors); no logger, progress bar, checkpointing or validation; each loop run for "
                  f"{s.loop_steps} and for 0 optimizer steps, {sampled.how(f'{s.loop_reps} rounds')}",
                  ["loop", "set-up ms", "ms/step", f"per step vs plain {sampled.bracket()}", "goal", "mark"])
    for name in LOOPS:
        row = [name, ms(sampled.median("times_s", f"{name} x0")), ms(sampled.median("per_step_s", name))]
        if name == "plain PyTorch":
            sec.rows.append(row + ["reference", "", ""])
            continue
        ratios = sampled.ratios("per_step_s", name, "plain PyTorch")
        ratio = median(ratios)
        cells = (sec.goal(f"{name} / plain, per step", ratio, 1.05, "≤ 1.05x", f"{ratio:.3f}x", rounds=ratios,
                          unit=sampled.unit) if "ViTClassifier" in name else ["(loop alone)", "—"])
        sec.rows.append(row + [ratio_cell(ratios), *cells])
    sec.notes += ["set-up = a loop run for 0 steps (optimizer and scheduler, plus the Trainer and fit set-up for "
                  f"Lightning); ms/step = (time of {s.loop_steps} steps - set-up) / {s.loop_steps}, paired per round.",
                  "'bare module' is a LightningModule whose training_step only computes the loss: the gap from it to "
                  "the plain loop is Lightning's loop, the gap from it to ViTClassifier is the module's per-step "
                  "metrics and logging. The trial model's step is small (few tokens), so fixed per-step costs weigh "
                  "more here than at ViT-Tiny width.", *sampled.notes()]
    sec.data = {"steps": s.loop_steps, "config": c} | sampled.data("times_s", "per_step_s")
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


# --- 5. study throughput -------------------------------------------------------------------------------------------
def bench_study(s: Settings) -> Section:
    import optuna

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


# --- 7. the data path ---------------------------------------------------------------------------------------------
DATA_RECIPES = {"basic": "the dataset's own crop/flip", "paper": "+ RandAugment 9/5, ColorJitter, random erasing, "
                "Mixup/CutMix"}


def data_configs(s: Settings) -> dict:
    """The RunConfig of each recipe whose training data path section 7 times: a CIFAR-shaped synthetic set (32x32,
    3 channels, uint8, 10 classes) held in memory, at the bench's batch, on the bench's device."""
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
