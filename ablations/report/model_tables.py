"""Tables read from each run's TensorBoard events and model: attention collapse (DeepViT), the composite gain of
the stream mixing (Hyper-Connections, mHC) and the cost table (parameters, FLOPs, measured step time)."""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lit_modules.config import FIELDS as MODEL_FIELDS
from lit_modules.config import GEOMETRY
from lit_modules.names import DIAGNOSTIC_TAGS

from .. import layout
from ..costs import measure
from .events import ATTN_ENTROPY_MEAN, ATTN_SIM_ADJ_MEAN, SIMILAR_BLOCKS, RunEvents, run_events
from .format import Column, Table, fmt_param, frame, num, status_notes
from .load import (
    PARAMS_KEY,
    THROUGHPUT_KEY,
    Run,
    StudyData,
    finite,
    first_line,
    mean_of,
)

# Imported where they are used, not here: the model (lit_modules: torch) and the datasets (data: torch). Each takes
# from a tenth of a second to seconds to import, and the command-line tools start without them.

# --- attention collapse (DeepViT) ------------------------------------------------------------------------------------
COLLAPSE_KEYS = ["variant", "depth", "n", "similar_blocks", "similar_blocks_std", "similar_blocks_fraction",
                 "attn_sim_adj_mean", "attn_entropy_mean", "epochs"]


def collapse_records(data: StudyData, events: Mapping[int, RunEvents] | None = None) -> list[dict[str, Any]]:
    """One record per row × depth of a grid study: the number of similar blocks (``diag/similar_blocks``) of each ok
    run at its last logged epoch — mean, sample sd and n over the runs that logged it — the mean fraction
    count / (depth − 1), and the means of ``diag/attn_sim_adj_mean`` and ``diag/attn_entropy_mean`` at that epoch.
    ``events`` maps trial number -> RunEvents (default: each run's event files). Empty when no run logged it."""
    records, found = [], False
    for row in data.rows:
        for depth in data.depths or [None]:
            counts, fractions, adj, entropy, epochs = [], [], [], [], set()
            for run in data.by_row_depth(row, depth):
                if not run.ok:
                    continue
                ev = events.get(run.number, RunEvents()) if events is not None else run_events(run)
                last = ev.last_value(SIMILAR_BLOCKS)
                if last is None:
                    continue
                step, count = last
                counts.append(count)
                epochs.add(step + 1)
                if run.depth is not None and run.depth > 1:
                    fractions.append(count / (run.depth - 1))
                for tag, sink in ((ATTN_SIM_ADJ_MEAN, adj), (ATTN_ENTROPY_MEAN, entropy)):
                    if step in ev.scalars.get(tag, {}):
                        sink.append(ev.scalars[tag][step])
            found = found or bool(counts)
            records.append({"variant": row, "depth": depth, "n": len(counts), "similar_blocks": mean_of(counts),
                            "similar_blocks_std": statistics.stdev(counts) if len(counts) >= 2 else None,
                            "similar_blocks_fraction": mean_of(fractions), "attn_sim_adj_mean": mean_of(adj),
                            "attn_entropy_mean": mean_of(entropy), "epochs": sorted(epochs)})
    return records if found else []


def similar_text(rec: Mapping[str, Any], style: str) -> str:
    """A collapse cell: ``mean ± sd (n=k)`` similar blocks."""
    if rec["similar_blocks"] is None:
        return "—" if style == "md" else "---"
    pm = " ± " if style == "md" else r" $\pm$ "
    sd = pm + num(rec["similar_blocks_std"], ".2f") if rec["similar_blocks_std"] is not None else ""
    return f"{num(rec['similar_blocks'], '.2f')}{sd} (n={rec['n']})"


def collapse_table(data: StudyData, records: Sequence[Mapping[str, Any]]) -> Table:
    """DeepViT's collapse count per variant (rows) and depth (column groups), from :func:`collapse_records`."""
    from lit_modules.diagnostics import DEFAULT_SIM_K, DEFAULT_TAU, SIMILAR_SHARE

    k = data.config_value("diagnostics_sim_k", DEFAULT_SIM_K)
    epochs = sorted({e for rec in records for e in rec["epochs"]})
    at = (f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {epochs[0]}–{epochs[-1]}") if epochs else "—"
    columns = [Column("variant", "variant"),
               Column("similar_blocks", "similar blocks, depth {depth}", render=similar_text, per_depth=True,
                      sub="similar blocks"),
               Column("attn_sim_adj_mean", "adj. sim., depth {depth}", fmt=".3f", per_depth=True,
                      sub="adj. sim.")]
    csv_cols = [("variant", "variant", ""), ("depth", "depth", ""), ("n", "n", ""),
                ("similar_blocks", "similar_blocks_mean", ".4f"), ("similar_blocks_std", "similar_blocks_std", ".4f"),
                ("similar_blocks_fraction", "similar_blocks_fraction_mean", ".4f"),
                ("attn_sim_adj_mean", "attn_sim_adj_mean", ".6f"), ("attn_entropy_mean", "attn_entropy_mean", ".6f"),
                ("epochs", "epochs", "")]
    caption = (f"Attention collapse (DeepViT) in study {data.name}: the number of similar blocks per variant and "
               f"depth at each run's last logged epoch ({at}), mean ± sample sd over the ok runs that logged it (n). "
               f"Project's definition (diag/similar_blocks): block l (0 ≤ l < L−1) is similar when more than "
               f"{SIMILAR_SHARE:g} of the cosine similarities M between its attention columns and those of the "
               f"K = {k if k is not None else 'per-run'} following blocks (over images, heads, tokens and those "
               f"blocks) exceed τ = {DEFAULT_TAU:g}. This is the project's reading of DeepViT's count: the paper's "
               f"exact τ, K and share were not retrieved (it reports 5 / 11 / 16 similar blocks for a plain ViT at "
               f"16 / 24 / 32 blocks and none with Re-attention). adj. sim. = mean over the runs of "
               f"diag/attn_sim_adj_mean (mean M between adjacent blocks). A depth-1 model has no following block (—). "
               f"Near-uniform attention makes M ≈ 1 trivially: read it beside the attention entropy (CSV "
               f"attn_entropy_mean, 1 = uniform).")
    return Table("collapse", f"{data.name}: attention collapse (similar blocks) by depth", caption,
                 frame(records, COLLAPSE_KEYS), columns, csv_cols, status_notes(data))


# --- composite gain of the stream mixing (Hyper-Connections, mHC) ----------------------------------------------------
GAIN_TAGS = {"forward": DIAGNOSTIC_TAGS["composite_gain_forward"], "backward": DIAGNOSTIC_TAGS["composite_gain_backward"]}
GAIN_KEYS = ["variant", "depth", "n", "forward", "forward_std", "forward_max", "backward", "backward_std",
             "backward_max", "epochs"]


def gain_records(data: StudyData, events: Mapping[int, RunEvents] | None = None) -> list[dict[str, Any]]:
    """One record per row × depth of a grid study: the composite gain of the stream mixing (forward and backward,
    ``lit_modules.diagnostics.composite_gain``) of each ok run at its last logged epoch — mean, sample sd, largest
    value and n over the runs that logged it. Empty when no run logged it (no multi-stream variant)."""
    records, found = [], False
    for row in data.rows:
        for depth in data.depths or [None]:
            values: dict[str, list[float]] = {k: [] for k in GAIN_TAGS}
            epochs = set()
            for run in data.by_row_depth(row, depth):
                ev = (events.get(run.number, RunEvents()) if events is not None else run_events(run)) \
                    if run.ok else RunEvents()
                last = {k: ev.last_value(tag) for k, tag in GAIN_TAGS.items()}
                if any(v is None for v in last.values()):
                    continue
                for key, (step, value) in last.items():
                    values[key].append(value)
                    epochs.add(step + 1)
            found = found or bool(values["forward"])
            rec: dict[str, Any] = {"variant": row, "depth": depth, "n": len(values["forward"]),
                                   "epochs": sorted(epochs)}
            for key, vs in values.items():
                rec |= {key: mean_of(vs), f"{key}_std": statistics.stdev(vs) if len(vs) >= 2 else None,
                        f"{key}_max": max(vs, default=None)}
            records.append(rec)
    return records if found else []


def gain_text(key: str) -> Callable[[Mapping[str, Any], str], str]:
    """A gain cell: ``mean ± sd (max m)``."""
    def render(rec: Mapping[str, Any], style: str) -> str:
        if rec[key] is None:
            return "—" if style == "md" else "---"
        pm = " ± " if style == "md" else r" $\pm$ "
        sd = pm + num(rec[f"{key}_std"], ".3g") if rec[f"{key}_std"] is not None else ""
        return f"{num(rec[key], '.3g')}{sd} (max {num(rec[f'{key}_max'], '.3g')})"
    return render


def gain_table(data: StudyData, records: Sequence[Mapping[str, Any]]) -> Table:
    """The composite gain of the stream mixing per variant (rows) and depth (column groups)."""
    epochs = sorted({e for rec in records for e in rec["epochs"]})
    at = (f"epoch {epochs[0]}" if len(epochs) == 1 else f"epochs {epochs[0]}–{epochs[-1]}") if epochs else "—"
    columns = [Column("variant", "variant"),
               Column("forward", "forward gain, depth {depth}", render=gain_text("forward"), per_depth=True,
                      sub="forward gain"),
               Column("backward", "backward gain, depth {depth}", render=gain_text("backward"), per_depth=True,
                      sub="backward gain")]
    csv_cols = [(k, k, ".6g" if k not in ("variant", "depth", "n", "epochs") else "") for k in GAIN_KEYS]
    caption = (f"Composite gain of the residual-stream mixing in study {data.name}, per variant and depth, at each "
               f"run's last logged epoch ({at}): with M_k the n×n stream-mixing matrix of site k (Hyper-Connections' "
               f"A_r, mHC's H_res; for the input-dependent forms its mean over the fixed diagnostic batch's images and "
               f"tokens), G = M_2L ⋯ M_1 over every attention and MLP site; forward gain = the largest absolute row "
               f"sum of G, backward gain = the largest absolute column sum (both 1 for identity or doubly stochastic "
               f"mixing). mean ± sample sd (max over runs) over the ok runs that logged it (n in the CSV). mHC's "
               f"claim: its gain stays near 1 (the paper reports ≈ 1.6 at 27B scale) where HC's grows (up to ~3000). "
               f"Variants without stream mixing (a single stream) log no gain (—).")
    return Table("mixing", f"{data.name}: composite gain of the stream mixing by depth", caption,
                 frame(records, GAIN_KEYS), columns, csv_cols, status_notes(data))


# --- cost ----------------------------------------------------------------------------------------------------------
_DIM_RE = re.compile(r"^(img_size|in_chans|num_classes|patch_size|mlp_ratio): *([0-9.]+) *$", re.M)


def model_dims(run: Run) -> dict[str, Any]:
    """img_size / in_chans / num_classes / patch_size of the trained model: from the run's ``hparams.yaml``
    (what was trained), else from the dataset's DataModule (cheap: constructed, not set up)."""
    dims: dict[str, Any] = {}
    if run.log_dir is not None and (run.log_dir / layout.HPARAMS).is_file():
        for key, value in _DIM_RE.findall((run.log_dir / layout.HPARAMS).read_text()):
            dims[key] = float(value) if key == "mlp_ratio" else int(float(value))
    if not {"img_size", "in_chans", "num_classes"} <= set(dims):
        try:
            import data as datasets

            dm = datasets.build_datamodule(run.config.get("dataset", "digits"), data_dir=run.config.get("data_dir"),
                                           **(run.config.get("dataset_options") or {}))
            dims.update(img_size=dm.img_size, in_chans=dm.in_chans, num_classes=dm.num_classes)
            dims.setdefault("patch_size", run.config.get("patch_size") or getattr(dm, "default_patch_size", 4))
        except Exception:  # noqa: BLE001 - e.g. a folder dataset whose data_dir is not on this machine
            return dims
    if run.config.get("patch_size"):
        dims.setdefault("patch_size", run.config["patch_size"])
    return dims


def representatives(data: StudyData, top_depth: int | None) -> dict[str, Run]:
    """Per row of a grid study the run whose stored config prices it: at the largest depth (a run at another
    depth is re-priced at ``top_depth``), lowest seed, lowest trial number."""
    chosen = {}
    for row in data.rows:
        runs = sorted((r for r in data.runs if r.row == row and r.config), key=lambda r: (
            r.depth != top_depth, -(r.depth or 0), r.seed if r.seed is not None else -1, r.number))
        if runs:
            rep = runs[0]
            if rep.depth != top_depth and top_depth is not None:
                rep = Run(**{**rep.__dict__, "depth": top_depth, "config": {**rep.config, "depth": top_depth}})
            chosen[row] = rep
    return chosen


def priced_by_study_file(representative: dict[str, Run], spec) -> dict[str, Run]:
    """Representatives read from a runs.csv (which holds no model size), each given the model the study file builds
    at its point, as a trial stores it (``layout.MODEL_KEY``), so the cost table prices them as a storage's report
    does. A run whose residual or options differ from what the file builds there now (an earlier form), or whose row
    the file no longer has, is left as it is: the table notes it unmeasured rather than price another model; a
    model whose size changed since is priced and the table notes that its parameters differ from the trained
    runs'."""
    import data as datasets

    out = {}
    for row, run in representative.items():
        point = {"variant": run.variant, "depth": run.depth, "seed": run.seed, "lr": run.config.get("lr"),
                 **dict(run.extras)}
        try:
            config = spec.run_config({k: v for k, v in point.items() if v is not None})
        except (KeyError, ValueError):  # a row the study file no longer has, or no longer builds
            out[row] = run
            continue
        model = config.model_config(datasets.dataset_shape(config)).to_dict()
        out[row] = (Run(**{**run.__dict__, "summary": {**run.summary, layout.MODEL_KEY: model}})
                    if config.same_residual(run.config) else run)
    return out


def cost_table(data: StudyData, representative: dict[str, Run], *, depth_note: str, from_file: bool = False) -> Table:
    """Params and forward FLOPs (``costs.measure``, batch 1) of each row's representative config (as the trial
    stored it; ``from_file``: as :func:`priced_by_study_file` gave it, a runs.csv holding no model) vs the same config
    with the standard residual; measured train images/s (mean over the row's completed runs at that depth)."""
    cache: dict[tuple, dict] = {}
    records, notes = [], []
    for row in data.rows:
        run = representative.get(row)
        if run is None:
            continue
        cfg = run.config
        residual = cfg.get("residual", run.variant)
        options = dict(cfg.get("residual_options") or {})
        try:
            size = _backbone(run)
            own = _measure(measure, cache, residual, options, size)
            base = _measure(measure, cache, "standard", {}, size)
        except Exception as exc:  # noqa: BLE001 - one unmeasurable row must not stop the report
            own = base = None
            notes.append(f"{row}: not measured ({first_line(exc)}).")
        same_depth = [r for r in data.runs if r.row == row and r.depth == run.depth and r.state == "complete"]
        trained = mean_of(r.summary.get(PARAMS_KEY) for r in same_depth)
        if own and trained is not None and round(trained) != own["params"]:  # e.g. the study file changed since
            notes.append(f"{row}: priced at {own['params']:,} parameters, its trained runs had {round(trained):,}: "
                         "the model priced is not the one trained.")
        records.append({
            "variant": row, "residual": residual,
            "options": ", ".join(f"{k}={fmt_param(v)}" for k, v in sorted(options.items())),
            "params": own["params"] if own else None, "flops": own["flops"] if own else None,
            "params_overhead_pct": 100.0 * (own["params"] - base["params"]) / base["params"] if own and base else None,
            "flops_overhead_pct": (100.0 * (own["flops"] - base["flops"]) / base["flops"]
                                   if own and base and base["flops"] else None),
            "trained_params": round(trained) if trained is not None else None,
            "train_images_per_s": mean_of(r.summary.get(THROUGHPUT_KEY) for r in same_depth),
            "n": sum(1 for r in same_depth if finite(r.summary.get(THROUGHPUT_KEY))),
        })
    columns = [Column("variant", "variant"), Column("residual", "residual"), Column("options", "options"),
               Column("params", "params", fmt=","), Column("params_overhead_pct", "+params vs standard", fmt="+.2f",
                                                           suffix="%"),
               Column("flops", "forward MFLOPs", fmt=".3f", scale=1e-6),
               Column("flops_overhead_pct", "+FLOPs vs standard", fmt="+.2f", suffix="%"),
               Column("trained_params", "trained params", fmt=","), Column(THROUGHPUT_KEY, "train img/s", fmt=".0f"),
               Column("n", "n", fmt="d")]
    keys = ["variant", "residual", "options", "params", "params_overhead_pct", "flops", "flops_overhead_pct",
            "trained_params", THROUGHPUT_KEY, "n"]
    fmts = {"params_overhead_pct": ".4f", "flops_overhead_pct": ".4f", THROUGHPUT_KEY: ".2f"}
    caption = (f"Cost per variant {depth_note}: parameters and forward FLOPs (batch 1, matrix products only; "
               "torch FlopCounterMode via ablations.costs.measure) of the variant's own configuration ("
               + ("as the study file builds it at the trial's point, a runs.csv holding no model size" if from_file
                  else "as its trial stored it")
               + "), overhead vs the same configuration with the standard residual; trained params = "
               "param_count of the trained runs (run summary); train img/s = measured training throughput, mean over "
               "the variant's completed runs at that depth (n).")
    return Table("cost", f"{data.name}: cost", caption, frame(records, keys), columns,
                 [(k, k, fmts.get(k, "")) for k in keys], notes)


def _backbone(run: Run) -> dict[str, Any]:
    """The fields of the run's backbone other than its residual, at the run's depth: the resolved model config the
    trial stored (``model``), else (trials before it was stored) the model fields of its stored ``RunConfig`` with
    the geometry from :func:`model_dims`. ValueError when the size cannot be told."""
    stored = run.summary.get(layout.MODEL_KEY)
    if isinstance(stored, dict):
        size = {k: v for k, v in stored.items() if k in MODEL_FIELDS}
    else:
        dims = model_dims(run)
        size = {k: v for k, v in run.config.items() if k in MODEL_FIELDS and v is not None} | {
            k: dims.get(k) for k in GEOMETRY}
        if any(size.get(k) is None for k in (*GEOMETRY, "embed_dim", "num_heads")):
            raise ValueError("model size unknown (no hparams.yaml and the dataset cannot be constructed)")
    size["depth"] = run.depth or size.get("depth")
    for key in ("residual", "residual_options", "fused_attn"):
        size.pop(key, None)
    return size


def _measure(measure, cache: dict, residual: str, options: dict, size: dict) -> dict:
    key = (residual, repr(sorted(options.items())), repr(sorted(size.items())))
    if key not in cache:
        cache[key] = measure(residual, options, **size)
    return cache[key]
