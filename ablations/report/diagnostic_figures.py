"""The report's figures of the residual diagnostics (lit_modules.diagnostics), read from the selected runs' event
files (:mod:`ablations.report.events`): CaiT's branch/stream ratio and the skip's scale per layer, DeepViT's
cross-layer attention similarity (curves, the collapse count over depth, the L×L heat maps) and the variants' own
parameters over training."""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure

from lit_modules.diagnostics import DEFAULT_SIM_K, DEFAULT_TAU, SIMILAR_SHARE
from lit_modules.names import DIAGNOSTIC_TAGS

from .events import ATTN_SIM_JSON, RunEvents, run_events
from .load import BASELINE, best_per_row
from .model_tables import collapse_records
from .plot import colors, counted, integer_ticks, lines_vs_depth, log_scale_if_wide, new_figure, place_legends

SUBLAYER_ORDER = ("attn", "mlp", "block", "out")
SUBLAYER_NAMES = {"attn": "attention (SA)", "mlp": "MLP (FFN)", "block": "block", "out": "final GRN"}
SUBLAYER_STYLES = {"attn": "-", "mlp": "--", "block": ":", "out": "-."}
#: Parameter keys that are summaries of another key (drawn only through the main key) or DCA heat-map entries.
_SKIP_PARAM = re.compile(r"^(weight_\d+|.*_std|.*_abs_mean)$")


def _mean_lines(ax, series: Mapping[str, Mapping[int, list[float]]], variants: Sequence[str]) -> list[float]:
    """One line per variant: the mean over its runs at each layer, labelled with the number of runs."""
    palette = colors(variants)
    values = []
    for label in variants:
        per_layer = series.get(label)
        if not per_layer:
            continue
        layers = sorted(per_layer)
        y = [float(np.mean(per_layer[layer])) for layer in layers]
        values += y
        n = max(len(v) for v in per_layer.values())
        ax.plot(layers, y, color=palette[label], marker="o", ms=3, label=f"{label} (n={n})")
    integer_ticks(ax, [layer for per_layer in series.values() for layer in per_layer])
    ax.set_xlabel("block (0-based)")
    ax.grid(alpha=0.3)
    return values


def branch_ratio(events: Mapping[str, Sequence[RunEvents]], variants: Sequence[str], *, depth: int) -> Figure | None:
    """CaiT's figure, comparable across variants: top row ``ratio_mean`` = ‖what the branch adds‖ / ‖x‖ per layer;
    bottom row the skip's own scale (1 for an identity skip: Highway's 1 − t, LAuReL's β, Res-SE's s, ...); one
    panel per sublayer, one line per variant (mean over its runs, each at its last logged epoch). None when no
    run has the diagnostics."""
    kinds = {"ratio_mean": "‖branch‖ / ‖x‖  (CaiT ratio)", "skip_scale": "skip scale c  (x → c·x + branch)"}
    data: dict[str, dict[str, dict[str, dict[int, list[float]]]]] = {kind: {} for kind in kinds}
    for kind in kinds:
        for label in variants:
            for run in events.get(label, []):
                for sublayer, per_layer in run.per_site(kind).items():
                    for layer, value in per_layer.items():
                        data[kind].setdefault(sublayer, {}).setdefault(label, {}).setdefault(layer, []).append(value)
    if not data["ratio_mean"]:
        return None
    found = data["ratio_mean"]
    sublayers = [s for s in SUBLAYER_ORDER if s in found] + sorted(set(found) - set(SUBLAYER_ORDER))
    rows = [kind for kind in kinds if data[kind]]
    fig = new_figure(3.6 * len(sublayers), 2.8 * len(rows), legend=counted(variants))
    axes = fig.subplots(len(rows), len(sublayers), squeeze=False)
    for r, kind in enumerate(rows):
        for ax, sublayer in zip(axes[r], sublayers, strict=True):
            log_scale_if_wide(ax, _mean_lines(ax, data[kind].get(sublayer, {}), variants))
            ax.set_title(f"{SUBLAYER_NAMES.get(sublayer, sublayer)}")
            ax.set_ylabel(kinds[kind])
    place_legends(fig, [ax for row in axes for ax in row], variants, loc="best")
    fig.suptitle(f"branch / stream norm ratio and skip scale per layer (depth {depth}, last logged epoch)", fontsize=9)
    return fig


def similarity_curves(events: Mapping[str, Sequence[RunEvents]], variants: Sequence[str], *, depth: int,
                      k: int | None = None) -> Figure | None:
    """DeepViT's curves: mean attention-column similarity of block l with block l+1 (left) and with the K following
    blocks (right), one line per variant. None when no run logged them."""
    kinds = {"attn_sim_adj": "with block l+1", "attn_sim_k": f"with the next {k or 'K'} blocks"}
    series = {kind: {label: {} for label in variants} for kind in kinds}
    for kind in kinds:
        for label in variants:
            for run in events.get(label, []):
                for layer, value in run.per_layer(kind).items():
                    series[kind][label].setdefault(layer, []).append(value)
    if not any(per for per in series["attn_sim_adj"].values()):
        return None
    fig = new_figure(7.2, 3.0, legend=counted(variants))
    panels = fig.subplots(1, 2, squeeze=False)[0]
    for ax, (kind, title) in zip(panels, kinds.items(), strict=True):
        _mean_lines(ax, series[kind], variants)
        ax.set_ylim(0.0, 1.02)
        ax.set_title(f"similarity {title}")
        ax.set_ylabel("mean cosine similarity M")
    place_legends(fig, list(panels), variants, loc="best")
    fig.suptitle(f"attention collapse: cross-layer similarity (depth {depth}, last logged epoch)", fontsize=9)
    return fig


def similar_blocks_vs_depth(records: Sequence[Mapping], variants: Sequence[str], *, k: int | None,
                            tau: float, share: float) -> Figure:
    """DeepViT's collapse count over depth: mean ± sample std (error bars) of the number of similar blocks per
    variant (one line each), with the ceiling L − 1 (every block similar) dotted; ``records`` from
    :func:`ablations.report.model_tables.collapse_records`."""
    cells = [{"variant": r["variant"], "depth": r["depth"], "n": r["n"], "mean": r["similar_blocks"],
              "std": r["similar_blocks_std"]} for r in records if r["depth"] is not None and r["n"] > 0]
    fig = lines_vs_depth(cells, variants, ylabel="similar blocks (mean over seeds)",
                          title=f"attention collapse: blocks with > {share:g} of their columns at M > {tau:g}\n"
                                f"against the next {k or 'K'} blocks (project's definition), last logged epoch",
                          ceiling=True)
    fig.axes[0].set_ylim(bottom=-0.5)
    return fig


def attention_similarity(matrices: Mapping[str, np.ndarray], *, depth: int) -> Figure:
    """DeepViT's figure: the L×L cross-layer attention-column similarity, one heat map per variant."""
    labels = list(matrices)
    fig = new_figure(0.6 + 3.2 * len(labels), 3.2)
    axes = fig.subplots(1, len(labels), squeeze=False)[0]
    image = None
    for ax, label in zip(axes, labels, strict=True):
        m = np.asarray(matrices[label], dtype=float)
        image = ax.imshow(m, vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest", origin="upper")
        ax.set_title(label)
        ax.set_xlabel("layer q")
        ax.set_ylabel("layer p")
        ax.set_xticks(range(m.shape[1]))
        ax.set_yticks(range(m.shape[0]))
        if m.size <= 144:
            for i in range(m.shape[0]):
                for j in range(m.shape[1]):
                    if math.isfinite(m[i, j]):
                        ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=6,
                                color="w" if m[i, j] < 0.6 else "k")
    if image is not None:
        fig.colorbar(image, ax=list(axes), shrink=0.9, label="mean cosine similarity M")
    fig.suptitle(f"attention-column similarity between layers (depth {depth}, last logged epoch)", fontsize=9)
    return fig


def param_evolution(events: Mapping[str, Sequence[RunEvents]], variants: Sequence[str], *,
                    depth: int) -> Figure | None:
    """The variants' own parameters (γ, α, β, gate means, ...) over training: one panel per (variant, key), one
    line per (layer, sublayer), mean over the variant's runs. None when no variant logs parameters."""
    panels: list[tuple[str, str, dict[tuple[str, int], dict[int, list[float]]]]] = []
    for label in variants:
        per_key: dict[str, dict[tuple[str, int], dict[int, list[float]]]] = {}
        for run in events.get(label, []):
            for (sublayer, layer, key), values in run.params().items():
                if _SKIP_PARAM.match(key):
                    continue
                series = per_key.setdefault(key, {}).setdefault((sublayer, layer), {})
                for step, v in values.items():
                    series.setdefault(step, []).append(v)
        for key in sorted(per_key):
            panels.append((label, key, per_key[key]))
    if not panels:
        return None
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = new_figure(max(3.6 * ncols, 4.8), 0.4 + 2.8 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    cmap = colormaps["viridis"]
    for i, (label, key, series) in enumerate(panels):
        ax = axes[i // ncols][i % ncols]
        layers = sorted({layer for _, layer in series})
        values = []
        for sublayer, layer in sorted(series, key=lambda k: (k[1], _sub_rank(k[0]))):
            steps = sorted(series[sublayer, layer])
            x = [s + 1 for s in steps]  # step = 0-based epoch index -> epoch number
            y = [float(np.mean(series[sublayer, layer][s])) for s in steps]
            values += y
            shade = cmap(layers.index(layer) / max(1, len(layers) - 1) * 0.9)
            ax.plot(x, y, color=shade, ls=SUBLAYER_STYLES.get(sublayer, "-"), marker="." if len(x) < 4 else None,
                    label=f"{sublayer} {layer}")
        log_scale_if_wide(ax, values)
        ax.set_title(f"{label}: {key}")
        ax.set_xlabel("epoch")
        integer_ticks(ax, [s + 1 for steps in series.values() for s in steps])
        ax.grid(alpha=0.3)
        if len(series) <= 12:
            ax.legend(loc="best", fontsize=6)
    for j in range(len(panels), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    fig.suptitle(f"residual parameters over training (depth {depth}, mean over runs)\n"
                 "colour = block; solid attn, dashed mlp, dotted block", fontsize=8)
    return fig


def _sub_rank(sublayer: str) -> int:
    return SUBLAYER_ORDER.index(sublayer) if sublayer in SUBLAYER_ORDER else len(SUBLAYER_ORDER)


def diagnostic_figures(data, selected: Mapping[str, Sequence], cells, depth: int, top: int | None,
                       keep: Callable[[Figure, str], None]) -> list[str]:
    """Every diagnostic figure of a report, handed to ``keep`` (figure, name) in order, from the event files of the
    ``selected`` runs per row (all seeds at depth ``top`` for a grid, the best trial per row for a search; ``depth``
    is the one the figures name); returns the notes on figures skipped and on what the figures read."""
    notes = []
    variants = data.rows
    events = {row: [e for e in (run_events(r) for r in runs) if not e.empty] for row, runs in selected.items()}
    fig = branch_ratio(events, variants, depth=depth)
    if fig is None:
        notes.append(f"figure branch_ratio skipped: no {_tag('ratio_mean')} tags in the event files (depth {depth}).")
    else:
        keep(fig, "branch_ratio")
    fig = similarity_curves(events, variants, depth=depth, k=data.config_value("diagnostics_sim_k"))
    if fig is not None:
        keep(fig, "attn_similarity_curves")
    records = collapse_records(data) if data.kind == "grid" else []
    if records:
        keep(similar_blocks_vs_depth(records, variants, k=data.config_value("diagnostics_sim_k", DEFAULT_SIM_K),
                                     tau=DEFAULT_TAU, share=SIMILAR_SHARE), "similar_blocks_vs_depth")
    matrices = _similarity_matrices(data, events, cells, top)
    if matrices:
        keep(attention_similarity(matrices, depth=depth), "attn_similarity")
    else:
        notes.append(f"figure attn_similarity skipped: no {ATTN_SIM_JSON} text in the event files.")
    fig = param_evolution(events, variants, depth=depth)
    if fig is None:
        notes.append(f"figure param_evolution skipped: no variant logged {_tag('param')} tags.")
    else:
        keep(fig, "param_evolution")
    if data.kind == "grid" or selected:
        which = "best trial per variant" if data.kind == "search" else "all seeds"
        notes.append(diagnostics_note(which, depth, found=sum(map(len, events.values())),
                                      total=sum(map(len, selected.values()))))
    return notes

def diagnostics_note(which: str, depth: int, *, found: int, total: int) -> str:
    """The report's note on what the diagnostic figures read: ``found`` of the ``total`` selected runs at
    ``depth`` have diagnostics, in their event files or carried in their runs.csv row (a run imported with
    ``--import-runs``: :func:`ablations.report.events.run_events`). A run imported from a runs.csv written without
    them or whose folder was removed has none, and neither has a run trained with ``diagnostics_every: 0``: the
    note says how many the figures stand on instead of "all"."""
    if total == 0:
        return f"no diagnostic figures at depth {depth}: no run there."
    if found == 0:
        return (f"no diagnostic figures at depth {depth}: none of its {total} runs has diagnostics in its event "
                "files or runs.csv row (diagnostics_every 0, runs imported from a runs.csv without them, or their folders removed).")
    if found < total:
        return (f"diagnostic figures use {found} of the {total} runs ({which}) at depth {depth}, the ones whose event "
                "files or runs.csv rows hold diagnostics (the others ran with diagnostics_every 0, were imported from a "
                "runs.csv without them or had their folders removed), last logged epoch.")
    return f"diagnostic figures use {which} at depth {depth}, last logged epoch."


def _tag(name: str) -> str:
    """The diagnostics tag family ``name`` (``lit_modules.names.DIAGNOSTIC_TAGS``) up to its first placeholder."""
    return DIAGNOSTIC_TAGS[name].split("/{", 1)[0]


def _similarity_matrices(data, events: Mapping[str, Sequence[RunEvents]], cells, depth: int | None) -> dict:
    """Mean (over the selected runs) attention-similarity matrix of the baseline (standard, else the first
    variant) and of the best other variant (highest mean accuracy at that depth)."""
    mats = {}
    for row, evs in events.items():
        found = [m for m in (e.json_matrix() for e in evs) if m is not None]
        shapes = {np.asarray(m[1]).shape for m in found}
        if found and len(shapes) == 1:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                mats[row] = np.nanmean(np.stack([np.asarray(m[1], dtype=float) for m in found]), axis=0)
    if not mats:
        return {}
    order = [r for r in data.rows if r in mats]
    base = next((r for r in order if data.row_variant[r] == BASELINE), order[0])
    if data.kind == "grid" and cells is not None:
        score = {c.row: c.mean for c in cells if c.depth == depth}
    else:
        score = {row: run.acc for row, run in best_per_row(data).items()}
    others = [r for r in order if r != base and score.get(r) is not None]
    chosen = {f"{base} (baseline)": mats[base]}
    if others:
        top = max(others, key=lambda r: (score[r], -order.index(r)))
        chosen[f"{top} (best)"] = mats[top]
    return chosen
