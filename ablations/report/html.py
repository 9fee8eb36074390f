"""A study's report as one web page, ``<out>/report.html``, and ``<results-dir>/index.html`` linking every study
that has one (and the claims ledger ``claims.md`` when the results folder has it).

The page holds the claims with their numbers, every report table as a real HTML table (sortable by a click on a
column head: the tablesort library, inlined; each cell sorts by the number behind it), interactive charts (plotly:
hover for the values; the accuracy of every seed, the paired differences with their intervals, the curves across
seeds with their 95% bands from :mod:`.aggregate`, the tuning), the report folder's figures as embedded PNGs, the
study's protocol and what the runs record of their machine and wall time. With JavaScript off it stays readable:
tables are plain tables, and every chart has a PNG twin. It is built from the same StudyData as the tables, so it
regenerates from ``runs.csv`` alone.

plotly's bundle (about 5 MB) is one file for all studies, ``<results-dir>/plotly.min.js``, when the page is in the
results folder (``results/<study>/report.html``) or in a folder whose parent holds the bundle already; a page
written anywhere else carries the bundle inline. The page is deterministic: the same inputs give the same bytes
(chart ids are fixed, no dates).
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from .format import Column, Table
from .load import BASELINE, StudyData, own_seconds

REPORT = "report.html"
INDEX = "index.html"
PLOTLY_BUNDLE = "plotly.min.js"
LEDGER = "claims.md"  # the results folder's claims ledger, linked from the index when present
CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1200px;padding:0 1.2em 3em;
color:#1b1b1b;line-height:1.45}
h1{margin-bottom:.2em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
nav a{margin-right:1em}.lede{color:#444}.warn{background:#fff4e5;border-left:4px solid #f0a020;padding:.5em 1em}
table{border-collapse:collapse;margin:.6em 0;font-size:.86em}th,td{border:1px solid #ccc;padding:.25em .5em;
vertical-align:top}th{background:#f3f3f3;position:sticky;top:0}td.r{text-align:right;white-space:nowrap}
th[role=columnheader]:not(.no-sort){cursor:pointer}th[aria-sort=ascending]::after{content:" ▲"}
th[aria-sort=descending]::after{content:" ▼"}.caption{font-size:.85em;color:#444;max-width:100ch}
.note{font-size:.85em;color:#7a4b00}figure{margin:1em 0}figcaption{font-size:.85em;color:#444}
img{max-width:100%;height:auto}.chart{min-height:360px}ul.claims li{margin:.3em 0}code{font-size:.92em}
details{margin:.5em 0}dl.kv{display:grid;grid-template-columns:max-content auto;gap:.15em 1em}dl.kv dt{font-weight:600}
dl.kv dd{margin:0}
"""


#: Without JavaScript the charts' empty boxes take no room (their PNG twins or a line show instead).
NOSCRIPT = "<noscript><style>figure.chart>div{display:none}.chart{min-height:0}</style></noscript>"


# --- text ---------------------------------------------------------------------------------------------------------
def md(text: str, inline: bool = False) -> str:
    """Markdown (the tables' own text: ``**bold**``, lists, code) as HTML, with the text's ``<``, ``>`` and ``&``
    escaped first."""
    import markdown

    out = markdown.markdown(html.escape(str(text), quote=False), extensions=["tables"])
    if inline and out.startswith("<p>") and out.endswith("</p>") and out.count("<p>") == 1:
        out = out[3:-4]
    return out


def esc(text: Any) -> str:
    return html.escape(str(text))


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


# --- tables -------------------------------------------------------------------------------------------------------
def _sort_value(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def table_html(table: Table) -> str:
    """``table`` as a sortable HTML table with the cell text of its Markdown view: the same wide (one line per
    variant, a column group per depth) or long shape; each cell carries the number behind it (``data-sort``)."""
    records = table.frame.to_dict("records")
    fixed = [c for c in table.columns if not c.per_depth]
    spread = [c for c in table.columns if c.per_depth]
    if spread:
        depths = list(dict.fromkeys(rec.get("depth") for rec in records))
        keys = list(dict.fromkeys(rec[table.index] for rec in records))
        at = {(rec[table.index], rec.get("depth")): rec for rec in records}
        first = {}
        for rec in records:
            first.setdefault(rec[table.index], rec)
        columns = [(c, None) for c in fixed] + [(c, d) for d in depths for c in spread]
        rows = [[(c, first[key] if i < len(fixed) else at.get((key, d))) for i, (c, d) in enumerate(columns)]
                for key in keys]
        headers = [c.header if i < len(fixed) else (c.header.format(depth=d) if d is not None else c.sub)
                   for i, (c, d) in enumerate(columns)]
    else:
        columns = [(c, None) for c in fixed]
        rows = [[(c, rec) for c in fixed] for rec in records]
        headers = [c.header for c in fixed]
    numeric = []
    for i in range(len(columns)):
        present = [(rec or {}).get(c.key) for c, rec in (row[i] for row in rows)]
        present = [v for v in present if v is not None]
        numeric.append(bool(present) and all(_sort_value(v) is not None for v in present))
    number = ' data-sort-method="number"'
    head = "".join(f"<th{number if num else ''}>{md(h, inline=True)}</th>"
                   for h, num in zip(headers, numeric, strict=True))
    body = []
    for row in rows:
        cells = []
        for (col, rec), num in zip(row, numeric, strict=True):
            value = _sort_value((rec or {}).get(col.key)) if num else None
            sort = "" if not num else f' data-sort="{"" if value is None else repr(value)}"'
            align = ' class="r"' if _right(col) else ""
            cells.append(f"<td{align}{sort}>{md(col.text(rec, 'md'), inline=True)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table class="sortable" id="table-{slug(table.name)}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


def _right(col: Column) -> bool:
    return col.alignment == "r"


def table_section(table: Table) -> str:
    notes = "".join(f'<p class="note">Note: {md(n, inline=True)}</p>' for n in table.notes)
    return (f'<section id="{slug(table.name)}"><h3>{esc(table.title)}</h3>{table_html(table)}'
            f'<p class="caption">{md(table.caption, inline=True)}</p>{notes}</section>')


def _overrides_text(variant) -> str:
    """A variant's RunConfig overrides as JSON, with the row a parameter-matched control matches (``params_of``)."""
    shown = dict(variant.overrides) | ({"params_of": variant.params_of} if variant.params_of else {})
    return json.dumps(shown, sort_keys=True) if shown else ""


# --- charts -------------------------------------------------------------------------------------------------------
def colour(rows: Sequence[str]) -> dict[str, str]:
    """Each row's colour as hex, the same as in the PNG figures (:func:`ablations.report.plot.colors`)."""
    from matplotlib.colors import to_hex

    from .plot import colors

    return {row: to_hex(c) for row, c in colors(rows).items()}


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def accuracy_figure(data: StudyData):
    """Per depth: every ok run's accuracy (one point per seed) and the mean with its 95% interval per variant."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from .aggregate import band
    from .plot import legend_outside_for

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
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

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
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    chosen = [c for c in cells if tag in (c.deltas if delta else c.curves)]
    if not chosen:
        return None
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


def tuning_figure(data: StudyData, records: Sequence[Mapping]) -> Any:
    import plotly.graph_objects as go

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
    import plotly.io as pio

    div = pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f"chart-{name}",
                      config={"displaylogo": False, "responsive": True})
    title = fig.layout.title.text or name
    fallback = (f'<noscript><img alt="{esc(title)}" src="data:image/png;base64,{twin}"></noscript>' if twin else
                f"<noscript><p>(the interactive chart “{esc(title)}” needs JavaScript; its numbers are in the tables "
                "above)</p></noscript>")
    return f'<figure class="chart" id="figure-{name}">{div}{fallback}</figure>'


def band_png(cells: Sequence, tag: str, *, delta: bool, rows: Sequence[str], scale: float = 100.0) -> str | None:
    """The PNG twin of :func:`band_figure` (matplotlib), base64; None when there is nothing to draw."""
    from .plot import apply_style, new_figure

    chosen = [c for c in cells if tag in (c.deltas if delta else c.curves)]
    if not chosen:
        return None
    apply_style()
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
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, metadata={"Software": None})
    return base64.b64encode(buffer.getvalue()).decode("ascii")


# --- the page -----------------------------------------------------------------------------------------------------
def _asset(name: str) -> str:
    return resources.files("ablations.report").joinpath("assets", name).read_text(encoding="utf-8")


def plotly_script(out: Path, results_dir: Path) -> tuple[str, Path | None]:
    """(the page's script tag for plotly.js, the shared bundle file written, if any): ``<results-dir>/plotly.min.js``
    beside a page in the results folder or in a folder that already holds the shared bundle (a report of a study
    that ran in another checkout, written into this one's results), else the bundle inline."""
    from plotly.offline import get_plotlyjs

    bundle = get_plotlyjs()
    if out.resolve().parent == results_dir.resolve() or (out.parent / PLOTLY_BUNDLE).is_file():
        path = out.parent / PLOTLY_BUNDLE
        if not path.is_file() or path.read_text(encoding="utf-8") != bundle:
            path.write_text(bundle, encoding="utf-8")
        return f'<script src="../{PLOTLY_BUNDLE}" charset="utf-8"></script>', path
    return f'<script type="text/javascript">{bundle}</script>', None


def run_facts(data: StudyData, study=None) -> list[tuple[str, str]]:
    """What the runs record of how and where they ran: trials by phase and state, the trials' own wall times,
    the precision and attention modes, and (from a storage) the machines and threads."""
    facts = []
    for phase, runs in (("reported", data.runs), ("tuning", data.tune_runs)):
        if runs:
            states: dict[str, int] = {}
            for r in runs:
                states[r.state] = states.get(r.state, 0) + 1
            facts.append((f"{phase} trials", f"{len(runs)} (" + ", ".join(f"{n} {s}" for s, n in states.items()) + ")"))
    times = [t for r in (*data.runs, *data.tune_runs) if (t := own_seconds(r.summary)) is not None]  # a stack's share
    if times:
        facts.append(("trial wall time", f"{sum(times) / 3600:.2f} worker-hours in all ({len(times)} trials; median "
                                         f"{statistics.median(times):.0f} s per trial and worker)"))
        per_row = []
        for row in data.rows:
            own = [t for r in data.runs if r.row == row and (t := own_seconds(r.summary)) is not None]
            if own:
                per_row.append(f"{row} {statistics.median(own):.0f} s")
        facts.append(("median per reported trial", ", ".join(per_row)))
    modes = data.modes()
    facts.append(("modes (precision + attention)", "; ".join(f"{m}: {n} runs" for m, n in modes.items()) or "—"))
    machines = data.machines()
    if set(machines) != {"not recorded"}:
        facts.append(("what the runs trained on", "; ".join(f"{m}: {n} runs" for m, n in machines.items())))
    workers = sorted({str(r.summary["worker"]).rsplit(":", 1)[0] for r in (*data.runs, *data.tune_runs)
                      if r.summary.get("worker")})
    sources = [str(r.summary["mode_source"]) for r in data.runs if r.summary.get("mode_source")]
    kept = sum(s.startswith("kept: ") for s in sources)  # each names its count of runs then: one line for all
    sources = sorted({s for s in sources if not s.startswith("kept: ")}) + (
        [f"kept: the mode the study's runs before them trained in ({kept} runs)"] if kept else [])
    threads = sorted({(r.config or {}).get("threads") for r in data.runs if (r.config or {}).get("threads")})
    if workers:
        facts.append(("machines (the trials' workers)", ", ".join(workers)))
    if threads:
        facts.append(("threads per trial", ", ".join(map(str, threads))))
    if sources:
        facts.append(("how precision auto chose", "; ".join(sources)))
    if not workers and study is None:
        facts.append(("machines", "not recorded in runs.csv (the storage's trials name their workers)"))
    return facts


def protocol_html(spec) -> str:
    """The study file's protocol: what is compared, on what, how it is scored, the grid and the tuning."""
    rows = [("study", f"{spec.study_name} ({spec.kind}, budget {spec.budget})"),
            ("metric", f"{spec.metric} ({spec.direction}); paired by seed against {BASELINE}"),
            ("grid axes", "; ".join(f"{a}: {', '.join(map(str, v))}" for a, v in spec.axes.items()) or "—")]
    if spec.tune is not None:
        rows.append(("learning rate", f"tuned per variant on seeds {', '.join(map(str, spec.tune.seeds))} from "
                                      f"{', '.join(f'{v:g}' for v in spec.tune.lr)} by mean {spec.tune.metric}"))
    if spec.overrides:
        rows.append(("--set overrides", json.dumps(spec.overrides, sort_keys=True)))
    rows.append(("study file", Path(spec.source).name if spec.source else "—"))
    kv = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in rows)
    base = "".join(f"<tr><td>{esc(k)}</td><td>{esc(json.dumps(v) if not isinstance(v, str) else v)}</td></tr>"
                   for k, v in spec.base.items())
    variants = "".join(f"<tr><td>{esc(v.label)}</td><td>{esc(v.residual)}</td>"
                       f"<td>{esc(json.dumps(v.options, sort_keys=True) if v.options else '')}</td>"
                       f"<td>{esc(_overrides_text(v))}</td></tr>"
                       for v in spec.variants)
    claims = "".join(f"<li><strong>{esc(c.id)}</strong>: {esc(c.claim)} ({esc(c.source)})"
                     + (f"; untestable: {esc(c.reason)}" if not c.testable else "") + "</li>" for c in spec.claims)
    return (f"<p>{esc(spec.description)}</p><dl class=\"kv\">{kv}</dl>"
            f"<h3>Configuration shared by every run</h3><table><thead><tr><th>key</th><th>value</th></tr></thead>"
            f"<tbody>{base}</tbody></table>"
            f"<h3>Variants</h3><table><thead><tr><th>label</th><th>residual</th><th>options</th><th>overrides</th>"
            f"</tr></thead><tbody>{variants}</tbody></table>"
            + (f"<h3>Claims tested</h3><ul>{claims}</ul>" if claims else ""))


def claims_html(tables: Sequence[Table]) -> str:
    claims = next((t for t in tables if t.name == "claims"), None)
    if claims is None:
        return ""
    from .claims import line_text

    lines = "".join(f"<li>{md(line_text(rec)[2:], inline=True)}</li>" for rec in claims.frame.to_dict("records"))
    return (f'<section id="claims-verdicts"><h2>Claims</h2><ul class="claims">{lines}</ul>'
            f'<p class="caption">{md(claims.caption, inline=True)}</p></section>')


#: A figure file larger than this is embedded as a half-size copy (the page links the full file beside it).
EMBED_BYTES = 512 * 1024


def embedded_png(png: Path) -> tuple[bytes, bool]:
    """(the PNG bytes to embed, whether they are a reduced copy): the file itself, or for a file over
    :data:`EMBED_BYTES` a copy at half its size in 256 colours (deterministic: no metadata)."""
    raw = png.read_bytes()
    if len(raw) <= EMBED_BYTES:
        return raw, False
    from PIL import Image

    with Image.open(png) as image:
        small = image.convert("RGB").resize((max(1, image.width // 2), max(1, image.height // 2)),
                                            Image.Resampling.LANCZOS).quantize(256)
    buffer = io.BytesIO()
    small.save(buffer, format="PNG", optimize=True)
    return buffer.getvalue(), True


def figures_html(out: Path) -> str:
    """The report folder's PNG figures, embedded."""
    parts = []
    for png in sorted(out.glob("*.png")):
        raw, reduced = embedded_png(png)
        data = base64.b64encode(raw).decode("ascii")
        note = (f' (a half-size copy; the full figure: <a href="{esc(png.name)}">{esc(png.name)}</a>)' if reduced
                else "")
        parts.append(f'<figure id="png-{slug(png.stem)}"><img alt="{esc(png.stem)}" '
                     f'src="data:image/png;base64,{data}"><figcaption>{esc(png.name)}{note}; also as PDF in the '
                     "report folder</figcaption></figure>")
    return "".join(parts) or "<p>No figure files in the report folder.</p>"


def charts(data: StudyData, spec, cells) -> list[str]:
    """The interactive charts of a grid study (accuracy per seed, paired Δ, curves and Δ curves with their bands,
    tuning)."""
    from .aggregate import aggregate

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
        from .tuning import tuning_records

        fig = tuning_figure(data, tuning_records(data))
        if fig is not None:
            out.append(chart_html(fig, "tuning"))
    return out


def write_report(data: StudyData, spec, tables: Sequence[Table], out: Path, *, results_dir: Path, study=None,
                 source: str = "storage", cells=None) -> Path:
    """``<out>/report.html`` of the study (``tables``: the report's, main first); returns its path."""
    from .stats import main_cells

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cells is None and spec.kind == "grid":
        cells = main_cells(data)
    script, _ = plotly_script(out, Path(results_dir))
    label = spec.first_look()
    summary = summary_line(data, spec, tables)
    nav = "".join(f'<a href="#{slug(t.name)}">{esc(t.name if t.name != "claims" else "claims table")}</a>'
                  for t in tables)
    body = [f"<h1>{esc(data.name)}</h1>", f'<p class="lede">{esc(summary)}</p>',
            f'<p class="warn">{esc(label)}</p>' if label else "",
            f'<nav><a href="../{INDEX}">all studies</a><a href="#claims-verdicts">claims</a>{nav}'
            '<a href="#charts">charts</a><a href="#figures">figures</a><a href="#protocol">protocol</a>'
            '<a href="#run">run</a></nav>',
            claims_html(tables), "<h2>Tables</h2>", *(table_section(t) for t in tables),
            '<h2 id="charts">Charts</h2><p class="caption">Interactive: hover for the values, drag to zoom, click a '
            "legend entry to hide it. Intervals are 95% t intervals over seeds (paired by seed for Δ).</p>",
            *charts(data, spec, cells),
            f'<section id="figures"><h2>Figures</h2>{figures_html(out)}</section>',
            f'<h2 id="protocol">Protocol</h2>{protocol_html(spec)}',
            '<h2 id="run">Run</h2><dl class="kv">'
            + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in run_facts(data, study)) + "</dl>",
            f'<p class="caption">Generated by <code>python -m ablations.report --study {esc(spec.name)} --html</code> '
            f"from {esc('the study storage' if source == 'storage' else 'runs.csv')}; the tables are the report "
            "folder's .md / .csv / .tex.</p>"]
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(data.name)}: study report</title>"
            f'<meta name="ablations-study" content="{esc(data.name)}">'
            f'<meta name="description" content="{esc(summary)}">'
            f"<style>{CSS}</style>{NOSCRIPT}{script}"
            f"<script>{_asset('tablesort.min.js')}\n{_asset('tablesort.number.min.js')}</script>"
            "</head><body>" + "\n".join(b for b in body if b)
            + "<script>document.querySelectorAll('table.sortable').forEach(function (t) { new Tablesort(t); });"
              "</script></body></html>\n")
    path = out / REPORT
    path.write_text(page, encoding="utf-8")
    return path


def summary_line(data: StudyData, spec, tables: Sequence[Table] = ()) -> str:
    """One line: rows × depths × seeds, ok runs, metric, budget and the claims' verdicts (the index shows it)."""
    seeds = sorted({r.seed for r in data.runs if r.seed is not None})
    ok = sum(1 for r in data.runs if r.ok)
    line = (f"{len(data.rows)} rows × depth {', '.join(map(str, data.depths)) or '—'} × {len(seeds)} seeds; "
            f"{ok} ok reported runs; metric {data.metric}; budget {spec.budget}")
    claims = next((t for t in tables if t.name == "claims"), None)
    if claims is not None:
        from .claims import VERDICTS

        verdicts = list(claims.frame["verdict"])
        line += "; claims: " + ", ".join(f"{verdicts.count(v)} {v}" for v in VERDICTS if verdicts.count(v))
    return line + "."


# --- the index ----------------------------------------------------------------------------------------------------
_META = re.compile(r'<meta name="(ablations-study|description)" content="([^"]*)">')


def write_index(results_dir: Path) -> Path:
    """``<results-dir>/index.html``: every ``<study>/report.html`` there (name and one-line summary), and the
    claims ledger when there is one."""
    results_dir = Path(results_dir)
    items = []
    for report in sorted(results_dir.glob(f"*/{REPORT}")):
        head = report.read_text(encoding="utf-8")[:20000]
        meta = dict(_META.findall(head))
        name = html.unescape(meta.get("ablations-study", report.parent.name))
        items.append(f'<tr><td><a href="{esc(report.parent.name)}/{REPORT}">{esc(name)}</a></td>'
                     f'<td>{esc(html.unescape(meta.get("description", "")))}</td></tr>')
    ledger = results_dir / LEDGER
    ledger_html = (f'<p>The claims ledger: <a href="{LEDGER}">{LEDGER}</a>.</p>' if ledger.is_file() else "")
    page = ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Study reports</title>'
            f"<style>{CSS}</style><script>{_asset('tablesort.min.js')}</script></head><body>"
            f"<h1>Study reports</h1>{ledger_html}"
            '<table class="sortable" id="studies"><thead><tr><th>study</th><th>summary</th></tr></thead>'
            f"<tbody>{''.join(items)}</tbody></table>"
            "<p class=\"caption\">Each report is written by <code>python -m ablations.report --study NAME --html</code>"
            "; this index lists every study folder that has one.</p>"
            "<script>document.querySelectorAll('table.sortable').forEach(function (t) { new Tablesort(t); });"
            "</script></body></html>\n")
    path = results_dir / INDEX
    path.write_text(page, encoding="utf-8")
    return path
