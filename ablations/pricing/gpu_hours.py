"""GPU-hours of a study on a named GPU class, for ``python -m ablations.run --study NAME --dry-run --gpu CLASS``.

Per trial, the training FLOPs are the forward FLOPs of one image (:func:`forward_flops`: ``ablations.costs.measure``,
batch 1, explicit attention, matrix products only) × epochs × (3 × training images + 1 × validation images): a
training image costs a forward and a backward (≈ two forwards), a validation image one forward. The time is those
FLOPs divided by an effective rate, the class's dense peak for the trial's precision × an MFU. The study's total is
the mean over its points × its number of trials, on one GPU per trial (N workers on N GPUs divide the wall time,
not the GPU-hours).

The MFU comes from the first of these that exists (:func:`choose_basis`), and the printout names it:

0. the engine's training step of the paper recipe's model measured on a GPU of the same class and precision (section
   14 of ``python -m ablations.bench --device cuda``: one CUDA graph per step, as a study on a GPU trains);
1. a training run measured on a GPU of the same class and precision: the 2-epoch run of ``scripts/device_check.py``
   (``<results>/device/<device>/device_check.json``). Its images/s × its forward FLOPs × 3 is the training FLOP rate
   it reached; every trial runs at that FLOP rate, i.e. at the measured images/s scaled by the FLOP ratio between
   the measured config and the trial's;
2. the benchmark's MFU section measured on a GPU of the same class and precision (``python -m ablations.bench
   --device cuda``: ``<results>/device/**/bench.json``), its train-step FLOP rate;
3. either of them measured on another class: its MFU (reached rate / that class's peak), applied to this class's peak;
4. :data:`ASSUMED_MFU`.

Newer measurements win within a rung. Nothing here imports torch until a FLOP count is needed.

Small models do not reach any FLOP rate: their steps wait on kernel launches and Python. Beside the FLOP estimate
the dry run prints the **step floor**, the trial's steps at a step time: ``standard``'s train step measured by a
CUDA bench's section 11 (``overhead``: the device check runs it), scaled by depth (a launch-bound step's time grows
with its blocks, not its batch: on an H200 13-16 ms at depth 6 from batch 32 to 1024), with evaluation batches
(forward only) at a third of it — measured on the same class, else on another, else :data:`ASSUMED_STEP_FLOOR_S`.
"""

from __future__ import annotations

import functools
import json
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lit_modules.config import ViTConfig

from .. import layout
from ..costs import measure
from ..machine.modes import auto_mode, tokens
from ..recipes import describe

# Imported where they are used, not here: the datasets (data: torch). Each takes from a tenth of a second to seconds
# to import, and the command-line tools start without them.


@dataclass(frozen=True)
class GpuClass:
    """A GPU class with its spec-sheet peaks (TFLOP/s, dense: without 2:4 structured sparsity)."""

    name: str
    title: str
    bf16_tflops: float  # dense BF16 (= FP16) tensor-core peak
    fp32_tflops: float  # FP32 without tensor cores (what '32-true' uses: PyTorch leaves TF32 matmuls off)
    pattern: str  # regular expression matching torch.cuda.get_device_name() of a GPU of this class


#: The classes ``--gpu`` accepts. Figures from NVIDIA's spec sheets; the sheets print BF16 "with sparsity" (2x).
GPU_CLASSES: dict[str, GpuClass] = {
    # A100 datasheet (SXM4 and PCIe alike): BF16 tensor core 312 TFLOPS dense (624 with sparsity); FP32 19.5.
    "a100": GpuClass("a100", "NVIDIA A100", 312.0, 19.5, r"\bA100\b"),
    # H100 SXM5 datasheet: BF16 tensor core 1,979 TFLOPS with sparsity = 989.4 dense; FP32 67 (66.9).
    # (H100 PCIe is lower, 756 / 51; it is matched to this class too.)
    "h100": GpuClass("h100", "NVIDIA H100 SXM", 989.4, 66.9, r"\bH100\b"),
    # H200 SXM datasheet: the H100's GH100 die with HBM3e; BF16 1,979 with sparsity = 989.4 dense; FP32 67 (66.9).
    "h200": GpuClass("h200", "NVIDIA H200 SXM", 989.4, 66.9, r"\bH200\b"),
    # L4 datasheet: BF16 tensor core 242 TFLOPS with sparsity = 121 dense; FP32 30.3.
    "l4": GpuClass("l4", "NVIDIA L4", 121.0, 30.3, r"\bL4\b"),
    # Ada Lovelace whitepaper, appendix (GeForce RTX 4090): BF16 tensor with FP32 accumulate 165.2 dense
    # (330.3 with sparsity); FP32 82.6.
    "rtx4090": GpuClass("rtx4090", "NVIDIA GeForce RTX 4090", 165.2, 82.6, r"\b4090\b"),
}
DEFAULT_GPU = "h100"

#: The MFU assumed when ``results/device`` holds no GPU measurement. Conservative for these small models: ViT-Tiny
#: and ViT-S widths (192, 384) on 32x32 images with 4x4 patches have 65 tokens, so their matmuls are small and the
#: elementwise work (norms, GELU, softmax, the optimizer) and kernel launches weigh far more than in the large
#: models that reach 40-50% of the bf16 peak.
ASSUMED_MFU = 0.25
#: The least time one step (a training step, or an evaluation batch) takes on a GPU however small the model: its
#: kernel launches (a few hundred for a ViT block stack's forward, backward and AdamW, ~5 µs each) and the Python of
#: the step and of Lightning's loop. Used only where no CUDA bench has measured a step (:func:`find_step_times`;
#: an H200 took 9-16 ms for standard's train step at depth 6).
ASSUMED_STEP_FLOOR_S = 0.005
#: An evaluation batch's share of a training step's time where the floor is measured: a forward alone, without the
#: backward and the optimizer (about a third of the launches). Assumed.
EVAL_STEP_SHARE = 1 / 3
#: The folder under the results folder where ``scripts/device_check.py`` and ``ablations.bench --device cuda``
#: write their measurements (``<results>/device/<device>/...``).
DEVICE_RESULTS = layout.DEVICE
#: Precisions priced at the 16-bit tensor-core peak; every other precision ('32-true', '64-true') is priced at the
#: FP32 peak. ``auto`` is resolved first (:func:`resolve_precision`); unresolved, it counts as bf16 autocast.
SIXTEEN_BIT = ("bf16-mixed", "bf16-true", "16-mixed", "16-true", "auto")


def gpu_class_of(device_name: str | None) -> str | None:
    """The class of a GPU from its ``torch.cuda.get_device_name()`` (e.g. ``NVIDIA H200`` -> ``h200``); None when
    it is none of :data:`GPU_CLASSES`."""
    if not device_name:
        return None
    return next((c.name for c in GPU_CLASSES.values() if re.search(c.pattern, device_name, re.IGNORECASE)), None)


def precision_kind(precision: str) -> str:
    """``bf16`` for the 16-bit precisions and ``auto``, ``fp32`` for the others: which peak a run is priced at."""
    return "bf16" if precision in SIXTEEN_BIT else "fp32"


def resolve_precision(config: Any, accelerator: str = "cuda", results_dir: str | Path = layout.RESULTS_DIR) -> str:
    """The Lightning precision a run of ``config`` trains at on ``accelerator``: its own, or for ``auto`` what the
    training run would pick (``ablations.machine.modes.auto_mode``: a measured ``<results_dir>/device/modes-cuda.json``, else
    bf16 autocast on CUDA)."""
    if config.precision != "auto":
        return config.precision
    from data import dataset_shape

    shape = dataset_shape(config)
    count = tokens(shape["img_size"], config.patch_size or shape["patch_size"])
    return auto_mode(accelerator, config.embed_dim, count, results_dir=results_dir).precision


def peak_flops(gpu: str, kind: str) -> float:
    """Dense peak FLOP/s of class ``gpu`` for a precision kind (``bf16`` or ``fp32``)."""
    spec = GPU_CLASSES[gpu]
    return 1e12 * (spec.bf16_tflops if kind == "bf16" else spec.fp32_tflops)


# --- FLOPs of a trial -----------------------------------------------------------------------------------------------
def forward_flops(config: Any, shape: dict | None = None) -> float:
    """Forward FLOPs of one image of ``config``'s model (batch 1, explicit attention; ``ablations.costs.measure``
    of its resolved backbone, ``config.model_config(shape)``; cached). ``shape``: the config's
    ``data.dataset_shape`` when the caller has it."""
    from data import dataset_shape

    model = config.model_config(shape or dataset_shape(config)).replace(fused_attn=None, drop_path_rate=0.0)
    return _forward_flops(json.dumps(model.to_dict(), sort_keys=True, default=str))


@functools.cache
def _forward_flops(key: str) -> float:
    return float(measure(ViTConfig(**json.loads(key)))["flops"])


def trial_batches(config: Any) -> tuple[int, int]:
    """(training batches, evaluation batches of the validation and test images together) of one trial's epochs,
    from the dataset's split sizes."""
    from data import dataset_shape

    train, val = dataset_shape(config)["sizes"]
    batch = config.batch_size
    return config.max_epochs * -(-train // batch), config.max_epochs * -(-val // batch)


def trial_steps(config: Any) -> int:
    """Steps of one trial: epochs × (training batches + evaluation batches)."""
    return sum(trial_batches(config))


def floor_seconds(config: Any, step: StepTime | None) -> float:
    """The trial's steps at ``step``'s time scaled to its depth, evaluation batches at :data:`EVAL_STEP_SHARE` of
    it; without a measurement every step at :data:`ASSUMED_STEP_FLOOR_S`."""
    train, evaluation = trial_batches(config)
    if step is None:
        return (train + evaluation) * ASSUMED_STEP_FLOOR_S
    return step.train_step_s(config.depth) * (train + EVAL_STEP_SHARE * evaluation)


def training_flops(config: Any) -> float:
    """FLOPs of one trial: forward FLOPs per image × epochs × (3 × train images + val images)."""
    from data import dataset_shape

    shape = dataset_shape(config)
    train, val = shape["sizes"]
    return forward_flops(config, shape) * config.max_epochs * (3 * train + val)


# --- measurements -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Measurement:
    """A training FLOP rate measured on a GPU (see the module docstring for the two kinds)."""

    kind: str  # "engine" | "training run" | "bench"
    gpu: str  # torch.cuda.get_device_name()
    gpu_class: str | None
    precision: str  # Lightning precision string of the measured run
    flops_per_s: float  # training FLOPs per second reached (3 x forward FLOPs per training image)
    source: str
    date: str
    detail: str

    @property
    def mfu(self) -> float | None:
        """The rate as a fraction of its own class's peak for its precision (None: a GPU not in the table)."""
        if self.gpu_class is None:
            return None
        return self.flops_per_s / peak_flops(self.gpu_class, precision_kind(self.precision))


@dataclass(frozen=True)
class StepTime:
    """``standard``'s train step (forward, backward, AdamW) timed on a GPU by section 11 of an ``ablations.bench
    --device cuda`` report, at that section's depth and batch."""

    gpu: str
    gpu_class: str | None
    seconds: float  # median over the section's rounds
    depth: int
    batch: int
    source: str
    date: str

    def train_step_s(self, depth: int) -> float:
        """The step at ``depth`` blocks: launch-bound, so in proportion to the blocks."""
        return self.seconds * depth / self.depth


def _read_reports(results_dir: str | Path, readers: dict) -> list:
    """What ``readers`` (file name -> reader of its JSON) make of the reports under ``<results_dir>/device``; a file
    that cannot be read or is not of the reader's form gives nothing."""
    root = layout.device_dir(results_dir)
    found = []
    for path in sorted(root.rglob("*.json")) if root.is_dir() else []:
        reader = readers.get(path.name)
        if reader is None:
            continue
        try:
            item = reader(json.loads(path.read_text()), path)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a report of the expected form: not a measurement
        if item is not None:
            found.append(item)
    return found


def find_measurements(results_dir: str | Path = layout.RESULTS_DIR) -> list[Measurement]:
    """Every GPU measurement under ``<results_dir>/device`` (device checks and benchmark reports), newest first.
    Files that cannot be read, CPU runs, failed stages and sections are skipped."""
    found = _read_reports(results_dir, {"device_check.json": _from_device_check, "bench.json": _from_bench})
    return sorted((m for m in found if m.flops_per_s > 0), key=lambda m: m.date, reverse=True)


def find_step_times(results_dir: str | Path = layout.RESULTS_DIR) -> list[StepTime]:
    """Every ``standard`` train step timed by a CUDA bench's section 11 under ``<results_dir>/device`` (the device
    check's bench among them), newest first."""
    found = _read_reports(results_dir, {"bench.json": _step_time_from_bench})
    return sorted((t for t in found if t.seconds > 0), key=lambda t: t.date, reverse=True)


def _step_time_from_bench(report: dict, path: Path) -> StepTime | None:
    meta = report["meta"]
    settings, machine = meta.get("settings") or {}, meta.get("machine") or {}
    section = report["sections"].get("overhead")
    if (meta.get("device") or settings.get("device")) != "cuda" or not section or section.get("error"):
        return None
    gpu = machine.get("gpu") or machine.get("cuda")
    seconds = statistics.median(section["data"]["times_s"]["standard"])
    return StepTime(gpu=gpu, gpu_class=gpu_class_of(gpu), seconds=seconds,
                    depth=int(settings["overhead_depth"]), batch=int(settings["overhead_batch"]), source=str(path),
                    date=str(meta.get("started", "")))


def _from_device_check(report: dict, path: Path) -> Measurement | None:
    """The 2-epoch training run of a ``scripts/device_check.py`` report on CUDA (format in its docstring)."""
    train = report["stages"]["train"]
    figures = train["figures"]
    if report.get("device") != "cuda" or train["status"] != "passed" or report.get("short"):
        return None
    images_per_s, flops = figures["train_images_per_s"], figures["forward_flops_per_image"]
    config = figures["config"]
    gpu = report["machine"]["gpu"]
    precision = figures.get("precision") or config["precision"]  # the precision it trained at ('auto' resolved)
    return Measurement(
        kind="training run", gpu=gpu, gpu_class=gpu_class_of(gpu), precision=precision,
        flops_per_s=3.0 * float(flops) * float(images_per_s), source=str(path), date=str(report["date"]),
        detail=(f"{images_per_s:,.0f} images/s in the device check's {config['max_epochs']}-epoch run ("
                f"{config['residual']} depth {config['depth']}, width {config['embed_dim']}, {config['dataset']}, "
                f"batch {config['batch_size']}, {precision})"))


def _from_bench(report: dict, path: Path) -> Measurement | None:
    """The MFU section of an ``ablations.bench --device cuda`` report: its train-step FLOP rate; or, where the report
    has the engine's GPU section (14), the paper recipe's step as the engine trains it (one CUDA graph)."""
    meta = report["meta"]
    settings, machine = meta.get("settings") or {}, meta.get("machine") or {}
    device = meta.get("device") or settings.get("device") or machine.get("device")
    engine = (report["sections"].get("gpu") or {}).get("data", {}).get("paper", {})
    if device == "cuda" and engine.get("engine graph_images_per_s"):
        gpu = machine.get("gpu") or machine.get("cuda")
        rate = float(engine["engine graph_images_per_s"]) * float(engine["train_flops_per_image"])
        precision = settings.get("precision") or "bf16-mixed"
        return Measurement(
            kind="engine", gpu=gpu, gpu_class=gpu_class_of(gpu), precision=precision, flops_per_s=rate,
            source=str(path), date=str(meta.get("started", "")),
            detail=f"the engine's paper-recipe model step (one CUDA graph, batch {engine['batch']}, {precision}): "
                   f"{engine['engine graph_images_per_s']:,.0f} images/s, {rate / 1e12:.1f} TFLOP/s (the step "
                   "alone: a recipe's per-batch augmentation is not in it)")
    section = report["sections"].get("mfu")
    if device != "cuda" or not section or section.get("error") or not section.get("data"):
        return None
    data = section["data"]
    gpu = machine.get("gpu") or machine.get("cuda")
    precision = data.get("precision") or settings.get("precision") or "bf16-mixed"  # the bench's CUDA mode
    return Measurement(
        kind="bench", gpu=gpu, gpu_class=gpu_class_of(gpu), precision=precision,
        flops_per_s=float(data["step_flops_per_s"]), source=str(path), date=str(meta.get("started", "")),
        detail=f"ablations.bench MFU section ({meta.get('mode', '?')} mode, {precision}): "
               f"{data['step_flops_per_s'] / 1e12:.1f} TFLOP/s per train step")


# --- the estimate -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Basis:
    """The effective training FLOP rate on a GPU class at a precision, and where it comes from."""

    precision: str
    flops_per_s: float
    mfu: float
    text: str
    measurement: Measurement | None = None


def choose_basis(gpu: str, precision: str, measurements: Sequence[Measurement], searched: str = "") -> Basis:
    """The rate of class ``gpu`` at ``precision``: the first rung of the module docstring's list that exists
    (``searched``: the folder the measurements were looked for in, for the text of an assumed MFU)."""
    kind = precision_kind(precision)
    peak = peak_flops(gpu, kind)
    same = [m for m in measurements if m.gpu_class == gpu and precision_kind(m.precision) == kind]
    for wanted in ("engine", "training run", "bench"):  # a study on a GPU trains through the engine
        for m in same:
            if m.kind == wanted:
                scaled = " (images/s scaled by each trial's FLOPs)" if m.kind == "training run" else ""
                text = (f"measured on {m.gpu}: {m.detail}{scaled}, MFU {m.flops_per_s / peak:.3g} "
                        f"({short(m.source)}, {m.date})")
                return Basis(precision, m.flops_per_s, m.flops_per_s / peak, text, m)
    others = [m for m in measurements if m.mfu is not None]
    others.sort(key=lambda m: ("engine", "training run").index(m.kind) if m.kind in ("engine", "training run")
                else 2)  # stable: newest engine step, then training run, then bench
    if others:
        m = others[0]
        text = (f"MFU {m.mfu:.3g} measured on {m.gpu} ({m.detail}; {short(m.source)}, {m.date}), applied to the "
                f"{gpu} {kind} peak: no measurement on {gpu} at {kind}")
        return Basis(precision, m.mfu * peak, m.mfu, text, m)
    return Basis(precision, ASSUMED_MFU * peak, ASSUMED_MFU,
                 f"MFU {ASSUMED_MFU} assumed (ASSUMED_MFU; no GPU measurement in {searched or DEVICE_RESULTS}: "
                 "`python scripts/device_check.py --device cuda` on a GPU measures one). Model compute only: the "
                 "recipe's augmentation (per batch, on the GPU) is not in a FLOP count; a device check's measured "
                 "images/s includes it")


def short(path: str) -> str:
    """A report's path relative to the working directory when it is inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


@dataclass(frozen=True)
class Estimate:
    """GPU time of a study: ``per_trial_s`` (mean over its points) × ``trials``."""

    gpu: str
    trials: int
    per_trial_s: float
    bases: dict[str, Basis]  # the points' precision ('auto (bf16-mixed)' for a resolved auto) -> its basis
    steps_per_trial: float = 0.0  # mean over the points of :func:`trial_steps`
    floor_s_per_trial: float = 0.0  # mean over the points of :func:`floor_seconds`
    step_time: StepTime | None = None  # the measured step the floor scales (None: ASSUMED_STEP_FLOOR_S)

    @property
    def gpu_hours(self) -> float:
        return self.per_trial_s * self.trials / 3600.0

    @property
    def floor_gpu_hours(self) -> float:
        """The GPU-hours the steps alone take (:func:`floor_seconds`), whatever their FLOPs."""
        return self.floor_s_per_trial * self.trials / 3600.0


def estimate(configs: Iterable[Any], trials: int, gpu: str = DEFAULT_GPU,
             results_dir: str | Path = layout.RESULTS_DIR) -> Estimate:
    """GPU time of ``trials`` trials whose mean is the mean of ``configs`` (a study's points) on class ``gpu``;
    measurements are read from ``<results_dir>/device``. ValueError (one line) for an unknown class."""
    if gpu not in GPU_CLASSES:
        raise ValueError(f"unknown GPU class '{gpu}'; valid choices: {', '.join(GPU_CLASSES)}")
    measurements = find_measurements(results_dir)
    step_times = find_step_times(results_dir)
    step_time = next((t for t in step_times if t.gpu_class == gpu), step_times[0] if step_times else None)
    searched = short(str(layout.device_dir(results_dir)))
    bases: dict[str, Basis] = {}
    seconds, steps, floors = [], [], []
    for config in configs:
        steps.append(trial_steps(config))
        floors.append(floor_seconds(config, step_time))
        precision = resolve_precision(config, "cuda", results_dir)
        label = precision if precision == config.precision else f"{config.precision} ({precision})"
        if label not in bases:
            bases[label] = choose_basis(gpu, precision, measurements, searched)
        seconds.append(training_flops(config) / bases[label].flops_per_s)
    if not seconds:
        raise ValueError("no study points to estimate")
    return Estimate(gpu=gpu, trials=trials, per_trial_s=sum(seconds) / len(seconds), bases=bases,
                    steps_per_trial=sum(steps) / len(steps),
                    floor_s_per_trial=sum(floors) / len(floors), step_time=step_time)


def describe_estimate(est: Estimate) -> list[str]:
    """The dry run's lines: the GPU-hours, then the basis of each precision in the study."""
    spec = GPU_CLASSES[est.gpu]
    lines = [f"estimated GPU-hours on {est.gpu} ({spec.title}): {est.gpu_hours:.3g} GPU-hours for {est.trials} "
             f"trials ({est.per_trial_s / 60:.3g} min per trial on one GPU; training FLOPs = 3 x forward per "
             "training image + 1 x per val image, x epochs)"]
    for label, basis in est.bases.items():
        kind = precision_kind(basis.precision)
        lines.append(f"  precision {label}: {peak_flops(est.gpu, kind) / 1e12:g} TFLOP/s dense {kind} peak x "
                     f"MFU {basis.mfu:.3g} = {basis.flops_per_s / 1e12:.3g} TFLOP/s; basis: {basis.text}")
        if kind == "fp32":
            lines.append(f"  (precision {basis.precision} runs on the FP32 units; bf16-mixed would be priced at the "
                         f"{spec.bf16_tflops:g} TFLOP/s bf16 peak)")
    if est.steps_per_trial:
        floor = est.floor_gpu_hours
        verdict = (f"{floor / est.gpu_hours:,.0f}x the FLOP estimate: at this model size the GPU waits on launches "
                   "and Python, and this floor is the better guide" if floor > est.gpu_hours else
                   "below the FLOP estimate, which therefore stands")
        t = est.step_time
        if t is None:
            at = f"at {ASSUMED_STEP_FLOOR_S * 1e3:g} ms each (assumed: ASSUMED_STEP_FLOOR_S)"
        else:
            where = "" if t.gpu_class == est.gpu else f", applied to {est.gpu}: none measured on it"
            at = (f"at standard's train step measured on {t.gpu} ({t.seconds * 1e3:.3g} ms at depth {t.depth}, batch "
                  f"{t.batch}: {short(t.source)}, {t.date}{where}) scaled by each trial's depth, an evaluation "
                  f"batch at {EVAL_STEP_SHARE:.2g} of it (assumed)")
        lines.append(f"  step floor: {est.steps_per_trial:,.0f} steps per trial (training and validation batches) "
                     f"{at} = at least {floor:.3g} GPU-hours, {verdict}")
    return lines


def recipe_line(config: Any) -> str:
    """``recipe: NAME (the pieces it switches on)`` of a RunConfig (:func:`ablations.recipes.describe`)."""
    return f"recipe: {config.recipe} ({describe(config.recipe_values())})"
