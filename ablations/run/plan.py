"""What a study would cost before it runs (``--dry-run``): trials left, the time on this machine (measured rates or a
FLOP-based estimate) and the GPU-hours on a named GPU class."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from pathlib import Path

import optuna
from optuna.trial import TrialState

import data
import lit_modules

from .. import layout
from ..machine import timing
from ..machine.modes import choose_mode, measured_step, tokens
from ..pricing.engine import engine_lines
from ..pricing.gpu_hours import DEFAULT_GPU, describe_estimate, estimate, forward_flops, recipe_line, training_flops
from ..report.load import own_seconds
from ..studies.spec import TUNE_EXTRA, tune_name
from ..studies.storage import redact, sqlite_path
from ..training import with_mode
from .durations import duration_text
from .kept_modes import completed, keep_mode, kept_for, kept_lines, kept_modes
from .later import say_later_stages
from .study import Stored, done_trials, grid_keys, point_key, trial_point
from .workers import quiet

# torch (about 1.7 s, measured with python -X importtime) is imported where a model is timed (--measure), and the
# models and datasets (lit_modules, data: lazy packages that load torch and Lightning on first use) are reached
# through their packages, so that --help and --list answer without them.

#: Seconds per trial not proportional to FLOPs (Trainer set-up, data, logging) and effective train-step
#: GFLOP/s of this 2-core CPU for the small default models; calibrated on the residual_variants default run
#: (25 GFLOP/s when the FLOP count left out the MLP ratio and priced its mlp_ratio 2.0 at 4.0, 1.45x too many
#: FLOPs; 25 / 1.45 gives that run the same estimate with the true count).
TRIAL_OVERHEAD_S = 3.0
EFFECTIVE_GFLOPS = 17.2
#: ``--dry-run --measure``: rounds x timed steps (after one warm-up) of each model and its standard twin,
#: interleaved, at the run's batch capped here
FACTOR_REPS, FACTOR_STEPS, FACTOR_MAX_BATCH = 3, 2, 64


def stored_done(url: str, study_name: str, spec) -> Stored | None:
    """What the study stored at ``url`` has done (:class:`Stored`), for a dry run's "what is left": None when
    nothing is stored yet (a SQLite file that does not exist is not created) or the storage cannot be read (the dry
    run then prices the whole study)."""
    path = sqlite_path(url)
    if path is not None and not path.is_file():
        return None
    stages = ([(tune_name(study_name), spec.tune_stage())] if spec.tune is not None else []) + [(study_name, spec)]
    tally = _Tally()
    quiet()
    try:
        for name, stage in stages:
            tally.add(spec, stage, _stored_study(name, url))
    except Exception:  # noqa: BLE001 - a dry run never fails on the storage: it just cannot say what is done
        return None
    return tally.stored(redact(url))


def _stored_study(name: str, url: str):
    """The study ``name`` stored at ``url``; None when there is none yet."""
    try:
        return optuna.load_study(study_name=name, storage=url)
    except KeyError:
        return None


@dataclasses.dataclass
class _Tally:
    """What the stages of a stored study have done, added stage by stage (:func:`stored_done`): trials done per
    stage, the grid points left and done, the mode facts and the wall times of their completed trials."""

    done: list[int] = dataclasses.field(default_factory=list)
    left: list[dict] = dataclasses.field(default_factory=list)
    modes: list[dict] = dataclasses.field(default_factory=list)
    finished: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    seconds: dict[tuple[str, int | None], list[float]] = dataclasses.field(default_factory=dict)

    def add(self, spec, stage, study) -> None:
        """One stage of ``spec`` and its stored ``study`` (None: not stored yet, so all its points are left)."""
        if study is None:
            self.done.append(0)
            self.left += stage.grid() if stage.kind == "grid" else []
            return
        if stage.stage == "tune":  # with the rates it has added beyond its grid's edges
            stage = spec.tune_stage(study.user_attrs.get(TUNE_EXTRA) or {})
        trials = done_trials(study)
        self.modes += completed(trials)
        if stage.kind != "grid":
            self.done.append(len(trials))
            return
        here = {point_key(trial_point(t)) for t in trials}
        self.done.append(len(here & grid_keys(stage)))  # what count_done counts, from the same trials
        self.left += [p for p in stage.grid() if point_key(p) not in here]
        self.finished |= {(stage.stage, key) for key in here}
        for t in trials:
            params, wall = trial_point(t), own_seconds(t.user_attrs)  # a stacked trial: its share
            if t.state == TrialState.COMPLETE and wall is not None and "variant" in params:
                self.seconds.setdefault((params["variant"], params.get("depth")), []).append(float(wall))

    def stored(self, where: str) -> Stored | None:
        """What is stored at ``where``; None when no stage has done anything."""
        tune_done, report_done = self.done if len(self.done) == 2 else (0, self.done[0])
        if not tune_done and not report_done:
            return None
        return Stored(tune_done, report_done, where, self.seconds, tuple(self.left), tuple(self.modes),
                      frozenset(self.finished))


def measured_left(stored: Stored, workers: int, fallback_s: float,
                  estimates: dict[tuple[str, int | None], float] | None = None) -> str | None:
    """The time a stored grid study has left, priced from its own completed trials: each point not done yet at the
    median wall time of its (variant, depth) cell's completed trials (either stage: the learning rate does not
    change a trial's cost); a cell without any at its estimate in ``estimates`` (the FLOP estimate, or
    ``--measure``'s) times the ratio of measured to estimated time of the measured cells at its depth (their
    median), so that a depth whose trials run slower than their FLOPs say prices its other rows so too; a cell
    with no estimate at ``fallback_s``. The sum is divided by ``workers``. None without measured cells."""
    if not stored.seconds or not stored.left:
        return None
    estimates = estimates or {}
    median = {cell: statistics.median(times) for cell, times in stored.seconds.items()}
    ratio = {depth: statistics.median(r) for depth, r in _ratios(stored, estimates).items()}

    def basis(cell) -> str:
        """How a cell is priced: its measured trials, its estimate scaled at its depth, its own estimate, the fallback."""
        if cell in median:
            return "measured"
        if cell in estimates:
            return "scaled" if cell[1] in ratio else "own"
        return "fallback"

    price = {"measured": lambda c: median[c], "scaled": lambda c: estimates[c] * ratio[c[1]],
             "own": lambda c: estimates[c], "fallback": lambda c: fallback_s}
    cells = [(p.get("variant"), p.get("depth")) for p in stored.left]
    bases = [basis(cell) for cell in cells]
    total = sum(price[b](cell) for cell, b in zip(cells, bases, strict=True)) / workers
    count = {b: bases.count(b) for b in price}
    named = ", ".join(f"{variant}{'' if depth is None else f' d{depth}'} {duration_text(s)}"
                      for (variant, depth), s in sorted(median.items(), key=lambda kv: (str(kv[0][1]), kv[0][0])))
    depths = sorted(ratio.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
    scaling = (f"{count['scaled']} at their estimate x the measured / estimated time of the measured cells at their "
               "depth (" + ", ".join(f"{'' if d is None else f'd{d} '}{r:.2f}x" for d, r in depths) + "), "
               if count["scaled"] else "") + (f"{count['own']} at their own estimate, " if count["own"] else "")
    return (f"time left as measured by this study's completed trials: {duration_text(total)} ({len(cells)} trials, "
            f"{count['measured']} priced at their cell's median wall time, {scaling}{count['fallback']} at the "
            f"estimate above; {workers} worker(s)); median per cell: {named}")


def _ratios(stored: Stored, estimates: dict) -> dict:
    """Per depth, the measured / estimated time of each measured cell that has an estimate (its median trial)."""
    by_depth: dict = {}
    for (variant, depth), times in stored.seconds.items():
        if estimates.get((variant, depth)):
            by_depth.setdefault(depth, []).append(statistics.median(times) / estimates[(variant, depth)])
    return by_depth


def measured_factor(stored: Stored | None, estimates: dict | None) -> float | None:
    """The median measured / estimated time over a stored study's measured cells (None without any): what the
    later stages' price is scaled by."""
    ratios = [r for rs in _ratios(stored, estimates or {}).values() for r in rs] if stored else []
    return statistics.median(ratios) if ratios else None


def dry_run(spec, overrides: dict, gpu: str = DEFAULT_GPU, results_dir: Path = Path(layout.RESULTS_DIR),
            workers: int = 1, stored: Stored | None = None, measure: bool = False, stack: int | None = None,
            retrain_modes: tuple[str, ...] = (), import_runs: Path | None = None, until: str | None = None) -> int:
    """Print the grid (or search space), the recipe, the estimated time on this machine with ``workers`` workers
    (:func:`estimate_seconds`) and the GPU-hours on class ``gpu`` (:mod:`ablations.pricing.gpu_hours`; measurements read
    from ``<results_dir>/device``). ``stored`` (:func:`stored_done`): the trials a stored study has done, which
    the estimate leaves out (a run resumes with the rest). ``measure`` (``--measure``): each model's train step is
    timed beside its standard twin's (:func:`model_factors`, seconds per model) and each trial priced at its twin's
    estimate times that factor (its fixed per-trial overhead once). Trains nothing. The GPU-hours estimate stays
    FLOP-based; a grid's engine line prices its stacks (of at most ``stack`` trials) from a measured stacked GPU
    step (:mod:`ablations.pricing.engine`). ``until`` (``--until``): the stage the run stops after, said in one
    line (the lines below price every stage)."""
    tune = _say_tuning(spec)
    tune_size = tune.size if tune is not None else 0
    _say_study(spec, stored, tune_size)
    points = _say_points(spec)
    configs = [spec.run_config(p, overrides) for p in points]
    _say_recipe(configs, overrides, results_dir)
    threads = overrides.get("threads") or max(1, (os.cpu_count() or 1) // workers)
    kept = kept_modes(stored.modes, retrain_modes) if stored is not None else {}  # a continued study's mode
    _say(kept_lines(kept, configs, results_dir, threads))
    rates = [measured_rate(config, threads, results_dir, kept_for(config, kept)) for config in configs]
    seconds, cells = (_measured_seconds(points, configs, kept, rates, threads, results_dir) if measure
                      else _flop_seconds(points, configs, rates))
    per_trial = sum(seconds) / len(seconds)
    trials = spec.size + tune_size
    print(_time_line(stored, trials, tune_size, per_trial, rates, workers, threads))
    if stored and (line := measured_left(stored, workers, per_trial, cells)):
        print(line)
    factor = measured_factor(stored, cells)
    say_later_stages(spec, import_runs, per_trial * (factor or 1.0), workers, factor,
                      stored.seconds if stored else None)
    if until is not None:
        print(UNTIL_LINES[until])
    _say(describe_estimate(estimate(configs, trials, gpu, results_dir)))
    if spec.kind == "grid":  # the engine's price on a GPU, from a measured stacked step (ablations.pricing.engine)
        tuning = [tune.run_config(p, overrides) for p in tune.grid()] if tune_size else []
        _say(engine_lines(configs + tuning, gpu, results_dir, stack or 32))
    return 0


#: the dry run's line for each ``--until`` stage
UNTIL_LINES = {
    "tune": "--until tune: the run stops after the tuning stage; the reported grid (priced above with it), its "
            "contending rates and a second look are left to the same command without --until",
    "report": "--until report: the run stops after the reported grid; its contending rates and a second look are "
              "left to the same command without --until",
    "contend": "--until contend: the run stops after the contending rates; a second look is left to the same "
               "command without --until",
}


def _say(lines) -> None:
    """Print each of ``lines``."""
    for line in lines:
        print(line)


def _say_tuning(spec):
    """The tuning stage, when the study has one: its trials, how it extends at its edges, and how the reported
    grid's rates are chosen. Returns the stage (None without one)."""
    if spec.tune is None:
        return None
    tune = spec.tune_stage()
    extend = (f"; while a cell's best lr is at the edge of the rates tried, one more (x2 or /2) within "
              f"{list(spec.tune.bounds)}, {len(spec.tune.seeds)} trials each" if spec.tune.bounds else "")
    print(f"tuning stage {tune.study_name}: {tune.size} trials first (each variant x "
          + "".join(f"{a} {v} x " for a, v in tune.axes.items() if a not in ("seed", "lr"))
          + f"lr {list(spec.tune.lr)} x tuning seeds {list(spec.tune.seeds)}{extend}); each variant's lr = the "
          f"highest mean {spec.tune.metric}; the reported grid below then trains at it")
    return tune


def _say_study(spec, stored: Stored | None, tune_size: int) -> None:
    """The study's kind, size and metric, its resolved base, and what its storage has done already."""
    print(f"study {spec.study_name}: {spec.kind}, {spec.size} trials, metric {spec.metric} ({spec.direction})")
    print("base (resolved): " + ", ".join(f"{k}={v}" for k, v in spec.base.items()))
    if stored:
        print(f"stored in {stored.where}: {stored.report_done} of the {spec.size} reported trials done"
              + (f" and {stored.tune_done} of the {tune_size} tuning trials" if tune_size else "")
              + "; a run continues with the rest")


def _say_points(spec) -> list[dict]:
    """A grid's points, or a search's space and pruner; returns the points priced (a search: one per variant)."""
    if spec.kind == "grid":
        points = spec.grid()
        for params in points:
            print("  " + ", ".join(f"{k}={v}" for k, v in params.items()))
        return points
    for label, space in spec.space.items():
        print(f"  {label}: " + "; ".join(f"{k} ~ {v}" for k, v in space.items()))
    print(f"  pruner: {spec.pruner}")
    return [{"variant": v.label} for v in spec.variants]


def _say_recipe(configs: list, overrides: dict, results_dir: Path) -> None:
    """The training recipe of the first point (and the others' where they differ), and its precision here."""
    names = sorted({c.recipe for c in configs})
    print(recipe_line(configs[0]) + (f" (first point; the points use recipes {', '.join(names)})"
                                     if len(names) > 1 else ""))
    print(_auto_line(configs[0], overrides, results_dir))


def _measured_seconds(points: list[dict], configs: list, kept: dict, rates: list, threads: int,
                      results_dir: Path) -> tuple[list[float], dict]:
    """``--measure``: each point's seconds per trial at its standard twin's estimate times its model's measured
    factor (:func:`model_factors`, in the study's ``kept`` mode; the fixed overhead once), by point and by (variant,
    depth) cell; one line says what was timed."""
    factors = model_factors([keep_mode(c, kept) for c in configs], threads, results_dir)
    seconds = [TRIAL_OVERHEAD_S + (estimate_seconds(standard_twin(config), rate[0] if rate else None)
                                   - TRIAL_OVERHEAD_S) * factor
               for config, rate, factor in zip(configs, rates, factors, strict=True)]
    timed = {}
    for p, config, factor in zip(points, configs, factors, strict=True):
        if config.residual != "standard":
            timed.setdefault(p["variant"] + ("" if p.get("depth") is None else f" d{p['depth']}"), factor)
    print(f"measured here (--measure: each model's train step beside its standard twin, {FACTOR_REPS} rounds x "
          f"{FACTOR_STEPS} steps, {threads} thread(s)): "
          + (", ".join(f"{label} {factor:.2f}x" for label, factor in timed.items()) or "only standard models")
          + "; each trial is priced at its twin's estimate x that factor (the fixed per-trial overhead once)")
    return seconds, _by_cell(points, seconds)


def _by_cell(points: list[dict], seconds: list[float]) -> dict:
    """Each point's seconds keyed by its (variant, depth) cell (a cell's points cost the same)."""
    return {(p.get("variant"), p.get("depth")): sec for p, sec in zip(points, seconds, strict=True)}


def _flop_seconds(points: list[dict], configs: list, rates: list) -> tuple[list[float], dict]:
    """Each point's seconds per trial from its FLOPs (:func:`estimate_seconds`) at this CPU's measured rate where
    there is one, by point and by (variant, depth) cell; where a model is not standard, one line says how far its
    price may be off."""
    if any(config.residual != "standard" for config in configs):
        print("(the estimate prices every model at standard's FLOP rate; multi-stream and depth-aggregating "
              "residuals run up to 3x slower per FLOP at small sizes: add --measure to time each model here)")
    seconds = [estimate_seconds(c, rate[0] if rate else None) for c, rate in zip(configs, rates, strict=True)]
    return seconds, _by_cell(points, seconds)


def _time_line(stored: Stored | None, trials: int, tune_size: int, per_trial: float, rates: list, workers: int,
               threads: int) -> str:
    """The estimated time on this machine of the trials left, and what it rests on."""
    tune_done, report_done = (stored.tune_done, stored.report_done) if stored else (0, 0)
    left = trials - report_done - tune_done
    count = f"{left} of {trials} trials left" if stored else f"{trials} trials" if tune_size else ""
    count += " with the tuning stage" if count and tune_size else ""
    measured = [rate for rate in rates if rate]
    basis = (f"this CPU's measured train step ({measured[0][1]}) at {measured[0][0] / 1e9:.3g} GFLOP/s"
             if len(measured) == len(rates) else
             f"a rough FLOP-based estimate at {EFFECTIVE_GFLOPS:.0f} GFLOP/s (no measured train step of this CPU "
             "for every cell yet: a run measures them first)")
    return (f"estimated time on this machine: {duration_text(per_trial * left / workers)} "
            f"({duration_text(per_trial)} per trial" + (f", {count}" if count else "")
            + f"; {workers} worker(s) x {threads} thread(s); {basis}, + {TRIAL_OVERHEAD_S:.0f} s per trial)")


def standard_twin(config):
    """``config`` with the standard residual (same size, data, epochs): the model the FLOP estimate is calibrated on."""
    return dataclasses.replace(config, residual="standard", residual_options={})


def model_factors(configs: list, threads: int, results_dir: Path) -> list[float]:
    """For each config (``--dry-run --measure``): its model's train-step time over its standard twin's
    (:func:`standard_twin`), both timed on this CPU on ``threads`` threads, interleaved (:mod:`ablations.machine.timing`:
    :data:`FACTOR_REPS` rounds of :data:`FACTOR_STEPS` steps after a warm-up, the median per-round ratio), on a random
    batch of the run's shape (batch capped at :data:`FACTOR_MAX_BATCH`) in the precision and attention kernel the
    run would use (``auto``: this CPU's cached choice, else the fp32 rule; nothing is measured for the modes
    table). 1.0 for a standard model (its FLOPs are what the estimate counts). Each distinct model is timed once.
    Multi-stream and depth-aggregating residuals add many small operations per site, which cost more than their
    FLOPs at the studies' sizes (Hyper-Connections and mHC 1.3-3x a standard step at width 64)."""
    import torch

    factors: dict[str, float] = {}
    out = []
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            for config in configs:
                if config.residual == "standard":
                    out.append(1.0)
                    continue
                shape = data.dataset_shape(config)
                key = json.dumps(config.model_config(shape).to_dict(), sort_keys=True, default=str)
                if key not in factors:
                    count = tokens(shape["img_size"], config.patch_size or shape["patch_size"])
                    trained = config if config.precision != "auto" else with_mode(config, choose_mode(
                        "cpu", config.embed_dim, count, results_dir=results_dir, threads=threads))  # as training does
                    precision = trained.precision if trained.precision in ("32-true", "bf16-mixed") else "32-true"
                    batch = timing.image_batch(min(config.batch_size, FACTOR_MAX_BATCH), shape["in_chans"],
                                        shape["img_size"], shape["num_classes"])
                    fns = {name: timing.train_step(lit_modules.VisionTransformer(c.model_config(shape), init_seed=0),
                                                   batch, precision)
                           for name, c in (("model", trained), ("standard", standard_twin(trained)))}
                    times = timing.interleave(fns, reps=FACTOR_REPS, steps=FACTOR_STEPS, warmup=1, device="cpu")
                    factors[key] = timing.median(timing.round_ratios(times, "model", "standard"))
                out.append(factors[key])
    finally:
        torch.set_num_threads(previous)
    return out


def _auto_line(config, overrides: dict, results_dir: Path) -> str:
    """What precision ``auto`` will train the (first) point in on this machine's CPU: a table or cache that matches
    this CPU's signature, or a measurement the study makes before its first trial."""
    if config.precision != "auto":
        return f"precision: {config.precision} (fixed by the study)"
    shape = data.dataset_shape(config)
    count = tokens(shape["img_size"], config.patch_size or shape["patch_size"])
    threads = overrides.get("threads") or os.cpu_count() or 1
    mode = choose_mode("cpu", config.embed_dim, count, results_dir=results_dir, threads=threads)
    if mode.source.startswith("rule:"):
        return (f"precision auto on this CPU ({threads} thread(s)): no table matches this CPU; the run measures the "
                "four modes of each model size first (seconds) and caches them under "
                f"{layout.device_dir(results_dir)}")
    return f"precision auto on this CPU ({threads} thread(s)): {mode.key} ({mode.source})"


def estimate_seconds(config, flops_per_s: float | None = None) -> float:
    """Wall time of one trial on this machine: its training FLOPs (3× forward per training image, 1× per val and
    test image, × epochs: :func:`ablations.pricing.gpu_hours.training_flops`) at ``flops_per_s`` (:func:`measured_rate`;
    default the rough calibrated :data:`EFFECTIVE_GFLOPS`), plus a fixed per-trial overhead."""
    return TRIAL_OVERHEAD_S + training_flops(config) / (flops_per_s or EFFECTIVE_GFLOPS * 1e9)


def measured_rate(config, threads: int, results_dir: Path, mode=None) -> tuple[float, str] | None:
    """(training FLOP/s, where) of this CPU for ``config``'s cell on ``threads`` threads, from the train step that
    precision ``auto`` measured and cached (:func:`ablations.machine.modes.measured_step`: a ``standard`` model of the
    probe's depth, MLP ratio and batch, 3× its forward FLOPs per image); None for a GPU run, a fixed precision, or
    a cell not measured yet. ``mode``: the mode the run trains in where it is not ``auto``'s (a study's kept mode,
    :mod:`.kept_modes`)."""
    if config.precision != "auto" or config.accelerator not in ("auto", "cpu"):
        return None
    shape = data.dataset_shape(config)
    step = measured_step(config.embed_dim, tokens(shape["img_size"], config.patch_size or shape["patch_size"]),
                         threads=threads, results_dir=results_dir, mode=mode)
    if step is None:
        return None
    probe = dataclasses.replace(config, residual="standard", residual_options={}, depth=step["depth"],
                                mlp_ratio=step["mlp_ratio"])
    return 3 * forward_flops(probe, shape) * step["batch"] / step["seconds"], f"{step['mode']}, {step['path']}"
