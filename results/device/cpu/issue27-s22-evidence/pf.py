import sys, time, os, resource, torch
torch.set_num_threads(1)
from ablations.bench.harness import FULL, ours, random_batch
from ablations.bench.timing import train_step
s = FULL
size = s.vit(s.overhead_depth)
batch = random_batch(s, s.overhead_batch)
l = sys.argv[1]
m = ours(l, {}, size)
if m.multi_stream_sites(): m.set_stream_kernels("compiled")
st = train_step(m, batch)
for _ in range(3): st()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
t = time.perf_counter()
for _ in range(5): st()
dt = (time.perf_counter() - t) / 5
print(l, f"{dt*1000:.1f} ms/step", (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 5, "minor faults/step", flush=True)
