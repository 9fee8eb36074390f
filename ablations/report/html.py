"""A study's report as one web page, ``<out>/report.html``, and ``<results-dir>/index.html`` linking every study
that has one (and the claims ledger ``claims.md`` when the results folder has it).

The page holds the claims with their numbers, every report table as a real HTML table (sortable by a click on a
column head: the tablesort library, inlined; each cell sorts by the number behind it), interactive charts
(:mod:`.charts`: hover for the values; the accuracy of every seed, the paired differences with their intervals,
the curves across seeds with their 95% bands, the tuning), the report folder's figures as embedded PNGs, the
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
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from PIL import Image
from plotly.offline import get_plotlyjs

from .charts import charts
from .claims import VERDICTS, line_text
from .format import Column, Table
from .load import BASELINE, StudyData, own_seconds
from .markup import esc, md, shared_sentences, slug, split_caption
from .stats import main_cells

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


# --- tables -------------------------------------------------------------------------------------------------------
def _sort_value(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def table_html(table: Table) -> str:
    """``table`` as a sortable HTML table with the cell text of its Markdown view: the same wide (one line per
    variant, a column group per depth) or long shape; each cell carries the number behind it (``data-sort``)."""
    headers, rows = _layout(table)
    numeric = [_numeric(row[i] for row in rows) for i in range(len(headers))]
    number = ' data-sort-method="number"'
    head = "".join(f"<th{number if num else ''}>{md(h, inline=True)}</th>"
                   for h, num in zip(headers, numeric, strict=True))
    body = "".join("<tr>" + "".join(_cell(col, rec, num) for (col, rec), num in zip(row, numeric, strict=True))
                   + "</tr>" for row in rows)
    return (f'<table class="sortable" id="table-{slug(table.name)}"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table>")


def _layout(table: Table) -> tuple[list[str], list[list[tuple[Column, dict | None]]]]:
    """(headers, rows of (column, record) cells): one row per record, or for a table with per-depth columns one row
    per key with its fixed columns and a group of the per-depth ones for each depth (None where a key has none)."""
    records = table.frame.to_dict("records")
    fixed = [c for c in table.columns if not c.per_depth]
    spread = [c for c in table.columns if c.per_depth]
    if not spread:
        return [c.header for c in fixed], [[(c, rec) for c in fixed] for rec in records]
    depths = list(dict.fromkeys(rec.get("depth") for rec in records))
    at = {(rec[table.index], rec.get("depth")): rec for rec in records}
    first: dict = {}
    for rec in records:
        first.setdefault(rec[table.index], rec)
    headers = [c.header for c in fixed] + [c.header.format(depth=d) if d is not None else c.sub
                                           for d in depths for c in spread]
    rows = [[(c, first[key]) for c in fixed] + [(c, at.get((key, d))) for d in depths for c in spread]
            for key in first]
    return headers, rows


def _numeric(cells) -> bool:
    """Whether a column's present values are all finite numbers (it then sorts by number)."""
    present = [v for v in ((rec or {}).get(col.key) for col, rec in cells) if v is not None]
    return bool(present) and all(_sort_value(v) is not None for v in present)


def _cell(col: Column, rec: dict | None, numeric: bool) -> str:
    value = _sort_value((rec or {}).get(col.key)) if numeric else None
    sort = "" if not numeric else f' data-sort="{"" if value is None else repr(value)}"'
    align = ' class="r"' if _right(col) else ""
    return f"<td{align}{sort}>{md(col.text(rec, 'md'), inline=True)}</td>"


def _right(col: Column) -> bool:
    return col.alignment == "r"


def table_section(table: Table, shared: Sequence[str] = ()) -> str:
    """A table with its one-line caption; the rest of what its caption alone says folds under it (what several
    tables' captions say, ``shared``, is said once above the tables: :func:`reading_html`)."""
    notes = "".join(f'<p class="note">Note: {md(n, inline=True)}</p>' for n in table.notes)
    line, rest = split_caption(table.caption, shared)
    more = ("<details><summary>more on this table</summary>"
            f"<p class=\"caption\">{md(' '.join(rest), inline=True)}</p></details>" if rest else "")
    return (f'<section id="{slug(table.name)}"><h3>{esc(table.title)}</h3>{table_html(table)}'
            f'<p class="caption">{md(line, inline=True)}</p>{more}{notes}</section>')


def kept_tables(out: Path, tables: Sequence[Table]) -> list[Path]:
    """The report folder's tables (a ``<name>.md`` beside its ``.csv`` and ``.tex``) that this report did not build:
    an earlier report's, made from inputs this one lacks (a ``runs.csv`` without its runs' diagnostics cannot
    rebuild the collapse table that their event files gave)."""
    built = {t.name for t in tables}
    return [p for p in sorted(out.glob("*.md"))
            if p.stem not in built and p.with_suffix(".csv").is_file() and p.with_suffix(".tex").is_file()]


def kept_section(path: Path) -> str:
    """A kept table (:func:`kept_tables`) from its markdown, said to be kept."""
    return (f'<section id="{slug(path.stem)}">{md(path.read_text(encoding="utf-8"))}<p class="note">Note: kept from '
            f"an earlier report in this folder ({esc(path.name)}): this report's inputs cannot rebuild it.</p>"
            "</section>")


def reading_html(shared: Sequence[str]) -> str:
    """What several tables' captions say alike, once, above the tables."""
    return ("" if not shared else '<section id="reading"><h3>Reading the tables</h3><p class="caption">'
            f"{md(' '.join(shared), inline=True)}</p></section>")


def _overrides_text(variant) -> str:
    """A variant's RunConfig overrides as JSON, with the row a parameter-matched control matches (``params_of``)."""
    shown = dict(variant.overrides) | ({"params_of": variant.params_of} if variant.params_of else {})
    return json.dumps(shown, sort_keys=True) if shown else ""


# --- the page -----------------------------------------------------------------------------------------------------
def _asset(name: str) -> str:
    return resources.files("ablations.report").joinpath("assets", name).read_text(encoding="utf-8")


def plotly_script(out: Path, results_dir: Path) -> tuple[str, Path | None]:
    """(the page's script tag for plotly.js, the shared bundle file written, if any): ``<results-dir>/plotly.min.js``
    beside a page in the results folder or in a folder that already holds the shared bundle (a report of a study
    that ran in another checkout, written into this one's results), else the bundle inline."""
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
    facts = _trial_facts(data)
    modes = data.modes()
    facts.append(("modes (precision + attention)", "; ".join(f"{m}: {n} runs" for m, n in modes.items()) or "—"))
    return facts + _machine_facts(data, study)


def _trial_facts(data: StudyData) -> list[tuple[str, str]]:
    """The trials by phase and state, and their own wall times (a stack's share for a stacked trial)."""
    facts = []
    for phase, runs in (("reported", data.runs), ("tuning", data.tune_runs)):
        if runs:
            states: dict[str, int] = {}
            for r in runs:
                states[r.state] = states.get(r.state, 0) + 1
            facts.append((f"{phase} trials", f"{len(runs)} (" + ", ".join(f"{n} {s}" for s, n in states.items()) + ")"))
    times = [t for r in (*data.runs, *data.tune_runs) if (t := own_seconds(r.summary)) is not None]
    if times:
        facts.append(("trial wall time", f"{sum(times) / 3600:.2f} worker-hours in all ({len(times)} trials; median "
                                         f"{statistics.median(times):.0f} s per trial and worker)"))
        per_row = []
        for row in data.rows:
            own = [t for r in data.runs if r.row == row and (t := own_seconds(r.summary)) is not None]
            if own:
                per_row.append(f"{row} {statistics.median(own):.0f} s")
        facts.append(("median per reported trial", ", ".join(per_row)))
    return facts


def _machine_facts(data: StudyData, study=None) -> list[tuple[str, str]]:
    """What the runs trained on: the machines, the workers, the threads and how precision ``auto`` chose."""
    facts = []
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


def write_report(data: StudyData, spec, tables: Sequence[Table], out: Path, *, results_dir: Path, study=None,
                 source: str = "storage", cells=None) -> Path:
    """``<out>/report.html`` of the study (``tables``: the report's, main first); returns its path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if cells is None and spec.kind == "grid":
        cells = main_cells(data)
    script, _ = plotly_script(out, Path(results_dir))
    label = spec.first_look()
    summary = summary_line(data, spec, tables)
    shared = shared_sentences([t.caption for t in tables if t.name != "claims"])
    kept = kept_tables(out, tables)
    nav = "".join(f'<a href="#{slug(t.name)}">{esc(t.name if t.name != "claims" else "claims table")}</a>'
                  for t in tables) + "".join(f'<a href="#{slug(p.stem)}">{esc(p.stem)}</a>' for p in kept)
    body = [f"<h1>{esc(data.name)}</h1>", f'<p class="lede">{esc(summary)}</p>',
            f'<p class="warn">{esc(label)}</p>' if label else "",
            f'<nav><a href="../{INDEX}">all studies</a><a href="#claims-verdicts">claims</a>{nav}'
            '<a href="#charts">charts</a><a href="#figures">figures</a><a href="#protocol">protocol</a>'
            '<a href="#run">run</a></nav>',
            claims_html(tables), "<h2>Tables</h2>", reading_html(shared), *(table_section(t, shared) for t in tables),
            *(kept_section(p) for p in kept),
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
