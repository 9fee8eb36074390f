"""Speed, FLOP utilisation and memory of the backbone, measured as ratios side by side in one process.

    python -m ablations.bench                        # every section at full size (~25 min on 2 quiet cores)
    python -m ablations.bench --quick                # every section at small sizes (~3 min on 2 quiet cores)
    python -m ablations.bench --sections timm,mfu --threads 2 --out /tmp/bench
    python -m ablations.bench --compile              # also time model.compile() (cold compiles take minutes)
    python -m ablations.bench --device cuda --sections variants,memory,modes \
        --variants "standard,dca (default),dca k=2,dca grn_v3" --out results/device   # the GPU path

Writes ``<out>/bench.md`` (each figure beside its goal with a pass/miss mark, plus the machine facts) and
``<out>/bench.json`` (the raw timings). Sections: 1 timm, 2 variants, 3 lightning, 4 mfu, 5 study, 6 memory,
7 data, 8 modes, 9 compile (only with ``--compile``), 10 auto (precision auto vs both fixed precisions),
11 overhead, 12 malloc (only when asked: ``--sections malloc`` or ``12``; child processes per malloc setting),
13 engine (only when asked: the training engine's levers per trial step, ``ablations.bench.engine``), 14 gpu (only
when asked: the engine on the device — a study's aggregate images/s, the paper recipe's MFU, the multi-stream
designs' steps, ``ablations.bench.gpu``; meant for ``--device cuda``), 15 storage (only when asked: a trial's summary
written to the study's SQLite storage attribute by attribute vs in one transaction, ``ablations.bench.storage``).
``--processes K`` runs sections 3 and 11 in K fresh child processes each (a ratio: the median of theirs);
``--isolate K`` runs section 11 with every model in a fresh child process of its own, K rounds.
Section 8 also writes ``<out>/modes-<device>.json``, the table ``ablations.machine.modes`` chooses a training run's
precision and attention kernel from: it looks for the user's own at ``results/device/modes-<device>.json`` (hence
``--out results/device`` above).

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

Memory (section 6) on the CPU runs one forward per variant at depth 24 at batch 16 (--quick: 8): a short section,
far below a 24 GiB machine's memory for every variant.

Data (section 7) times one epoch of the training data path alone (``ablations.training.build_datamodule`` on an
in-memory CIFAR-shaped synthetic set, recipes ``basic`` and ``paper``) against section 1's train step, both in
images/s: an in-memory loader runs between steps, so its time adds to every step. Modes (section 8) times the train
step in the four modes precision x attention kernel on a grid of widths and token counts (``ablations.machine.modes``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
import traceback
import warnings
from dataclasses import asdict, replace
from pathlib import Path

from ablations.machine.modes import cpu_facts

from .. import layout
from ..cli import OneLineParser, program
from ..costs import all_configs
from ..machine import allocator
from .engine import bench_engine
from .gpu import bench_gpu
from .harness import (
    DEFAULT_SECTIONS,
    FULL,
    QUICK,
    SECTIONS,
    TINY,
    Section,
    Settings,
    goal_mark,
    parse_variants,
    table,
)
from .loops import bench_data, bench_lightning, bench_study
from .malloc import bench_malloc
from .precision import bench_auto, bench_modes, modes_table
from .steps import bench_compile, bench_memory, bench_mfu, bench_overhead, bench_timm, bench_variants
from .storage import bench_storage

# Imported where they are used, not here: Lightning, timm and torch. Each takes from a tenth of a second to seconds to
# import, and the command-line tools start without them.

BENCHES = {"timm": bench_timm, "variants": bench_variants, "lightning": bench_lightning, "mfu": bench_mfu,
           "study": bench_study, "memory": bench_memory, "data": bench_data, "modes": bench_modes,
           "compile": bench_compile, "auto": bench_auto, "overhead": bench_overhead, "malloc": bench_malloc,
           "engine": bench_engine, "gpu": bench_gpu, "storage": bench_storage}


# --- report --------------------------------------------------------------------------------------------------------
def machine_facts(threads: int) -> dict:
    import lightning
    import timm
    import torch

    cpu, flags = cpu_facts()
    return {"cpu": cpu, "cpu_flags": flags, "logical_cores": os.cpu_count(), "threads": threads,
            "torch": torch.__version__, "timm": timm.__version__, "lightning": lightning.__version__,
            "python": platform.python_version(),
            # the GPU's name under the key device_check.json uses (bench.json before had it under "cuda")
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "loadavg_start": list(os.getloadavg())}


def processes_text(processes: int) -> str:
    if processes <= 1:
        return ""
    return (f" Sections 3 and 11 ran in {processes} fresh processes each (`--processes {processes}`): their ratios "
            "are medians of the processes' medians, their brackets and '(k/n processes)' count processes.")


def render(meta: dict, sections: list[Section]) -> str:
    m = meta["machine"]
    gpu = m.get("gpu", m.get("cuda"))  # a bench.json may name the key "cuda"
    cores = m["logical_cores"] or 1  # others running at the start, or far more than our own threads at the end
    busy = m["loadavg_start"][0] > 0.5 * cores or m["loadavg_end"][0] > m["threads"] + 0.5 * cores
    out = ["# Benchmark: ViT backbone and its residual variants", "",
           f"Mode **{meta['mode']}**" + (" (small sizes: not the reference figures)" if meta["mode"] != "full" else "")
           + f" on the **{meta.get('device', 'cpu').upper()}**"
           + f"; sections {', '.join(s.name for s in sections)}; {meta['started']}; wall {meta['wall_s']:.0f} s. "
           "Generated by `python -m ablations.bench`; method in its docstring (interleaved rounds, medians, "
           "paired ratios, warm-up excluded). A ratio's brackets hold the smallest and largest per-round ratio; "
           "'(k/n rounds)' counts the rounds in which a goal held: a goal met in some rounds and missed in others "
           "is within this machine's timing noise." + processes_text(meta["settings"].get("processes", 1)), "",
           "## Machine", "",
           table(["fact", "value"], [
               ["CPU", f"{m['cpu']} ({m['logical_cores']} logical cores; {', '.join(m['cpu_flags']) or 'no flags read'})"],
               ["threads", f"{m['threads']} (torch.set_num_threads)"],
               ["malloc", f"{m.get('malloc', 'not recorded')}; set by ABLATIONS_MALLOC as in training "
                          "(ablations.machine.allocator)"],
               ["torch / timm / lightning / Python", f"{m['torch']} / {m['timm']} / {m['lightning']} / {m['python']}"],
               ["CUDA", (f"{gpu} (the timed device)" if meta.get("device") == "cuda" else
                         f"{gpu} (not used: --device cpu)") if gpu else "none"],
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
    p = OneLineParser(prog=program("ablations.bench"), description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--quick", action="store_true", help="small sizes and fewer rounds (every section still runs)")
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # the test's sizes: seconds, meaningless
    p.add_argument("--out", default=layout.OUTPUT_DIR,
                   help=f"folder for bench.md and bench.json (default: {layout.OUTPUT_DIR}; the committed bench is "
                        f"{layout.RESULTS_DIR})")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's own, the physical cores)")
    p.add_argument("--sections", type=parse_sections, help=f"comma-separated subset of {', '.join(SECTIONS)} "
                   f"(or numbers 1-{len(SECTIONS)}); default: all but compile, malloc, engine, gpu and storage")
    p.add_argument("--compile", action="store_true", help="also measure model.compile() (section 9; on CUDA also "
                   "section 13's torch.compile lever)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where models and batches live and steps are timed (default: cpu); cuda times the train "
                        "steps in bf16 autocast with fused attention and synchronises after every timed call")
    p.add_argument("--processes", type=int, default=1, metavar="K",
                   help="sections 3 and 11: time in K fresh child processes, one after the other, and take the "
                        "median of their ratios (default 1: in this process); a ratio can differ more between "
                        "processes than between rounds")
    p.add_argument("--isolate", type=int, default=0, metavar="K",
                   help="section 11: every model in a fresh child process of its own, as a training run holds one "
                        "model, in K rounds (order rotating); a ratio pairs a design's process with standard's of "
                        "the same round (default 0: all models interleaved in one process)")
    p.add_argument("--overhead-batch", type=int, metavar="N",
                   help="section 11's batch (default 32); on a GPU a larger one shows the designs' "
                        "cost once their kernels, not the launches, take the time")
    p.add_argument("--variants", metavar="LABEL,...",
                   help="sections 2 and 6: only these labels of ablations.costs.all_configs() (standard, their "
                        "reference, is always included); default: all")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings, names = _settings(args)
    # torch and Lightning (seconds to import) only once the arguments are good: --help and bad input stay quick.
    # Lightning first: it resets its loggers' level on import.
    import lightning.pytorch  # noqa: F401
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        build_parser().error("--device cuda: torch.cuda.is_available() is False (no CUDA device, or a CPU-only "
                             "torch build)")
    if args.variants is not None:
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
    malloc = allocator.set_malloc() if args.device == "cpu" else "system (not a CPU run)"  # as training
    meta = {"mode": settings.mode, "device": settings.device, "settings": asdict(settings),
            "machine": machine_facts(threads) | {"malloc": malloc},
            "started": time.strftime("%Y-%m-%d %H:%M:%S"), "sections": names}
    load = meta["machine"]["loadavg_start"][0]
    print(f"bench ({settings.mode}, {settings.device}): {', '.join(names)} on {threads} threads; "
          f"load average {load:.2f}"
          + (" — the machine is busy: timings will be noise (and with more threads than free cores, very slow)"
             if load > 0.5 * (os.cpu_count() or 1) else ""), file=sys.stderr)
    sections = _run_sections(names, settings, threads, Path(args.out), meta)
    out = Path(args.out)
    passed = sum(g["passed"] for s in sections for g in s.goals)
    total = sum(len(s.goals) for s in sections)
    written = [out / "bench.md", out / "bench.json"]
    if any(s.name == "modes" and not s.error for s in sections):
        written.append(out / f"modes-{settings.device}.json")
    print(f"\n{passed}/{total} goals met; wrote {', '.join(map(str, written))} ({meta['wall_s']:.0f} s)",
          file=sys.stderr)
    return 1 if any(s.error for s in sections) else 0


def _settings(args: argparse.Namespace) -> tuple[Settings, list[str]]:
    """The run's settings and sections from the arguments; a bad combination is one line and exit status 2."""
    fail = build_parser().error
    if args.threads is not None and args.threads < 1:
        fail(f"--threads must be >= 1, got {args.threads}")
    if args.processes < 1:
        fail(f"--processes must be >= 1, got {args.processes}")
    if args.isolate < 0 or (args.isolate and args.processes > 1):
        fail(f"--isolate must be >= 0 and is not combined with --processes (got --isolate {args.isolate}, "
             f"--processes {args.processes})")
    try:
        allocator.choice()
    except ValueError as exc:
        fail(str(exc))
    settings = replace(TINY if args.tiny else QUICK if args.quick else FULL, device=args.device,
                       processes=args.processes, isolate=args.isolate)
    names = args.sections or list(DEFAULT_SECTIONS)
    if args.processes > 1 and not {"lightning", "overhead"} & set(names):
        fail(f"--processes applies to sections lightning (3) and overhead (11) only, and --sections chose "
             f"{', '.join(names)}")
    if args.isolate and "overhead" not in names:
        fail(f"--isolate applies to section overhead (11) only, and --sections chose {', '.join(names)}")
    if args.overhead_batch is not None:
        if args.overhead_batch < 1 or "overhead" not in names:
            fail(f"--overhead-batch must be >= 1 and applies to section overhead (11) only (got "
                 f"{args.overhead_batch}, sections {', '.join(names)})")
        settings = replace(settings, overhead_batch=args.overhead_batch)
    if args.compile and "compile" not in names:
        names.append("compile")
    return replace(settings, engine_compile=args.device == "cpu" or args.compile), names


def _run_sections(names: list[str], settings: Settings, threads: int, out: Path, meta: dict) -> list[Section]:
    """Each section in turn, printed as it ends and the report rewritten after it (a crash keeps what ran); a
    section that fails is reported with its error and the others still run."""
    import torch  # loaded by main already

    start = time.perf_counter()
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
        write_results(out, meta, sections, start)
    return sections
