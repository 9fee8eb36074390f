import sys, time, resource, json, torch, statistics
torch.set_num_threads(1)
from ablations import allocator
how = allocator.set_malloc()
from ablations.bench.harness import FULL, ours, random_batch
from ablations.bench.timing import train_step
s = FULL
size = s.vit(s.overhead_depth); batch = random_batch(s, s.overhead_batch)
steps = {}
for l in ("standard", "mhc"):
    m = ours(l, {}, size)
    if m.multi_stream_sites(): m.set_stream_kernels("compiled")
    steps[l] = train_step(m, batch)
for st in steps.values():
    for _ in range(2): st()
res = {l: [] for l in steps}; f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for r in range(4):
    for l, st in steps.items():
        t = time.perf_counter(); st(); st(); res[l].append((time.perf_counter() - t) / 2 * 1e3)
fl = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 16
print(sys.argv[1], how[:6], {l: round(statistics.median(v)) for l, v in res.items()}, "ratio", round(statistics.median([a/b for a, b in zip(res["mhc"], res["standard"])]), 3), "faults/step", round(fl))
