"""Section 12: training steps with glibc's malloc kept from handing freed memory back (``ABLATIONS_MALLOC=keep``,
``ablations.machine.allocator``) against glibc's defaults (``system``, what training uses unless told). malloc's settings
and heap are per process, so each round starts one child process per setting (``ablations.bench.child``), in
alternating order; a child times ``standard`` and mHC (the section-11 size, and the studies') and counts the page
faults of its timed steps."""

from __future__ import annotations

import os
import resource
import time
from dataclasses import replace

from ..machine import allocator
from ..machine.timing import median, rotated, train_step
from . import child
from .harness import Section, Settings, ms, ours, random_batch, ratio_cell

# Imported where they are used, not here: torch and the model (lit_modules: torch). Each takes from a tenth of a
# second to seconds to import, and the command-line tools start without them.

SETTINGS = ("system", "keep")
LABELS = ("standard", "mhc")


def study_size(s: Settings) -> Settings:
    """A model of the studies' size: 28 px images, patch 7, width 64, 4 heads (depth 4, batch 64, MLP ratio 2 where
    it is used); unlike a study's, 3 channels, the class token and fp32."""
    return replace(s, img_size=28, patch_size=7, embed_dim=64, num_heads=4)


def time_both_sizes(s: Settings) -> dict:
    """In a child process (task ``malloc``): malloc set as ``ABLATIONS_MALLOC`` says, then ms/step and page
    faults/step of each label at both sizes, after warm-up."""
    import torch

    from lit_modules.residual import stream_kernels

    how = allocator.set_malloc()

    kernels = stream_kernels.resolve("auto", s.device)
    small = study_size(s)
    sizes = {"section 11": (s, s.vit(s.overhead_depth), s.overhead_batch),
             "study size": (small, small.vit(4) | {"mlp_ratio": 2.0}, 64 if s.mode == "full" else s.batch)}
    out: dict = {"malloc": how, "threads": torch.get_num_threads(), "times": {}}
    for size_name, (settings, size, batch_size) in sizes.items():
        batch = random_batch(settings, batch_size)
        for label in LABELS:
            model = ours(label, {}, size)
            if model.multi_stream_sites():
                model.set_stream_kernels(kernels)
            step = train_step(model, batch)
            for _ in range(s.warmup + 1):
                step()
            steps = s.steps * (10 if size_name == "study size" else 1)  # a ~20x shorter step
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            for _ in range(steps):
                step()
            seconds = (time.perf_counter() - start) / steps
            out["times"][f"{label} ({size_name})"] = {
                "s": seconds, "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / steps}
    return out


def bench_malloc(s: Settings) -> Section:
    """``s.malloc_reps`` rounds; in each, one child per malloc setting (the order alternates by round)."""
    import torch

    if s.device != "cpu":
        sec = Section("malloc", "12. glibc's malloc (ablations.machine.allocator)", "—", [])
        sec.notes.append("CPU only: a run on a GPU leaves malloc as it is.")
        return sec
    env = allocator.without_user_malloc(dict(os.environ))  # glibc's own malloc under the two settings
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for r in range(s.malloc_reps):
        for name in rotated(SETTINGS, r):
            runs[name].append(child.run("malloc", s, torch.get_num_threads(), env=env | {"ABLATIONS_MALLOC": name}))
    keys = list(runs["keep"][0]["times"])
    sec = Section("malloc", "12. glibc's malloc: kept freed memory vs the defaults (ablations.machine.allocator)",
                  f"one child process per setting and round ({s.malloc_reps} rounds, alternating order); "
                  f"{s.mode_text()}, AdamW; each child warms up, then times {s.steps} steps at the section-11 size "
                  f"({s.describe(s.overhead_depth, s.overhead_batch)}) and {10 * s.steps} at the studies' "
                  f"size (28 px, patch 7, width 64, depth 4; 3 channels, class token); keep: {runs['keep'][0]['malloc']}",
                  ["model", "system ms/step", "keep ms/step", "keep vs system [round min-max]",
                   "system faults/step", "keep faults/step"])
    ratios = {}
    for key in keys:
        system = [run["times"][key] for run in runs["system"]]
        keep = [run["times"][key] for run in runs["keep"]]
        ratios[key] = [k["s"] / t["s"] for k, t in zip(keep, system, strict=True)]
        sec.rows.append([key, ms(median([t["s"] for t in system])), ms(median([k["s"] for k in keep])),
                         ratio_cell(ratios[key]), f"{median([t['faults'] for t in system]):,.0f}",
                         f"{median([k['faults'] for k in keep]):,.0f}"])
    sec.notes.append("Report only (no goal): training uses keep unless ABLATIONS_MALLOC=system; a ratio below 1 "
                     "is time keep saves. A child's first touch of memory it had freed and handed back is a page "
                     "fault; what faults remain under keep are not malloc's (on Python 3.11, for one, its frame "
                     "stack's 16 KiB chunks are mapped and unmapped as the call depth crosses a chunk's end).")
    sec.data = {"ratios": ratios, "runs": runs}
    return sec
