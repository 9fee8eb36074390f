# one child: ms/step and faults/step for standard and mhc at bench size (width 192, 2080 tokens) and study size
import sys, time, resource, json, torch
from dataclasses import replace
torch.set_num_threads(1)
from ablations import allocator
how = allocator.keep_freed_memory()
from ablations.bench.harness import FULL, ours, random_batch
from ablations.bench.timing import train_step
out = {"malloc": how}
small = replace(FULL, img_size=28, patch_size=7, embed_dim=64, num_heads=4)
for tag, s, size, b, n in (("bench", FULL, FULL.vit(FULL.overhead_depth), FULL.overhead_batch, 6),
                           ("study", small, small.vit(4) | {"mlp_ratio": 2.0}, 64, 60)):
    batch = random_batch(s, b)
    for l in ("standard", "mhc"):
        m = ours(l, {}, size)
        if m.multi_stream_sites(): m.set_stream_kernels("compiled")
        st = train_step(m, batch)
        for _ in range(3): st()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t = time.perf_counter()
        for _ in range(n): st()
        out[f"{tag}/{l}"] = ((time.perf_counter() - t) / n * 1e3, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / n)
print(json.dumps(out))
