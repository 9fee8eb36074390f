"""Section 11's measurement for standard and mHC alone in one process (9 rounds x 3 steps, warm-up 2, fp32, compiled
stream kernels): prints the per-round ratios and their median. Run once per fresh process."""
import json, sys
import torch
torch.set_num_threads(1)
from ablations.bench.harness import FULL, ours, random_batch
from ablations.bench.timing import interleave, median, round_ratios, train_step
from lit_modules.residual import stream_kernels

s = FULL
size = s.vit(s.overhead_depth)
batch = random_batch(s, s.overhead_batch)
models = {"standard": ours("standard", {}, size), "mhc": ours("mhc", {}, size)}
models["mhc"].set_stream_kernels(stream_kernels.resolve("auto", "cpu"))
times = interleave({k: train_step(m, batch) for k, m in models.items()}, reps=s.overhead_reps, steps=s.steps,
                   warmup=s.warmup)
r = round_ratios(times, "mhc", "standard")
print(json.dumps({"median": median(r), "rounds": r, "standard_ms": 1e3 * median(times["standard"]),
                  "mhc_ms": 1e3 * median(times["mhc"])}))
