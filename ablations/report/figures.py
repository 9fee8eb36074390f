"""Static figures of the report (matplotlib, Agg, no pyplot state except for Optuna's own matplotlib plots).

Every figure is saved as PNG and PDF with fixed metadata (no creation date, fixed ``svg.hashsalt``), so the same
inputs give the same files. The drawing functions take plain data; :func:`report_figures` prepares it from a
study's results (:mod:`ablations.report`) and the trials' event files (:mod:`ablations.report.events`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from .events import ATTN_SIM_JSON, RunEvents  # noqa: E402

RC = {"svg.hashsalt": "ablations-report", "font.size": 8, "axes.titlesize": 9, "legend.fontsize": 7,
      "figure.dpi": 100, "savefig.dpi": 150, "pdf.fonttype": 42}
PNG_METADATA = {"Software": None}
PDF_METADATA = {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}
SUBLAYER_ORDER = ("attn", "mlp", "block", "out")
SUBLAYER_NAMES = {"attn": "attention (SA)", "mlp": "MLP (FFN)", "block": "block", "out": "final GRN"}
SUBLAYER_STYLES = {"attn": "-", "mlp": "--", "block": ":", "out": "-."}
#: Parameter keys that are summaries of another key (drawn only through the main key) or DCA heat-map entries.
_SKIP_PARAM = re.compile(r"^(weight_\d+|.*_std|.*_abs_mean)$")


def apply_style() -> None:
    matplotlib.rcParams.update(RC)


#: legend entries beyond which a figure's legend goes outside its axes, at the right of the figure
LEGEND_INSIDE = 8


def colors(labels: Sequence[str]) -> dict[str, tuple]:
    """A fixed colour per variant label, by its position in the study's order: distinct for up to 40 labels
    (tab10; tab20; tab20 then tab20b)."""
    from matplotlib import colormaps as cmaps

    if len(labels) <= 10:
        palette = list(cmaps["tab10"].colors)
    else:
        palette = list(cmaps["tab20"].colors) + ([] if len(labels) <= 20 else list(cmaps["tab20b"].colors))
    return {label: palette[i % len(palette)] for i, label in enumerate(labels)}


def legend_outside_for(labels: Sequence[str]) -> bool:
    """Whether a legend of these entries goes outside the panels (more than :data:`LEGEND_INSIDE`)."""
    return len(labels) > LEGEND_INSIDE


def text_width(labels: Sequence[str]) -> float:
    """Inches the longest of these labels takes at the legend's and tick labels' font size."""
    return 0.06 * max((len(label) for label in labels), default=0)


def legend_width(labels: Sequence[str]) -> float:
    """Inches a legend of these labels takes at the figure's right (the line sample, the longest label, the
    padding): what a figure is widened by so that its panels keep their size."""
    return 0.8 + text_width(labels)


def _counted(variants: Sequence[str]) -> list[str]:
    """The legend entries of lines labelled with their run count (``"<label> (n=<runs>)"``), sized at two digits."""
    return [f"{label} (n=00)" for label in variants]


def new_figure(width: float, height: float, *, legend: Sequence[str] = ()) -> Figure:
    """A figure of ``width`` x ``height`` inches for its panels, widened (and heightened, if need be) for a legend of
    ``legend``'s entries at its right when they are too many to sit inside a panel."""
    if legend_outside_for(legend):
        width += legend_width(legend)
        height = max(height, 0.16 * len(legend))
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def place_legends(fig, axes, labels: Sequence[str], **inside: Any) -> None:
    """A legend in each panel that has entries (``inside``: its options), or, for more entries than
    :data:`LEGEND_INSIDE`, one legend at the figure's right (:func:`legend_outside`)."""
    if legend_outside_for(labels):
        legend_outside(fig, axes)
        return
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:  # runs imported from a runs.csv (--import-runs) have no curve
            ax.legend(**inside)


def legend_outside(fig, axes) -> None:
    """One legend for the figure at its right, outside every panel (its entries from all panels, first label wins):
    what a figure with more than :data:`LEGEND_INSIDE` entries gets instead of a legend that covers its data."""
    entries: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="outside right center")


def save(fig, out_dir: Path, name: str, *, tight: bool = False) -> list[Path]:
    """``<out_dir>/<name>.png`` and ``.pdf`` with fixed metadata; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{name}.png", out_dir / f"{name}.pdf"]
    extra = {"bbox_inches": "tight"} if tight else {}
    with matplotlib.rc_context(RC):
        fig.savefig(paths[0], format="png", metadata=PNG_METADATA, **extra)
        fig.savefig(paths[1], format="pdf", metadata=PDF_METADATA, **extra)
    return paths


# --- accuracy ------------------------------------------------------------------------------------------------------
def accuracy_vs_depth(cells: Sequence[Mapping], variants: Sequence[str], *, ylabel: str) -> Figure:
    """Mean ± sample std (error bars) of the accuracy per variant over depth; ``cells`` rows have keys
    variant, depth, mean, std, n (accuracy in %)."""
    return _lines_vs_depth(cells, variants, ylabel=ylabel, title="accuracy vs depth (mean ± std over seeds)")


def similar_blocks_vs_depth(records: Sequence[Mapping], variants: Sequence[str], *, k: int | None,
                            tau: float, share: float) -> Figure:
    """DeepViT's collapse count over depth: mean ± sample std (error bars) of the number of similar blocks per
    variant (one line each), with the ceiling L − 1 (every block similar) dotted; ``records`` from
    :func:`ablations.report.model_tables.collapse_records`."""
    cells = [{"variant": r["variant"], "depth": r["depth"], "n": r["n"], "mean": r["similar_blocks"],
              "std": r["similar_blocks_std"]} for r in records if r["depth"] is not None and r["n"] > 0]
    fig = _lines_vs_depth(cells, variants, ylabel="similar blocks (mean over seeds)",
                          title=f"attention collapse: blocks with > {share:g} of their columns at M > {tau:g}\n"
                                f"against the next {k or 'K'} blocks (project's definition), last logged epoch",
                          ceiling=True)
    fig.axes[0].set_ylim(bottom=-0.5)
    return fig


def _lines_vs_depth(cells: Sequence[Mapping], variants: Sequence[str], *, ylabel: str, title: str,
                    ceiling: bool = False) -> Figure:
    """One line per variant over depth: ``mean`` with ± ``std`` error bars (0 where n < 2); ``ceiling``: a dotted
    line at depth − 1 (every block counted)."""
    fig = new_figure(4.8, 3.4, legend=variants)
    ax = fig.add_subplot()
    palette = colors(variants)
    depths = sorted({c["depth"] for c in cells})
    for label in variants:
        rows = sorted((c for c in cells if c["variant"] == label and c["n"] > 0), key=lambda c: c["depth"])
        if not rows:
            continue
        x = [r["depth"] for r in rows]
        y = [r["mean"] for r in rows]
        err = [r["std"] if r["n"] >= 2 and r["std"] is not None else 0.0 for r in rows]
        ax.errorbar(x, y, yerr=err, label=label, color=palette[label], marker="o", ms=3, capsize=3, lw=1.2)
    if ceiling and depths:
        ax.plot(depths, [d - 1 for d in depths], color="0.5", ls=":", lw=1, label="all blocks (L − 1)")
    ax.set_xticks(depths)
    ax.set_xlabel("depth (blocks)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    place_legends(fig, [ax], variants, loc="best", ncols=2 if len(variants) > 4 else 1)
    return fig


def val_curves(curves: Mapping[int, Mapping[str, Sequence[Mapping[int, float]]]], variants: Sequence[str]) -> Figure:
    """One panel per depth; per variant the mean val-accuracy curve with a ± std band over seeds.
    ``curves[depth][variant]`` = list of ``{epoch (1-based): acc %}``."""
    depths = sorted(curves)
    ncols = min(3, len(depths)) or 1
    nrows = math.ceil(len(depths) / ncols) or 1
    fig = new_figure(3.6 * ncols, 2.8 * nrows, legend=_counted(variants))
    axes = fig.subplots(nrows, ncols, squeeze=False)
    palette = colors(variants)
    for i, depth in enumerate(depths):
        ax = axes[i // ncols][i % ncols]
        for label in variants:
            runs = curves[depth].get(label) or []
            epochs = sorted({e for run in runs for e in run})
            if not epochs:
                continue
            values = [[run[e] for run in runs if e in run and math.isfinite(run[e])] for e in epochs]
            keep = [j for j, v in enumerate(values) if v]
            x = np.array([epochs[j] for j in keep])
            mean = np.array([np.mean(values[j]) for j in keep])
            std = np.array([np.std(values[j], ddof=1) if len(values[j]) > 1 else 0.0 for j in keep])
            ax.plot(x, mean, color=palette[label], label=f"{label} (n={len(runs)})", marker="." if len(x) < 4 else None)
            if np.any(std > 0):
                ax.fill_between(x, mean - std, mean + std, color=palette[label], alpha=0.2, lw=0)
        ax.set_title(f"depth {depth}")
        ax.set_xlabel("epoch")
        _integer_ticks(ax, [e for runs in curves[depth].values() for run in runs for e in run])
        ax.set_ylabel("val accuracy (%)")
        ax.grid(alpha=0.3)
    for j in range(len(depths), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    place_legends(fig, [ax for row in axes for ax in row], variants, loc="lower right")
    return fig


# --- diagnostics ---------------------------------------------------------------------------------------------------
def _integer_ticks(ax, xs: Sequence[int]) -> None:
    """Integer x ticks: every value when there are few, else an integer locator; half a unit of padding."""
    from matplotlib.ticker import MaxNLocator

    xs = sorted(set(xs))
    if not xs:
        return
    if len(xs) <= 12:
        ax.set_xticks(xs)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(xs[0] - 0.5, xs[-1] + 0.5)


def _scale(ax, values: Sequence[float]) -> None:
    finite = [v for v in values if math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    if positive and len(positive) == len(finite) and max(positive) / min(positive) > 50:
        ax.set_yscale("log")
    elif positive and len(positive) < len(finite) and max(positive) / min(positive) > 50:
        ax.set_yscale("symlog", linthresh=min(positive))


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
    _integer_ticks(ax, [layer for per_layer in series.values() for layer in per_layer])
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
    fig = new_figure(3.6 * len(sublayers), 2.8 * len(rows), legend=_counted(variants))
    axes = fig.subplots(len(rows), len(sublayers), squeeze=False)
    for r, kind in enumerate(rows):
        for ax, sublayer in zip(axes[r], sublayers, strict=True):
            _scale(ax, _mean_lines(ax, data[kind].get(sublayer, {}), variants))
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
    fig = new_figure(7.2, 3.0, legend=_counted(variants))
    panels = fig.subplots(1, 2, squeeze=False)[0]
    for ax, (kind, title) in zip(panels, kinds.items(), strict=True):
        _mean_lines(ax, series[kind], variants)
        ax.set_ylim(0.0, 1.02)
        ax.set_title(f"similarity {title}")
        ax.set_ylabel("mean cosine similarity M")
    place_legends(fig, list(panels), variants, loc="best")
    fig.suptitle(f"attention collapse: cross-layer similarity (depth {depth}, last logged epoch)", fontsize=9)
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
    from matplotlib import colormaps as cmaps

    cmap = cmaps["viridis"]
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
        _scale(ax, values)
        ax.set_title(f"{label}: {key}")
        ax.set_xlabel("epoch")
        _integer_ticks(ax, [s + 1 for steps in series.values() for s in steps])
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


# --- Optuna's own matplotlib plots -----------------------------------------------------------------------------------
def optuna_figure(plot, *args, **kwargs):
    """Run one ``optuna.visualization.matplotlib`` plot function and return its Figure (Agg; pyplot-managed, so
    close it with :func:`close`)."""
    import warnings

    import matplotlib.pyplot as plt
    import optuna

    plt.close("all")
    with warnings.catch_warnings(), matplotlib.rc_context(RC):
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", UserWarning)
        ax = plot(*args, **kwargs)
    fig = ax.figure if hasattr(ax, "figure") else np.ravel(ax)[0].figure
    fig.set_size_inches(6.4, 4.2)
    return fig


def close(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


# --- the report's figures -------------------------------------------------------------------------------------------
def report_figures(study, data, cells, out: Path) -> tuple[list[Path], list[str]]:
    """Every figure of a study's report (``data``: :class:`ablations.report.load.StudyData`; ``cells``: the main
    table's cells for grid studies, else None), saved under ``out``; returns (paths, notes)."""
    from .events import read_run
    from .load import ACC_KEY, best_per_row, first_line

    apply_style()
    written: list[Path] = []
    notes: list[str] = []
    variants = data.rows
    top = data.depths[-1] if data.depths else None

    def keep(fig, name: str, tight: bool = False) -> None:
        written.extend(save(fig, out, name, tight=tight))

    if data.kind == "grid":
        cell_rows = [{"variant": c.row, "depth": c.depth if c.depth is not None else 0, "n": c.n,
                      "mean": None if c.mean is None else 100 * c.mean,
                      "std": None if c.std is None else 100 * c.std} for c in cells or []]
        keep(accuracy_vs_depth(cell_rows, variants, ylabel=f"top-1 accuracy (%) [{data.metric}]"), "acc_vs_depth")
        selected = {row: [r for r in data.runs if r.row == row and r.depth == top and r.state == "complete"]
                    for row in variants}
        curves = {d if d is not None else 0: {row: [{e: 100 * v for e, v in r.curve.items()}
                                                   for r in data.by_row_depth(row, d) if r.curve]
                                             for row in variants} for d in (data.depths or [None])}
        depth = top or 0
    else:
        best = best_per_row(data)
        selected = {row: [best[row]] for row in variants if row in best}
        curves = {}
        for row, run in sorted(selected.items(), key=lambda kv: variants.index(kv[0])):
            curves.setdefault(run[0].depth or 0, {})[row] = [{e: 100 * v for e, v in run[0].curve.items()}]
        depth = max(curves) if curves else 0
        for name, plot, kwargs in _optuna_plots(ACC_KEY):
            try:
                fig = optuna_figure(plot, study, **kwargs)
            except Exception as exc:  # noqa: BLE001
                notes.append(f"figure {name} skipped ({first_line(exc)}).")
                continue
            keep(fig, name, tight=True)
            close(fig)
    if curves:
        keep(val_curves(curves, variants), "val_curves")

    events = {row: [e for e in (read_run(r.log_dir) for r in runs) if not e.empty] for row, runs in selected.items()}
    fig = branch_ratio(events, variants, depth=depth)
    if fig is None:
        notes.append(f"figure branch_ratio skipped: no {_tag('ratio_mean')} tags in the event files (depth {depth}).")
    else:
        keep(fig, "branch_ratio")
    fig = similarity_curves(events, variants, depth=depth, k=data.config_value("diagnostics_sim_k"))
    if fig is not None:
        keep(fig, "attn_similarity_curves")
    if data.kind == "grid":
        from lit_modules.diagnostics import DEFAULT_SIM_K, DEFAULT_TAU, SIMILAR_SHARE

        from .model_tables import collapse_records

        records = collapse_records(data)
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
    return written, notes


def diagnostics_note(which: str, depth: int, *, found: int, total: int) -> str:
    """The report's note on what the diagnostic figures read: ``found`` of the ``total`` selected runs at
    ``depth`` have diagnostics in their event files. A run imported from a runs.csv (``--import-runs``: its event
    files stayed on the machine that trained it) or whose folder was removed has none, and neither has a run
    trained with ``diagnostics_every: 0``: the note says how many the figures stand on instead of "all"."""
    if total == 0:
        return f"no diagnostic figures at depth {depth}: no run there."
    if found == 0:
        return (f"no diagnostic figures at depth {depth}: none of its {total} runs has diagnostics in its event "
                "files (diagnostics_every 0, runs imported from a runs.csv, or their folders removed).")
    if found < total:
        return (f"diagnostic figures use {found} of the {total} runs ({which}) at depth {depth}, the ones whose event "
                "files hold diagnostics (the others ran with diagnostics_every 0, were imported from a runs.csv or "
                "had their folders removed), last logged epoch.")
    return f"diagnostic figures use {which} at depth {depth}, last logged epoch."


def _tag(name: str) -> str:
    """The diagnostics tag family ``name`` (``lit_modules.diagnostics.TAGS``) up to its first placeholder."""
    from lit_modules.diagnostics import TAGS

    return TAGS[name].split("/{", 1)[0]


def _optuna_plots(target: str):
    from optuna.importance import PedAnovaImportanceEvaluator
    from optuna.visualization import matplotlib as ovm

    return [("optuna_history", ovm.plot_optimization_history, {"target_name": target}),
            ("optuna_importance", ovm.plot_param_importances,
             {"evaluator": PedAnovaImportanceEvaluator(), "target_name": target}),
            ("optuna_intermediate", ovm.plot_intermediate_values, {})]


def _similarity_matrices(data, events: Mapping[str, Sequence[RunEvents]], cells, depth: int | None) -> dict:
    """Mean (over the selected runs) attention-similarity matrix of the baseline (standard, else the first
    variant) and of the best other variant (highest mean accuracy at that depth)."""
    import warnings

    from .load import BASELINE, best_per_row

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
