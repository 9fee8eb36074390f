"""One model per fresh process, as a training run holds one: ``python one.py LABEL`` times LABEL's train step at
section 11's size (fp32, 1 thread, compiled stream kernels, warm-up 2, then 9 x 3 steps) and prints its median
ms/step as JSON. With NOGC=1 the garbage collector is off during the timed rounds, as the bench's interleave has
it (gc.sh ran a copy of this file that differed in that switch only; the copy was folded in here after the run)."""
import json, sys, time
import torch
torch.set_num_threads(1)
from ablations.bench.harness import FULL, ours, random_batch
from ablations.bench.timing import median, train_step
from lit_modules.residual import stream_kernels

s, label = FULL, sys.argv[1]
model = ours(label, {}, s.vit(s.overhead_depth))
if model.multi_stream_sites():
    model.set_stream_kernels(stream_kernels.resolve("auto", "cpu"))
step = train_step(model, random_batch(s, s.overhead_batch))
for _ in range(s.warmup):
    step()
rounds = []
import gc, os
if os.environ.get("NOGC"): gc.disable()
for _ in range(s.overhead_reps):
    t0 = time.perf_counter()
    for _ in range(s.steps):
        step()
    rounds.append((time.perf_counter() - t0) / s.steps)
print(json.dumps({"label": label, "ms": 1e3 * median(rounds)}))
