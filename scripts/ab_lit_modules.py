"""Paired A/B of a variant's train step between two checkouts' ``lit_modules``, in one process.

    git worktree add --detach /tmp/before <commit>                 # the code to compare against
    python scripts/ab_lit_modules.py /tmp/before --variants mhc     # this checkout's code against it
    python scripts/ab_lit_modules.py /tmp/before --variants mhc,hyper_connections --rounds 9 --threads 1

Both packages are imported side by side (the baseline's modules are renamed in ``sys.modules`` before this
checkout's are imported, so each model keeps its own classes), and each variant's two train steps run interleaved
with this checkout's ``standard`` in the benchmark's way (``ablations.machine.timing.interleave``: rounds of a few
steps, warm-up excluded; medians of per-round ratios). Machine noise that lasts longer than a round hits both
codes alike, which separate runs of ``python -m ablations.bench`` cannot promise. Sizes are section 11's (ViT-Tiny
width, depth 6, batch 32, fp32); ``--quick`` is a tiny model for a smoke test. Prints one line per model and one
"new/old" line per variant.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from statistics import median
from types import SimpleNamespace

# Imported where they are used, not here: torch and the model (lit_modules: torch). Each takes from a tenth of a
# second to seconds to import, and the command-line tools start without them.

ROOT = Path(__file__).resolve().parent.parent


def import_lit_modules(root: Path, alias: str) -> SimpleNamespace:
    """``VisionTransformer`` and ``RESIDUALS`` of ``root``'s ``lit_modules``, taken while ``root`` is first on
    ``sys.path``; its modules are then moved to ``alias.*`` in ``sys.modules`` (so that a second import finds
    another copy), and its classes keep their own module globals. The package resolves its contents lazily on
    every attribute access (by the name ``lit_modules``), so the objects are taken here, not through the package
    later, and every module loaded is checked to come from ``root``."""
    sys.path.insert(0, str(root))
    try:
        import lit_modules

        found = SimpleNamespace(VisionTransformer=lit_modules.VisionTransformer, RESIDUALS=lit_modules.RESIDUALS)
    finally:
        sys.path.pop(0)
    loaded = {n: m for n, m in sys.modules.items() if n == "lit_modules" or n.startswith("lit_modules.")}
    strays = [n for n, m in loaded.items()
              if getattr(m, "__file__", None) and not Path(m.__file__).resolve().is_relative_to(root.resolve())]
    if strays:
        raise SystemExit(f"error: {root}: {', '.join(sorted(strays))} came from another checkout (the installed "
                         "lit_modules?); run from a clean process with this repository's root first on the path")
    for name, module in loaded.items():
        sys.modules[f"{alias}.{name}"] = module
        del sys.modules[name]
    return found


def defined_in(cls: type, alias: str) -> str:
    """The file of a class of the checkout moved to ``alias`` (``inspect.getfile`` would look its module up by its
    original name, i.e. in whichever checkout holds that name now)."""
    return sys.modules[f"{alias}.{cls.__module__}"].__file__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", type=Path, help="a checkout (e.g. a git worktree) whose lit_modules is 'old'")
    parser.add_argument("--variants", default="mhc", help="comma-separated residual names (default: mhc)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per function and round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a tiny model, 2 rounds of 1 step (a smoke test)")
    args = parser.parse_args(argv)
    if not (args.baseline / "lit_modules").is_dir():
        parser.error(f"{args.baseline} has no lit_modules/ folder: give a checkout of this repository")

    import torch

    torch.set_num_threads(args.threads)
    old = import_lit_modules(args.baseline, "_ab_baseline")
    new = import_lit_modules(ROOT, "_ab_current")
    from ablations.bench.harness import Settings, random_batch
    from ablations.machine.timing import interleave, round_ratios, train_step

    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in new.RESIDUALS or v not in old.RESIDUALS]
    if unknown:
        parser.error(f"unknown residual(s) {', '.join(unknown)}; valid choices (in both checkouts): "
                     + ", ".join(sorted(set(new.RESIDUALS) & set(old.RESIDUALS))))
    s = Settings(embed_dim=16, num_heads=2, patch_size=8) if args.quick else Settings()
    size = s.vit(2 if args.quick else s.overhead_depth)
    rounds, steps = (2, 1) if args.quick else (args.rounds, args.steps)
    batch = random_batch(s, 4 if args.quick else s.overhead_batch)
    fns = {"standard": train_step(new.VisionTransformer("standard", {}, fused_attn=True, **size), batch)}
    for name in names:  # as section 11 builds them (ablations.bench.harness.ours): fused attention
        fns[f"{name} old"] = train_step(old.VisionTransformer(name, {}, fused_attn=True, **size), batch)
        fns[f"{name} new"] = train_step(new.VisionTransformer(name, {}, fused_attn=True, **size), batch)
    times = interleave(fns, reps=rounds, steps=steps, warmup=1, device="cpu")
    print(f"baseline {args.baseline} vs {ROOT}; {rounds} rounds x {steps} steps, {args.threads} thread(s)")
    for name in names:
        print(f"{name}: old {defined_in(old.RESIDUALS[name], '_ab_baseline')}, "
              f"new {defined_in(new.RESIDUALS[name], '_ab_current')}")
    for label in fns:
        ratios = round_ratios(times, label, "standard")
        print(f"{label:28s} {median(times[label]) * 1e3:8.1f} ms  vs standard {median(ratios):.3f}x "
              f"[{min(ratios):.2f}-{max(ratios):.2f}]")
    for name in names:
        ratios = round_ratios(times, f"{name} new", f"{name} old")
        print(f"{name} new/old {median(ratios):.3f}x [{min(ratios):.2f}-{max(ratios):.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
