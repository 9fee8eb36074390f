"""The interactive charts of a study's web page (plotly; :mod:`ablations.report.html`): the accuracy of every seed,
the paired differences with their intervals, the curves across seeds with their 95% bands (:mod:`.aggregate`), the
tuning; each in the colours of the PNG figures, and a curve chart with a PNG twin for a reader without JavaScript.
A curve chart of more than :data:`MANY_ROWS` rows gives each row its own small panel, the baseline in grey beside it.
Chart ids are fixed, so the same inputs give the same page."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from matplotlib.colors import to_hex
from plotly.subplots import make_subplots

from .aggregate import aggregate, band
from .load import BASELINE, StudyData
from .markup import esc, slug
from .plot import apply_style, colors, legend_outside_for, new_figure
from .tuning import tuning_records

#: rows above which a band chart draws one small panel per row instead of every row in one panel: a dozen
#: overlapping bands cannot be read
MANY_ROWS = 8
#: the line style of each depth in a chart of small panels (the first depth solid)
DEPTH_DASHES = ("solid", "dash", "dot", "dashdot")


def colour(rows: Sequence[str]) -> dict[str, str]:
    """Each row's colour as hex, the same as in the PNG figures (:func:`ablations.report.plot.colors`)."""
    return {row: to_hex(c) for row, c in colors(rows).items()}


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def accuracy_figure(data: StudyData):
    """Per depth: every ok run's accuracy (one point per seed) and the mean with its 95% interval per variant."""
    depths = data.depths or [None]
    fig = make_subplots(rows=1, cols=len(depths), shared_yaxes=True,
                        subplot_titles=[f"depth {d}" if d is not None else "" for d in depths])
    colours = colour(data.rows)
    for col, depth in enumerate(depths, start=1):
        for row in data.rows:
            ok = [r for r in data.by_row_depth(row, depth) if r.ok]
            if not ok:
                continue
            fig.add_trace(go.Scatter(
                x=[row] * len(ok), y=[100 * r.acc for r in ok], mode="markers", legendgroup=row, showlegend=False,
                marker={"color": colours[row], "size": 6, "opacity": 0.55}, name=row,
                customdata=[[r.seed] for r in ok], hovertemplate=f"{row}<br>seed %{{customdata[0]}}: %{{y:.2f}}%"
                                                                 "<extra></extra>"), row=1, col=col)
            b = band([r.acc for r in ok])
            fig.add_trace(go.Scatter(
                x=[row], y=[100 * b.mean], mode="markers", legendgroup=row, showlegend=col == 1, name=row,
                marker={"color": colours[row], "size": 11, "symbol": "diamond", "line": {"width": 1, "color": "black"}},
                error_y={"type": "data", "symmetric": False, "array": [100 * (b.upper - b.mean)],
                         "arrayminus": [100 * (b.mean - b.lower)], "thickness": 2},
                hovertemplate=f"{row}: mean %{{y:.2f}}% [{100 * b.lower:.2f}, {100 * b.upper:.2f}] 95% CI, "
                              f"n={b.n}<extra></extra>"), row=1, col=col)
    fig.update_yaxes(title_text=f"{data.metric} (%)", row=1, col=1)
    title = f"{data.metric}: every seed (dots) and the mean with its 95% CI (diamond)"
    if not legend_outside_for(data.rows):
        return _style(fig, title)
    label = max(len(row) for row in data.rows)  # the x axis names every row: the legend would repeat it
    fig.update_xaxes(tickangle=-45)
    return _style(fig, title, height=420 + 5 * label, bottom=50 + 5 * label, legend=False)


def delta_figure(data: StudyData, cells: Sequence) -> Any:
    """Per depth: each variant's paired difference to the baseline with its 95% CI (unadjusted), filled when
    Holm-significant."""
    depths = data.depths or [None]
    compared = [c for c in cells if c.comparison is not None and c.comparison.delta is not None]
    if not compared:
        return None
    fig = make_subplots(rows=1, cols=len(depths), shared_yaxes=True,
                        subplot_titles=[f"depth {d}" if d is not None else "" for d in depths])
    colours = colour(data.rows)
    for col, depth in enumerate(depths, start=1):
        for c in (c for c in compared if c.depth == depth):
            cmp = c.comparison
            low = cmp.ci_low if cmp.ci_low is not None else cmp.delta
            high = cmp.ci_high if cmp.ci_high is not None else cmp.delta
            fig.add_trace(go.Scatter(
                x=[100 * cmp.delta], y=[c.row], mode="markers", name=c.row, showlegend=False,
                marker={"color": colours.get(c.row, "black"), "size": 11,
                        "symbol": "circle" if c.significant else "circle-open", "line": {"width": 2}},
                error_x={"type": "data", "symmetric": False, "array": [100 * (high - cmp.delta)],
                         "arrayminus": [100 * (cmp.delta - low)], "thickness": 2},
                hovertemplate=(f"{c.row}, depth {depth}: Δ %{{x:+.2f}} pp [{100 * low:+.2f}, {100 * high:+.2f}] "
                               f"95% CI (unadjusted), {cmp.n} pairs, Holm p "
                               f"{'—' if c.p_t_holm is None else format(c.p_t_holm, '.3g')}<extra></extra>")),
                row=1, col=col)
        fig.add_vline(x=0, line_dash="dot", line_color="gray", row=1, col=col)
        fig.update_xaxes(title_text=f"Δ vs {BASELINE} (pp)", row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    rows = len({c.row for c in compared})  # a tick label per row: 24 px each, or plotly drops some
    return _style(fig, f"paired Δ {data.metric} vs {BASELINE}: mean and 95% CI (filled: Holm-significant)",
                  height=max(420, 150 + 24 * rows))


def band_figure(cells: Sequence, tag: str, *, delta: bool, rows: Sequence[str], scale: float = 100.0):
    """Per depth: each variant's mean curve (or paired Δ curve) over epochs with its 95% band."""
    chosen = [c for c in cells if tag in (c.deltas if delta else c.curves)]
    if not chosen:
        return None
    if len({c.row for c in chosen}) > MANY_ROWS:
        return _band_panels(chosen, tag, delta=delta, rows=rows, scale=scale)
    depths = list(dict.fromkeys(c.depth for c in chosen))
    fig = make_subplots(rows=1, cols=len(depths), shared_yaxes=True,
                        subplot_titles=[f"depth {d}" if d is not None else "" for d in depths])
    colours = colour(rows)
    unit = " (pp)" if scale == 100.0 and delta else (" (%)" if scale == 100.0 else "")
    for col, depth in enumerate(depths, start=1):
        for c in (c for c in chosen if c.depth == depth):
            points = sorted((c.deltas if delta else c.curves)[tag].items())
            x = [e for e, _ in points]
            colour_ = colours.get(c.row, "#444444")
            fig.add_trace(go.Scatter(x=x + x[::-1], y=[scale * b.upper for _, b in points]
                                     + [scale * b.lower for _, b in points][::-1], fill="toself", mode="lines",
                                     fillcolor=_rgba(colour_, 0.15), line={"width": 0}, hoverinfo="skip",
                                     legendgroup=c.row, showlegend=False, name=c.row), row=1, col=col)
            fig.add_trace(go.Scatter(
                x=x, y=[scale * b.mean for _, b in points], mode="lines", name=c.row, legendgroup=c.row,
                showlegend=col == 1, line={"color": colour_, "width": 2},
                customdata=[[scale * b.lower, scale * b.upper, b.n] for _, b in points],
                hovertemplate=f"{c.row}, epoch %{{x}}: %{{y:.3f}} [%{{customdata[0]:.3f}}, %{{customdata[1]:.3f}}], "
                              "n=%{customdata[2]}<extra></extra>"), row=1, col=col)
        if delta:
            fig.add_hline(y=0, line_dash="dot", line_color="gray", row=1, col=col)
        fig.update_xaxes(title_text="epoch", tickformat="d", row=1, col=col)
    what = f"paired Δ {tag} vs {BASELINE}" if delta else tag
    fig.update_yaxes(title_text=what + unit, row=1, col=1)
    return _style(fig, f"{what}: mean over seeds per epoch with its 95% CI band")


def panel_grid(rows: Sequence[str]) -> tuple[int, int]:
    """(panel rows, panel columns) of one small panel per row: four across."""
    cols = min(4, len(rows))
    return math.ceil(len(rows) / cols), cols


def _series(cell, tag: str, delta: bool, scale: float) -> tuple[list, list, list, list]:
    """(epochs, means, lowers, uppers) of one cell's curve (or paired Δ curve), scaled."""
    points = sorted((cell.deltas if delta else cell.curves)[tag].items())
    return ([e for e, _ in points], [scale * b.mean for _, b in points], [scale * b.lower for _, b in points],
            [scale * b.upper for _, b in points])


def _band_panels(chosen: Sequence, tag: str, *, delta: bool, rows: Sequence[str], scale: float):
    """One small panel per row: its mean curve and 95% band in its colour, the baseline's mean in grey beside it
    (a Δ panel: the zero line), one line style per depth; shared axes, so panels compare at a glance."""
    present = [r for r in rows if any(c.row == r for c in chosen)]
    depths = list(dict.fromkeys(c.depth for c in chosen))
    nrows, ncols = panel_grid(present)
    fig = make_subplots(rows=nrows, cols=ncols, shared_xaxes=True, shared_yaxes=True, subplot_titles=present,
                        vertical_spacing=min(0.08, 0.6 / nrows), horizontal_spacing=0.03)
    colours = colour(rows)
    baseline = {c.depth: c for c in chosen if c.row == BASELINE}
    for i, row in enumerate(present):
        at = {"row": i // ncols + 1, "col": i % ncols + 1}
        for c in (c for c in chosen if c.row == row):
            dash = DEPTH_DASHES[depths.index(c.depth) % len(DEPTH_DASHES)]
            where = "" if len(depths) == 1 else f", depth {c.depth}"
            ref = baseline.get(c.depth)
            if ref is not None and row != BASELINE and not delta:
                x, mean, _, _ = _series(ref, tag, delta, scale)
                fig.add_trace(go.Scatter(x=x, y=mean, mode="lines", name=f"{BASELINE}{where}", showlegend=False,
                                         line={"color": "#9a9a9a", "width": 1.2, "dash": dash},
                                         hovertemplate=f"{BASELINE}{where}, epoch %{{x}}: %{{y:.3f}}<extra></extra>"),
                              **at)
            x, mean, lower, upper = _series(c, tag, delta, scale)
            fig.add_trace(go.Scatter(x=x + x[::-1], y=upper + lower[::-1], fill="toself", mode="lines",
                                     fillcolor=_rgba(colours.get(row, "#444444"), 0.2), line={"width": 0},
                                     hoverinfo="skip", showlegend=False, name=row), **at)
            fig.add_trace(go.Scatter(
                x=x, y=mean, mode="lines", name=f"{row}{where}", showlegend=False,
                line={"color": colours.get(row, "#444444"), "width": 2, "dash": dash},
                customdata=[[lo, hi] for lo, hi in zip(lower, upper, strict=True)],
                hovertemplate=f"{row}{where}, epoch %{{x}}: %{{y:.3f}} [%{{customdata[0]:.3f}}, "
                              "%{customdata[1]:.3f}]<extra></extra>"), **at)
        if delta:
            fig.add_hline(y=0, line_dash="dot", line_color="gray", **at)
    what = f"paired Δ {tag} vs {BASELINE}" if delta else tag
    unit = " (pp)" if scale == 100.0 and delta else (" (%)" if scale == 100.0 else "")
    styles = "" if len(depths) == 1 else "; line style: depth " + ", ".join(
        f"{d} {DEPTH_DASHES[i % len(DEPTH_DASHES)]}" for i, d in enumerate(depths))
    fig.update_yaxes(title_text=what + unit, col=1)
    reference = "" if delta else f"; grey: {BASELINE}"
    return _style(fig, f"{what}: mean over seeds per epoch and its 95% CI band, one panel per row{reference}{styles}",
                  height=120 + 170 * nrows, legend=False)


def tuning_figure(data: StudyData, records: Sequence[Mapping]) -> Any:
    points = [r for r in records if r["mean"] is not None]
    if not points:
        return None
    fig = go.Figure()
    colours = colour(data.rows)
    several = len({r["depth"] for r in points}) > 1
    for key in dict.fromkeys((r["variant"], r["depth"]) for r in points):
        mine = [r for r in points if (r["variant"], r["depth"]) == key]
        name = key[0] if not several else f"{key[0]}, depth {key[1]}"
        fig.add_trace(go.Scatter(
            x=[r["lr"] for r in mine], y=[100 * r["mean"] for r in mine], mode="lines+markers", name=name,
            line={"color": colours.get(key[0], "#444444")},
            marker={"size": [14 if r["chosen"] else 7 for r in mine],
                    "symbol": ["star" if r["chosen"] else "circle" for r in mine]},
            error_y={"type": "data", "array": [100 * (r["std"] or 0.0) for r in mine]},
            customdata=[[r["n"], "chosen" if r["chosen"] else ""] for r in mine],
            hovertemplate=f"{name}: lr %{{x:g}}: %{{y:.2f}}% (n=%{{customdata[0]}}) %{{customdata[1]}}<extra></extra>"))
    rates = sorted({r["lr"] for r in points})
    fig.update_xaxes(type="log", title_text="peak learning rate", tickvals=rates, ticktext=[f"{v:g}" for v in rates])
    fig.update_yaxes(title_text=f"{data.tune_metric} (%), tuning seeds")
    return _style(fig, "learning-rate tuning: mean ± sd over the tuning seeds (star: chosen)")


def _style(fig, title: str, *, height: int = 420, bottom: int = 50, legend: bool = True):
    fig.update_layout(title={"text": title, "font": {"size": 14}}, template="plotly_white", height=height,
                      margin={"l": 60, "r": 20, "t": 70, "b": bottom}, hovermode="closest", showlegend=legend,
                      legend={"orientation": "h", "y": -0.18})
    return fig


def chart_html(fig, name: str, twin: str | None = None) -> str:
    """A plotly chart (fixed id: the page is deterministic) and, for JavaScript off, its PNG twin or a line."""
    div = pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f"chart-{name}",
                      config={"displaylogo": False, "responsive": True})
    title = fig.layout.title.text or name
    fallback = (f'<noscript><img alt="{esc(title)}" src="data:image/png;base64,{twin}"></noscript>' if twin else
                f"<noscript><p>(the interactive chart “{esc(title)}” needs JavaScript; its numbers are in the tables "
                "above)</p></noscript>")
    return f'<figure class="chart" id="figure-{name}">{div}{fallback}</figure>'


def band_png(cells: Sequence, tag: str, *, delta: bool, rows: Sequence[str], scale: float = 100.0) -> str | None:
    """The PNG twin of :func:`band_figure` (matplotlib), base64; None when there is nothing to draw."""
    chosen = [c for c in cells if tag in (c.deltas if delta else c.curves)]
    if not chosen:
        return None
    apply_style()
    if len({c.row for c in chosen}) > MANY_ROWS:
        return _png(_band_panels_png(chosen, tag, delta=delta, rows=rows, scale=scale))
    depths = list(dict.fromkeys(c.depth for c in chosen))
    fig = new_figure(3.8 * len(depths), 3.0)
    colours = colour(rows)
    for ax, depth in zip(fig.subplots(1, len(depths), squeeze=False)[0], depths, strict=True):
        for c in (c for c in chosen if c.depth == depth):
            points = sorted((c.deltas if delta else c.curves)[tag].items())
            x = [e for e, _ in points]
            ax.plot(x, [scale * b.mean for _, b in points], color=colours.get(c.row, "#444444"), label=c.row)
            ax.fill_between(x, [scale * b.lower for _, b in points], [scale * b.upper for _, b in points],
                            color=colours.get(c.row, "#444444"), alpha=0.15, lw=0)
        if delta:
            ax.axhline(0, color="0.5", ls=":", lw=1)
        ax.set_title(f"depth {depth}" if depth is not None else "")
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.axes[0].set_ylabel(f"Δ {tag} vs {BASELINE}" if delta else tag)
    return _png(fig)


def _png(fig) -> str:
    """A matplotlib figure as base64 PNG (no metadata: the page is deterministic)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _band_panels_png(chosen: Sequence, tag: str, *, delta: bool, rows: Sequence[str], scale: float):
    """The PNG twin of :func:`_band_panels`: one small panel per row, the baseline in grey, shared axes."""
    present = [r for r in rows if any(c.row == r for c in chosen)]
    depths = list(dict.fromkeys(c.depth for c in chosen))
    nrows, ncols = panel_grid(present)
    fig = new_figure(2.6 * ncols, 1.9 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True)
    colours = colour(rows)
    baseline = {c.depth: c for c in chosen if c.row == BASELINE}
    styles = ("-", "--", ":", "-.")
    for i, row in enumerate(present):
        ax = axes[i // ncols][i % ncols]
        for c in (c for c in chosen if c.row == row):
            style = styles[depths.index(c.depth) % len(styles)]
            if baseline.get(c.depth) is not None and row != BASELINE and not delta:
                x, mean, _, _ = _series(baseline[c.depth], tag, delta, scale)
                ax.plot(x, mean, color="0.6", lw=1, ls=style)
            x, mean, lower, upper = _series(c, tag, delta, scale)
            ax.plot(x, mean, color=colours.get(row, "#444444"), lw=1.5, ls=style)
            ax.fill_between(x, lower, upper, color=colours.get(row, "#444444"), alpha=0.2, lw=0)
        if delta:
            ax.axhline(0, color="0.5", ls=":", lw=1)
        ax.set_title(row, fontsize=7)
        ax.grid(alpha=0.3)
    for j in range(len(present), nrows * ncols):
        axes[j // ncols][j % ncols].set_visible(False)
    axes[0][0].set_ylabel(f"Δ {tag} vs {BASELINE}" if delta else tag)
    return fig


def charts(data: StudyData, spec, cells) -> list[str]:
    """The interactive charts of a grid study (accuracy per seed, paired Δ, curves and Δ curves with their bands,
    tuning)."""
    out = []
    if any(r.ok for r in data.runs):
        out.append(chart_html(accuracy_figure(data), "accuracy"))
    if cells is not None:
        fig = delta_figure(data, cells)
        if fig is not None:
            out.append(chart_html(fig, "paired-delta"))
    if spec.kind == "grid":
        aggs = aggregate(data)
        for tag in ("val/acc", "test/acc"):
            for delta in (False, True):
                fig = band_figure(aggs, tag, delta=delta, rows=data.rows)
                if fig is not None:
                    name = slug(f"{'delta-' if delta else ''}{tag}")
                    out.append(chart_html(fig, name, band_png(aggs, tag, delta=delta, rows=data.rows)))
    if data.tune_runs:
        fig = tuning_figure(data, tuning_records(data))
        if fig is not None:
            out.append(chart_html(fig, "tuning"))
    return out
