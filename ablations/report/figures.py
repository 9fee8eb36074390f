"""Static figures of the report: accuracy over depth, validation curves, Optuna's plots for a search, and the
diagnostics' figures (:mod:`ablations.report.diagnostic_figures`), all in the frame of :mod:`ablations.report.plot`.
The drawing functions take plain data; :func:`report_figures` prepares it from a study's results
(:mod:`ablations.report`) and saves every figure as PNG and PDF.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot is first imported (Optuna's plots import it)

import numpy as np  # noqa: E402
import optuna  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from optuna.importance import PedAnovaImportanceEvaluator  # noqa: E402
from optuna.visualization import matplotlib as optuna_plots  # noqa: E402

from .diagnostic_figures import diagnostic_figures  # noqa: E402
from .load import ACC_KEY, best_per_row, first_line  # noqa: E402
from .plot import (  # noqa: E402
    RC,
    apply_style,
    close,
    close_all,
    colors,
    counted,
    integer_ticks,
    lines_vs_depth,
    new_figure,
    place_legends,
    save,
)


def accuracy_vs_depth(cells: Sequence[Mapping], variants: Sequence[str], *, ylabel: str) -> Figure:
    """Mean ± sample std (error bars) of the accuracy per variant over depth; ``cells`` rows have keys
    variant, depth, mean, std, n (accuracy in %)."""
    return lines_vs_depth(cells, variants, ylabel=ylabel, title="accuracy vs depth (mean ± std over seeds)")


def val_curves(curves: Mapping[int, Mapping[str, Sequence[Mapping[int, float]]]], variants: Sequence[str]) -> Figure:
    """One panel per depth; per variant the mean val-accuracy curve with a ± std band over seeds.
    ``curves[depth][variant]`` = list of ``{epoch (1-based): acc %}``."""
    depths = sorted(curves)
    ncols = min(3, len(depths)) or 1
    nrows = math.ceil(len(depths) / ncols) or 1
    fig = new_figure(3.6 * ncols, 2.8 * nrows, legend=counted(variants))
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
        integer_ticks(ax, [e for runs in curves[depth].values() for run in runs for e in run])
        ax.set_ylabel("val accuracy (%)")
        ax.grid(alpha=0.3)
    for j in range(len(depths), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    place_legends(fig, [ax for row in axes for ax in row], variants, loc="lower right")
    return fig


def optuna_figure(plot, *args, **kwargs):
    """Run one ``optuna.visualization.matplotlib`` plot function and return its Figure (Agg; pyplot-managed, so
    close it with :func:`close`)."""
    close_all()
    with warnings.catch_warnings(), matplotlib.rc_context(RC):
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", UserWarning)
        ax = plot(*args, **kwargs)
    fig = ax.figure if hasattr(ax, "figure") else np.ravel(ax)[0].figure
    fig.set_size_inches(6.4, 4.2)
    return fig


#: figures whose x axis is the depth: a study of one depth would draw one point per row (skipped, with a note)
OVER_DEPTH = ("acc_vs_depth", "similar_blocks_vs_depth")


def report_figures(study, data, cells, out: Path) -> tuple[list[Path], list[str]]:
    """Every figure of a study's report (``data``: :class:`ablations.report.load.StudyData`; ``cells``: the main
    table's cells for grid studies, else None), saved under ``out``; returns (paths, notes)."""
    apply_style()
    written: list[Path] = []
    notes: list[str] = []

    def keep(fig, name: str, tight: bool = False) -> None:
        if name in OVER_DEPTH and len(data.depths) < 2:
            notes.append(f"figure {name} skipped: the study trained one depth, so each row would be one point "
                         "(the main table has it).")
            close(fig)
            for stale in (out / f"{name}.png", out / f"{name}.pdf"):  # an earlier report's, with more depths
                stale.unlink(missing_ok=True)
            return
        written.extend(save(fig, out, name, tight=tight))

    if data.kind == "grid":
        selected, curves, depth = _grid_figures(data, cells, keep)
    else:
        selected, curves, depth = _search_figures(study, data, keep, notes)
    if any(run for by_row in curves.values() for runs in by_row.values() for run in runs):
        keep(val_curves(curves, data.rows), "val_curves")
    elif curves:  # e.g. a runs.csv written before it carried the curves: an earlier figure stays as it is
        notes.append("figure val_curves skipped: no run has a validation curve (neither logged epochs nor a "
                     "val_acc_curve column in runs.csv).")
    top = data.depths[-1] if data.depths else None
    notes += diagnostic_figures(data, selected, cells, depth, top, keep)
    return written, notes


def _grid_figures(data, cells, keep) -> tuple[dict, dict, int]:
    """A grid's accuracy over depth (kept); its runs at the largest depth per row, its curves per depth and row
    (accuracy in %), and that depth."""
    variants = data.rows
    top = data.depths[-1] if data.depths else None
    cell_rows = [{"variant": c.row, "depth": c.depth if c.depth is not None else 0, "n": c.n,
                  "mean": None if c.mean is None else 100 * c.mean,
                  "std": None if c.std is None else 100 * c.std} for c in cells or []]
    keep(accuracy_vs_depth(cell_rows, variants, ylabel=f"top-1 accuracy (%) [{data.metric}]"), "acc_vs_depth")
    selected = {row: [r for r in data.runs if r.row == row and r.depth == top and r.state == "complete"]
                for row in variants}
    curves = {d if d is not None else 0: {row: [{e: 100 * v for e, v in r.curve.items()}
                                               for r in data.by_row_depth(row, d) if r.curve]
                                         for row in variants} for d in (data.depths or [None])}
    return selected, curves, top or 0


def _search_figures(study, data, keep, notes: list[str]) -> tuple[dict, dict, int]:
    """A search's Optuna plots (kept; one that fails is noted and skipped); its best trial per row, their curves
    by depth (accuracy in %), and the largest of those depths."""
    variants = data.rows
    best = best_per_row(data)
    selected = {row: [best[row]] for row in variants if row in best}
    curves: dict = {}
    for row, run in sorted(selected.items(), key=lambda kv: variants.index(kv[0])):
        curves.setdefault(run[0].depth or 0, {})[row] = [{e: 100 * v for e, v in run[0].curve.items()}]
    for name, plot, kwargs in _optuna_plots(ACC_KEY):
        try:
            fig = optuna_figure(plot, study, **kwargs)
        except Exception as exc:  # noqa: BLE001
            notes.append(f"figure {name} skipped ({first_line(exc)}).")
            continue
        keep(fig, name, tight=True)
        close(fig)
    return selected, curves, max(curves) if curves else 0

def _optuna_plots(target: str):
    return [("optuna_history", optuna_plots.plot_optimization_history, {"target_name": target}),
            ("optuna_importance", optuna_plots.plot_param_importances,
             {"evaluator": PedAnovaImportanceEvaluator(), "target_name": target}),
            ("optuna_intermediate", optuna_plots.plot_intermediate_values, {})]
