"""Parameter and FLOP overhead of each residual variant vs ``standard``.

    python -m ablations.costs                    # ViT-Tiny width on 32×32 (embed 192, depth 12, 3 heads, patch 4)
    python -m ablations.costs --depth 24 --json  # any size; JSON instead of Markdown

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` on one forward pass with explicit attention
(the counter has no formula for the CPU SDPA kernel and would silently leave attention out). The counter
counts matrix products (mm/bmm/addmm/einsum/SDPA) only: elementwise work — LayerScale's γ⊙f, ReZero's α·f,
the gates' sigmoids — is not counted, so such variants show 0 FLOPs overhead although they cost memory traffic.
One exception: ``addcmul`` counts 2 FLOPs per output element, because DenseFormer's and Attention Residuals'
weighted sums over depth are chains of it (``lit_modules.residual.depth.weighted_sum``); without it those variants'
sums would vanish from the count. (A sum of t terms is t multiplies and t − 1 adds, 2tND − ND FLOPs for N tokens of
width D.) Hyper-Connections' and mHC's outer product write ⊗ f is a matmul, counted as one.
Besides the residual variants, ``BACKBONE_FORMS`` prices the mechanisms orthogonal to them (attention kind,
CaiT's class-attention head, norm layer, value residual, QK-norm, the attention's output gate, the
parametrisation) on the standard residual.

The last column is the measured train-step time against ``standard`` from a benchmark report
(``python -m ablations.bench --sections variants``, which times the same configurations at the same default size):
``--bench`` names its ``bench.json`` (default ``results/bench.json``). A row the report does not have, or a report
of another model size, shows "—" and a note says why.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from lit_modules.config import ViTConfig

from .cli import OneLineParser, fail, markdown_table

# Imported where they are used, not here: the model (lit_modules: torch) and torch. Each takes from a tenth of a
# second to seconds to import, and the command-line tools start without them.

#: (label, residual, options) of the alternatives worth pricing besides every registered variant's default.
EXTRA_FORMS: tuple[tuple[str, str, dict], ...] = (
    ("rezero norm=True (LN control)", "rezero", {"norm": True}),
    ("laurel rw", "laurel", {"form": "rw"}),
    ("laurel rw_lr_pa r=16 k=3", "laurel", {"form": "rw_lr_pa"}),
    ("laurel seed (per-channel gate)", "laurel", {"form": "seed"}),
    ("res_se seed (x + SE(x) + F)", "res_se", {"form": "seed"}),
    ("dca k=2", "dca", {"k": 2}),
    ("dca grn_v3", "dca", {"form": "grn_v3"}),
    ("dca seed (per-token mix)", "dca", {"form": "seed"}),
    ("denseformer 2x2 (dilation 2, period 2)", "denseformer", {"dilation": 2, "period": 2}),
    ("attn_res num_blocks=4 (Block AttnRes)", "attn_res", {"num_blocks": 4}),  # divides 2·depth at even depths
    ("hyper_connections static (SHC, n=4)", "hyper_connections", {"dynamic": False, "n": 4}),
    ("hyper_connections n=4 (DHC, the paper's LM rate)", "hyper_connections", {"n": 4}),  # the default is n = 2
    ("mhc n=2", "mhc", {"n": 2}),
    ("gpas gate=sublayer", "gpas", {"gate": "sublayer"}),
    ("deep_delta value=sigmoid (the code's v = 4σ(w·x + b))", "deep_delta", {"value": "sigmoid"}),
    ("deep_delta value=constant (v = 2)", "deep_delta", {"value": "constant"}),
    ("hybrid_norm first_block=pre_norm (HybridNorm*)", "hybrid_norm", {"first_block": "pre_norm"}),
    ("kromhc n=8", "kromhc", {"n": 8}),
    ("muddformer hidden=exact", "muddformer", {"hidden": "exact"}),
    ("muddformer static (dynamic=False)", "muddformer", {"dynamic": False}),
)

#: (label, backbone options) of the mechanisms orthogonal to the residual, priced with the standard residual.
BACKBONE_FORMS: tuple[tuple[str, dict], ...] = (
    ("re_attention (head_norm=batch)", {"attention": "re_attention"}),
    ("class_attention_blocks=2 (CaiT head)", {"class_attention_blocks": 2}),
    ("norm_layer=rmsnorm", {"norm_layer": "rmsnorm"}),
    ("norm_layer=dyt (Dynamic Tanh)", {"norm_layer": "dyt"}),
    ("norm_layer=derf (Dynamic erf)", {"norm_layer": "derf"}),
    ("value_residual=fixed (ResFormer, 0.5/0.5)", {"value_residual": "fixed"}),
    ("value_residual=learned (ResFormer)", {"value_residual": "learned"}),
    ("qk_norm=rmsnorm (ViT-5)", {"qk_norm": "rmsnorm"}),
    ("attention_gate=elementwise (Gated Attention)", {"attention_gate": "elementwise"}),
    ("attention_gate=headwise", {"attention_gate": "headwise"}),
    ("norm_layer=seednorm (SeeDNorm)", {"norm_layer": "seednorm"}),
    ("parametrization=completep (CompleteP)", {"parametrization": "completep"}),
)


def default_configs() -> tuple[tuple[str, str, dict], ...]:
    """Every variant of the registry at its default (discovered, not listed), then ``EXTRA_FORMS``."""
    from lit_modules import RESIDUALS

    return tuple((name if name == "standard" else f"{name} (default)", name, {}) for name in RESIDUALS) + EXTRA_FORMS


def all_configs() -> tuple[tuple[str, str, dict, dict], ...]:
    """(label, residual, options, backbone options): ``default_configs()``, then ``BACKBONE_FORMS`` on ``standard``."""
    return (tuple((label, res, opts, {}) for label, res, opts in default_configs())
            + tuple((label, "standard", {}, kw) for label, kw in BACKBONE_FORMS))


def measure(cfg: ViTConfig | str, options: dict | None = None, **fields: Any) -> dict:
    """Parameters and forward FLOPs (batch 1) of one backbone: a :class:`lit_modules.config.ViTConfig`, or a
    residual name with its options and any other fields (``ViTConfig.build``; unnamed fields keep the config's
    defaults). Built and run on the meta device: shapes only, no weights drawn and no arithmetic done (the counts
    equal a CPU model's for every form of ``all_configs``; a ViT-S of depth 24 is counted in a third of the time)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from lit_modules import VisionTransformer

    cfg = ViTConfig.build(cfg, options, **fields).replace(fused_attn=False)  # the counter has no SDPA formula
    with torch.device("meta"):
        model = VisionTransformer(cfg, init_seed=0).eval()
        counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.addcmul: _multiply_add_flops})
        with counter:  # (not under no_grad: the counter's module tracker needs grad_fns)
            model(torch.zeros(1, cfg.in_chans, cfg.img_size, cfg.img_size))
    return {"params": sum(p.numel() for p in model.parameters()), "flops": counter.get_total_flops()}


def _multiply_add_flops(*shapes: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """``addcmul`` (out = a + b·c): one multiply and one add per output element, as a matrix product counts them."""
    return 2 * math.prod(out_shape)


def cost_table(size: ViTConfig | None = None, configs=None) -> list[dict]:
    """One row per config (default: ``all_configs()``): (label, residual, options, backbone options), each on the
    backbone ``size`` (default: ``ViTConfig()``, timm's ViT-Tiny at 32 px)."""
    size = size or ViTConfig()
    rows = [{"variant": label, "residual": res, "options": opts, "backbone": kw,
             **measure(size.replace(residual=res, residual_options=opts, **kw))}
            for label, res, opts, kw in (all_configs() if configs is None else configs)]
    base = next(r for r in rows if r["residual"] == "standard" and not r["backbone"])
    for r in rows:
        r["params_overhead_pct"] = 100.0 * (r["params"] - base["params"]) / base["params"]
        r["flops_overhead_pct"] = 100.0 * (r["flops"] - base["flops"]) / base["flops"]
    return rows


def bench_step_times(path: Path, size: dict) -> tuple[dict[str, dict], str]:
    """Each label's measured train-step ratio vs standard from a bench report, and a note on where it came from.

    Empty (with the reason) when the file is missing, has no variants section, or timed another model size."""
    if not path.is_file():
        return {}, f"no benchmark report at {path}: run `python -m ablations.bench --sections variants`"
    report = json.loads(path.read_text())
    section = report.get("sections", {}).get("variants")
    if not section or section.get("error") or not section.get("data"):
        return {}, f"{path} has no variants section: run `python -m ablations.bench --sections variants`"
    settings = report["meta"]["settings"]
    timed = {"embed_dim": settings["embed_dim"], "depth": settings["variant_depth"], "num_heads": settings["num_heads"],
             "img_size": settings["img_size"], "patch_size": settings["patch_size"]}
    wanted = {k: size[k] for k in timed}
    if timed != wanted:
        return {}, f"{path} timed another size ({timed}, this table: {wanted})"
    meta = report["meta"]
    load = meta["machine"]["loadavg_start"]
    load = load[0] if isinstance(load, (list, tuple)) else load
    note = (f"Step time: `python -m ablations.bench` ({meta['mode']} mode, {meta['started']}, "
            f"{meta['machine']['threads']} threads, 1-min load average {load:.2f} at the start), batch "
            f"{settings['batch']}, "
            + ("bf16-autocast train step (forward, backward, AdamW) on CUDA" if settings.get("device") == "cuda"
               else "fp32 train step (forward, backward, AdamW) on the CPU")
            + "; the median over rounds of "
            "the paired in-round ratio to standard, [smallest–largest round].")
    return section["data"]["variants"], note


def step_time_cell(entry: dict | None) -> str:
    if entry is None:
        return "—"
    ratios = entry.get("time_ratios") or [entry["time_ratio"]]
    return f"{entry['time_ratio']:.2f}× [{min(ratios):.2f}–{max(ratios):.2f}]"


def to_markdown(rows: list[dict], step_times: dict[str, dict] | None = None) -> str:
    headers = ["variant", "params", "+params vs standard", "forward GFLOPs (batch 1)", "+FLOPs vs standard"]
    body = [[r["variant"], f"{r['params']:,}", f"{r['params_overhead_pct']:+.2f}%", f"{r['flops'] / 1e9:.4f}",
             f"{r['flops_overhead_pct']:+.2f}%"] for r in rows]
    if step_times is not None:
        headers.append("step time vs standard")
        for line, r in zip(body, rows, strict=True):
            line.append(step_time_cell(step_times.get(r["variant"])))
    return markdown_table(headers, body, "l" + "r" * (len(headers) - 1))


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m ablations.costs", description=__doc__.splitlines()[0])
    default = ViTConfig()
    for name in ("embed_dim", "depth", "num_heads", "img_size", "patch_size"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(default, name),
                            help=f"(default: {getattr(default, name)}, lit_modules.config.ViTConfig's)")
    parser.add_argument("--bench", type=Path, default=Path("results/bench.json"),
                        help="benchmark report whose measured step times fill the last column "
                             "(default: results/bench.json)")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a Markdown table")
    args = parser.parse_args(argv)
    size = dict(embed_dim=args.embed_dim, depth=args.depth, num_heads=args.num_heads, img_size=args.img_size,
                patch_size=args.patch_size)
    try:  # the report first: a bad one fails before the table's models are counted
        step_times, note = bench_step_times(args.bench, size)
    except (OSError, KeyError, TypeError, AttributeError, ValueError) as exc:  # ValueError: not JSON
        fail(f"cannot read the benchmark report {args.bench}: {exc!r}")
    try:
        rows = cost_table(ViTConfig(**size))
    except ValueError as exc:
        fail(str(exc))
    for r in rows:
        entry = step_times.get(r["variant"])
        r["step_time_ratio"] = entry["time_ratio"] if entry else None
    print(json.dumps(rows, indent=1) if args.json else f"{to_markdown(rows, step_times)}\n\n{note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
