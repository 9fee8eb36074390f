"""Train-step time of every row of a study against its ``standard`` row, at the study's own model size, on this CPU.

    python scripts/step_times.py --study frontier                       # the default budget's size, 1 thread
    python scripts/step_times.py --study frontier --rounds 9 --threads 2 --json

Each row's model is the one the study trains (its ``RunConfig`` resolved against the dataset's shape: residual,
options and backbone fields, depth from the study's first depth), timed with the benchmark's method
(``ablations.machine.timing``): one train step (forward, cross-entropy, backward, AdamW) on a fixed random batch of the
study's batch size, every model warmed up, then ``--rounds`` rounds in which each model runs ``--steps`` steps in
turn, the order rotating; a row's ratio is the median over rounds of its time over ``standard``'s in the same round
(paired: both ran seconds apart under the same machine load), with the smallest and largest round's in brackets.
fp32, whatever precision ``auto`` would choose on this CPU; fused attention unless ``--attention explicit`` (the
attention a study's ``auto`` keeps on a CPU where it measured faster: its runs.csv's ``mode`` column says which).
Prints a Markdown table (or JSON).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

# Imported where they are used, not here: torch, the datasets (data: torch) and the model (lit_modules: torch). Each
# takes from a tenth of a second to seconds to import, and the command-line tools start without them.

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from ablations.cli import OneLineParser, fail

    parser = OneLineParser(prog="python scripts/step_times.py", description=__doc__.splitlines()[0])
    parser.add_argument("--study", required=True, help="a study name or file (as ablations.run --study)")
    parser.add_argument("--budget", default="default", help="the budget whose size is timed (default: default)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per model and round (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--attention", choices=("fused", "explicit"), default="fused",
                        help="attention kernel (default fused; explicit: softmax(QK^T)V written out)")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a Markdown table")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.steps < 1 or args.threads < 1:
        fail("--rounds, --steps and --threads must be positive integers")

    import torch

    from ablations.cli import markdown_table
    from ablations.machine.timing import image_batch, interleave, median, round_ratios, train_step
    from ablations.studies.spec import load_spec
    from data import dataset_shape
    from lit_modules import VisionTransformer

    try:
        spec = load_spec(args.study, args.budget)
    except ValueError as exc:
        fail(str(exc))
    labels = [v.label for v in spec.variants]
    if "standard" not in labels:
        fail(f"study '{spec.name}' has no 'standard' row to time the others against")
    point = {"depth": spec.axes["depth"][0]} if "depth" in spec.axes else {}
    point["seed"] = spec.axes.get("seed", [0])[0]
    configs = {label: spec.run_config({"variant": label, **point}) for label in labels}
    shape = dataset_shape(configs["standard"])
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    models = {label: VisionTransformer(c.model_config(shape).replace(fused_attn=args.attention == "fused"), init_seed=0)
              for label, c in configs.items()}
    batch = image_batch(configs["standard"].batch_size, shape["in_chans"], shape["img_size"], shape["num_classes"])
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load = _loadavg()
    times = interleave({label: train_step(m, batch) for label, m in models.items()}, reps=args.rounds,
                       steps=args.steps, warmup=1)
    base = sum(p.numel() for p in models["standard"].parameters())
    rows = []
    for label, model in models.items():
        ratios = round_ratios(times, label, "standard")
        params = sum(p.numel() for p in model.parameters())
        rows.append({"row": label, "params": params, "params_vs_standard_pct": 100.0 * (params / base - 1.0),
                     "ms_per_step": 1e3 * median(times[label]), "time_ratio": median(ratios),
                     "time_ratios": ratios})
    c = configs["standard"]
    meta = {"study": spec.name, "budget": args.budget, "started": started, "threads": args.threads,
            "attention": args.attention,
            "rounds": args.rounds, "steps": args.steps, "loadavg_start": load, "cpu": platform.processor() or "",
            "size": f"{c.dataset} {shape['img_size']}px patch {c.patch_size or shape['patch_size']}, width "
                    f"{c.embed_dim}, depth {point.get('depth')}, {c.num_heads} heads, MLP ratio {c.mlp_ratio}, "
                    f"batch {c.batch_size}"}
    if args.json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=1))
        return 0
    body = [[r["row"], f"{r['params']:,}", f"{r['params_vs_standard_pct']:+.2f}%", f"{r['ms_per_step']:.1f}",
             f"{r['time_ratio']:.2f}× [{min(r['time_ratios']):.2f}–{max(r['time_ratios']):.2f}]"] for r in rows]
    print(markdown_table(["row", "params", "+params vs standard", "ms / step", "step time vs standard"], body,
                         "lrrrr"))
    print(f"\n{meta['size']}; fp32, {args.attention} attention, AdamW; {args.rounds} rounds x {args.steps} steps, "
          f"{args.threads} thread(s), started {started} (1-min load average {load:.2f}).")
    return 0


def _loadavg() -> float:
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


if __name__ == "__main__":
    raise SystemExit(main())
