"""The frame every figure of a report shares (matplotlib, Agg, no pyplot state but for Optuna's own plots): the
style, a fixed colour per row, figures sized for their legend, legends inside a panel or at the figure's right, the
axes helpers the figures have in common, and saving as PNG and PDF with fixed metadata (no creation date, fixed
``svg.hashsalt``), so that the same inputs give the same files."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import colormaps  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

RC = {"svg.hashsalt": "ablations-report", "font.size": 8, "axes.titlesize": 9, "legend.fontsize": 7,
      "figure.dpi": 100, "savefig.dpi": 150, "pdf.fonttype": 42}
PNG_METADATA = {"Software": None}
PDF_METADATA = {"CreationDate": None, "ModDate": None, "Producer": None, "Creator": None}


def apply_style() -> None:
    matplotlib.rcParams.update(RC)


#: legend entries beyond which a figure's legend goes outside its axes, at the right of the figure
LEGEND_INSIDE = 8


def colors(labels: Sequence[str]) -> dict[str, tuple]:
    """A fixed colour per variant label, by its position in the study's order: distinct for up to 40 labels
    (tab10; tab20; tab20 then tab20b)."""
    if len(labels) <= 10:
        palette = list(colormaps["tab10"].colors)
    else:
        palette = list(colormaps["tab20"].colors) + ([] if len(labels) <= 20 else list(colormaps["tab20b"].colors))
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


def counted(variants: Sequence[str]) -> list[str]:
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


def close(fig) -> None:
    """Close a pyplot-managed figure (Optuna's plots draw through pyplot)."""
    plt.close(fig)


def close_all() -> None:
    """Close every pyplot-managed figure."""
    plt.close("all")


def lines_vs_depth(cells: Sequence[Mapping], variants: Sequence[str], *, ylabel: str, title: str,
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


def integer_ticks(ax, xs: Sequence[int]) -> None:
    """Integer x ticks: every value when there are few, else an integer locator; half a unit of padding."""
    xs = sorted(set(xs))
    if not xs:
        return
    if len(xs) <= 12:
        ax.set_xticks(xs)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(xs[0] - 0.5, xs[-1] + 0.5)


def log_scale_if_wide(ax, values: Sequence[float]) -> None:
    """A log y scale for positive values spanning more than 50x (symlog when some are 0 or negative)."""
    finite = [v for v in values if math.isfinite(v)]
    positive = [v for v in finite if v > 0]
    if positive and len(positive) == len(finite) and max(positive) / min(positive) > 50:
        ax.set_yscale("log")
    elif positive and len(positive) < len(finite) and max(positive) / min(positive) > 50:
        ax.set_yscale("symlog", linthresh=min(positive))
