"""The benchmark's settings (full, quick, tiny), its models and batches, and the pieces of its report (a section
with goals and pass/miss marks)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from ablations.costs import all_configs
from ablations.studies.spec import load_spec
from lit_modules.config import ViTConfig

from ..cli import markdown_table
from ..machine.timing import image_batch, median, round_ratios
from . import child

# Imported where they are used, not here: the model (lit_modules: torch), timm and torch. Each takes from a tenth of a
# second to seconds to import, and the command-line tools start without them.

BACKBONE = ViTConfig()  # the timed backbone's fields other than those Settings sets

SECTIONS = ("timm", "variants", "lightning", "mfu", "study", "memory", "data", "modes", "compile", "auto",
            "overhead", "malloc", "engine", "gpu", "storage")


DEFAULT_SECTIONS = tuple(name for name in SECTIONS
                         if name not in ("compile", "malloc", "engine", "gpu", "storage"))  # opt-in
STUDY = "residual_variants"


@dataclass(frozen=True)
class Settings:
    """Sizes of one benchmark mode. The model of sections 1, 2, 4, 6, 7, 9 is ViT-Tiny width on 32x32 inputs."""

    mode: str = "full"
    device: str = "cpu"  # --device: "cpu" or "cuda"
    embed_dim: int = BACKBONE.embed_dim  # the backbone's defaults (lit_modules.config.ViTConfig: ViT-Tiny, 32 px)
    num_heads: int = BACKBONE.num_heads
    img_size: int = BACKBONE.img_size
    patch_size: int = BACKBONE.patch_size
    depth: int = BACKBONE.depth  # sections 1, 4, 7
    variant_depth: int = BACKBONE.depth  # section 2
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
    overhead_depth: int = 6  # section 11: the depth-aggregation and multi-stream designs at depth 6, batch 32 ...
    overhead_batch: int = 32
    overhead_reps: int = 9  # ... in more rounds than section 2: the goals are tight, the rounds cheap
    malloc_reps: int = 5  # section 12: rounds of two child processes (~20 s each at full size)
    processes: int = 1  # sections 3 and 11 in this process, or (> 1, --processes) in that many fresh child processes
    isolate: int = 0  # section 11: > 0 (--isolate K): every model in a fresh process of its own, K rounds
    engine_compile: bool = True  # section 13: time torch.compile too (on CUDA only with --compile: a cold compile of
    # mode="reduce-overhead" takes about a minute per model shape)

    @property
    def precision(self) -> str:
        """The timed train steps' precision: the device's fast mode (fp32 on the CPU, bf16 autocast on CUDA)."""
        return "bf16-mixed" if self.device == "cuda" else "32-true"

    def mode_text(self, attention: str = "fused attention") -> str:
        if self.device == "cuda":
            return f"CUDA, bf16 autocast (bf16-mixed), {attention}"
        return f"fp32, {attention}"

    def vit(self, depth: int) -> dict:
        """The timed backbone's size (``ViTConfig.size()``): the backbone's defaults at this run's width, heads,
        image, patch and ``depth``."""
        return BACKBONE.replace(img_size=self.img_size, patch_size=self.patch_size, embed_dim=self.embed_dim,
                                depth=depth, num_heads=self.num_heads).size()

    def describe(self, depth: int, batch: int | None = None) -> str:
        return (f"embed {self.embed_dim}, {self.num_heads} heads, depth {depth}, {self.img_size}x{self.img_size} "
                f"patch {self.patch_size}, {BACKBONE.num_classes} classes, batch {batch or self.batch}")


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
               overhead_reps=2, malloc_reps=2)


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
    return image_batch(batch or s.batch, BACKBONE.in_chans, s.img_size, BACKBONE.num_classes, s.device)


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
    spec = load_spec(STUDY)
    grid = spec.grid()
    depths = sorted({p["depth"] for p in grid if "depth" in p})
    point = next(p for p in grid if not depths or p["depth"] == depths[len(depths) // 2])
    return spec, spec.run_config(point, s.trial_overrides)


def runs_of(s: Settings, task: str, measure: Callable[[Settings], dict]) -> list[dict]:
    """``[measure(s)]`` in this process or, with ``s.processes`` > 1, ``measure`` in that many fresh child processes
    one after the other (``task`` of ``ablations.bench.child``; the parent's threads, environment and malloc
    setting): on a VM a ratio of two models' steps can differ more between processes than between the rounds of
    one, and only fresh processes sample that."""
    if s.processes <= 1:
        return [measure(s)]
    import torch

    return [child.run(task, s, torch.get_num_threads()) for _ in range(s.processes)]


@dataclass
class Sampled:
    """A section's timings from one process or from several (``runs_of``): each run a dict whose timing keys map a
    label to its per-round seconds. A ratio is the median of the per-round ratios (one process) or of each
    process's median ratio (several); medians of times are medians of the processes' medians."""

    runs: list[dict]

    @property
    def unit(self) -> str:
        """What a ratio's brackets and a goal's mark count."""
        return "processes" if len(self.runs) > 1 else "rounds"

    def how(self, rounds: str) -> str:
        """The setup's words for the sampling, given one process's (e.g. "9 rounds x 3 steps")."""
        if len(self.runs) == 1:
            return rounds
        return f"{rounds} in each of {len(self.runs)} fresh processes (a ratio: the median of the processes' medians)"

    def bracket(self) -> str:
        return f"[{'process' if len(self.runs) > 1 else 'round'} min-max]"

    def ratios(self, key: str, a: str, b: str) -> list[float]:
        """The values whose median is time(a) / time(b): per round, or each process's median."""
        per_run = [round_ratios(run[key], a, b) for run in self.runs]
        return per_run[0] if len(per_run) == 1 else [median(r) for r in per_run]

    def median(self, key: str, label: str) -> float:
        return median([median(run[key][label]) for run in self.runs])

    def notes(self) -> list[str]:
        if len(self.runs) == 1:
            return []
        return ["Several processes: a time column is the median of the processes' medians, row by row (unpaired: "
                "two rows' times may come from different processes); only the ratio column is paired."]

    def data(self, *keys: str) -> dict:
        """For the JSON: each timing key in one process's shape (label -> seconds; several processes' rounds one
        after another), each process's own under ``process_<key>``, and the number of processes."""
        out: dict = {"processes": len(self.runs)}
        for key in keys:
            out[key] = {label: [v for run in self.runs for v in run[key][label]] for label in self.runs[0][key]}
            if len(self.runs) > 1:
                out[f"process_{key}"] = [run[key] for run in self.runs]
        return out


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
             rounds: list[float] | None = None, unit: str = "rounds") -> list[str]:
        """Record a goal and return its two table cells: the goal text and the pass/miss mark. With ``rounds``
        (the per-round values whose median is ``value``; per-process ones with ``unit="processes"``) the mark also
        says in how many the goal held: a goal that holds in some and not in others is within this machine's
        timing noise."""
        meets = (lambda v: v <= limit) if at_most else (lambda v: v >= limit)  # noqa: E731
        passed = meets(value)
        entry = {"what": what, "value": value, "limit": limit, "goal": text, "result": shown, "passed": passed}
        if rounds:
            entry["rounds"], entry["rounds_meeting_goal"], entry["unit"] = rounds, sum(map(meets, rounds)), unit
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
    rounds = (f" ({goal['rounds_meeting_goal']}/{len(goal['rounds'])} {goal.get('unit', 'rounds')})"
              if goal.get("rounds") else "")
    return mark(goal["passed"]) + rounds


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:,.1f}"


def table(columns: list[str], rows: list[list[str]]) -> str:
    def numeric(i: int) -> bool:  # right-align a column whose filled cells are mostly numbers
        cells = [row[i] for row in rows if row[i]]
        return 2 * sum(c[0].isdigit() or c[0] in "+-" for c in cells) >= len(cells) > 0

    return markdown_table(columns, rows, "".join("r" if i and numeric(i) else "l" for i in range(len(columns))))
