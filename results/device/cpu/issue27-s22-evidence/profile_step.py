import sys, time, torch
torch.set_num_threads(1)
import os
if os.environ.get("FTZ"): print("ftz", torch.set_flush_denormal(True))
from ablations.bench.harness import FULL, ours, random_batch
from ablations.bench.timing import train_step
s = FULL
size = s.vit(s.overhead_depth)
batch = random_batch(s, s.overhead_batch)
labels = sys.argv[1].split(",")
def mk(l):
    m = ours(l, {}, size)
    if m.multi_stream_sites(): m.set_stream_kernels(os.environ.get("K", "compiled"))
    return m
steps = {l: train_step(mk(l), batch) for l in labels}
for l, st in steps.items():
    for _ in range(3): st()
for r in range(3):
    for l, st in steps.items():
        t = time.perf_counter()
        for _ in range(5): st()
        print(r, l, f"{(time.perf_counter()-t)/5*1000:.1f} ms", flush=True)
if len(sys.argv) > 2:
    from torch.profiler import profile, ProfilerActivity
    st = steps[sys.argv[2]]
    with profile(activities=[ProfilerActivity.CPU]) as p:
        for _ in range(5): st()
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=35))
