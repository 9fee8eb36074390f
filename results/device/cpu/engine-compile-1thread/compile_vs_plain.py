"""torch.compile of the plain step (forward + loss; AOTAutograd backward) vs the eager step at the headline study's size,
9 rounds x 5 steps interleaved, 1 thread (ablations.engine.measure.plain_step; explicit attention)."""
import time, json, warnings, os
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(1)
from ablations.engine.measure import plain_step
from ablations.bench.precision import AUTO_SIZES
from ablations.bench.timing import interleave, median, round_ratios
label, size, batch = AUTO_SIZES[0]
t0 = time.perf_counter()
fns = {"plain": plain_step(size, batch, fused_attn=False), "compiled": plain_step(size, batch, fused_attn=False, compile=True)}
c0 = time.perf_counter(); fns["compiled"](); first = time.perf_counter() - c0
times = interleave(fns, reps=9, steps=5, warmup=2)
r = round_ratios(times, "compiled", "plain")
print(json.dumps({"load_start": os.getloadavg(), "first_compiled_call_s": first, "plain_ms": median(times["plain"])*1e3, "compiled_ms": median(times["compiled"])*1e3, "ratio": median(r), "ratios": r}))
