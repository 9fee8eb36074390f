"""The one table formatter of the reports: a table is a list of columns and records, rendered as Markdown,
LaTeX or CSV with the same numbers (``render``, ``write_table``), plus the number formats they share."""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..cli import markdown_table
from .load import (
    StudyData,
)

# Imported where they are used, not here: pandas. Each takes from a tenth of a second to seconds to import, and the
# command-line tools start without them.

MARK = "*"  # Holm-significant paired difference
MIN_IMPORTANCE_TRIALS = 4  # fewer completed trials in a scope: a note instead of importances
_BARE_PERCENT = re.compile(r"(?<!\\)%")
_TEX = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
        "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
        "†": r"$^{\dagger}$", "±": r"$\pm$", "×": r"$\times$", "≥": r"$\geq$", "<": r"$<$", ">": r"$>$",
        "—": "---", "–": "--", "−": "$-$", "‖": r"$\|$", "Δ": r"$\Delta$", "γ": r"$\gamma$", "α": r"$\alpha$",
        "′": r"$'$", "·": r"$\cdot$", "√": r"$\surd$", "≤": r"$\leq$", "τ": r"$\tau$", "≈": r"$\approx$",
        "χ": r"$\chi$", "²": r"$^2$", "⋯": r"$\cdots$", "÷": r"$\div$"}


# --- the one formatter -------------------------------------------------------------------------------------------
@dataclass
class Column:
    """How a frame column (``key``) is shown in Markdown / LaTeX.

    ``fmt`` formats a number (after ``scale``, followed by ``suffix``); without ``fmt`` the value is text. A
    ``render(record, style)`` callable replaces both and returns the final text (LaTeX already escaped).
    ``per_depth`` columns repeat per depth: ``header`` is then a template with ``{depth}`` (Markdown) and ``sub``
    the header under the LaTeX group "depth d"."""

    key: str
    header: str
    fmt: str | None = None
    scale: float = 1.0
    suffix: str = ""
    align: str = ""  # l | r; default: r for numbers and rendered cells, l for text
    render: Callable[[Mapping[str, Any], str], str] | None = None
    per_depth: bool = False
    sub: str = ""

    @property
    def alignment(self) -> str:
        return self.align or ("l" if self.fmt is None and self.render is None else "r")

    def text(self, record: Mapping[str, Any] | None, style: str) -> str:
        if record is None:
            return "—" if style == "md" else "---"
        if self.render is not None:  # its own LaTeX, but a bare % would comment out the rest of the row
            text = self.render(record, style)
            return text if style == "md" else _BARE_PERCENT.sub(r"\\%", text)
        value = record.get(self.key)
        if self.fmt is None:
            text = "—" if value is None or value == "" else str(value)
        else:
            text = num(value if value is None or self.scale == 1.0 else value * self.scale, self.fmt)
            text += self.suffix if text != "—" else ""
        return text if style == "md" else latex_escape(text)


@dataclass
class Table:
    """One table: ``frame`` (numbers), ``columns`` (the Markdown/LaTeX view), ``csv`` ((frame column, CSV
    header, format) triples; format "" for text and ints)."""

    name: str
    title: str
    caption: str
    frame: Any  # pandas DataFrame, dtype object: Python numbers, None when undefined
    columns: list[Column]
    csv: list[tuple[str, str, str]]
    notes: list[str] = field(default_factory=list)
    index: str = "variant"  # the line key of a wide (per-depth) view

    def markdown(self) -> str:
        return render(self, "md")

    def latex(self, label: str) -> str:
        return render(self, "tex", label=label)

    def to_csv(self) -> str:
        return render(self, "csv")


def render(table: Table, style: str, label: str = "") -> str:
    """``table`` as Markdown (``md``: title, table, caption, notes), LaTeX (``tex``: a booktabs ``table`` float
    with caption and label) or ``csv`` (the frame)."""
    if style == "csv":
        return _csv(table)
    headers, body, align, depths = _grid(table, style)
    if style == "md":
        text = markdown_table(headers, body, align, pad=True)
        parts = [f"### {table.title}", "", text, "", table.caption]
        parts += [f"\nNote: {n}" for n in table.notes]
        return "\n".join(parts) + "\n"
    caption = latex_escape(table.caption + "".join(f" Note: {n}" for n in table.notes))
    return "\n".join([r"\begin{table}", r"\centering", rf"\caption{{{caption}}}", rf"\label{{{label}}}",
                      rf"\begin{{tabular}}{{{align}}}", r"\toprule", *_latex_head(table, headers, depths), r"\midrule",
                      *(" & ".join(line) + r" \\" for line in body), r"\bottomrule", r"\end{tabular}",
                      r"\end{table}"]) + "\n"


def _csv(table: Table) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([header for _, header, _ in table.csv])
    for rec in table.frame.to_dict("records"):
        writer.writerow([csv_value(rec.get(key), fmt) for key, _, fmt in table.csv])
    return out.getvalue()


def _grid(table: Table, style: str) -> tuple[list[str], list[list[str]], str, list]:
    """(headers, body cells in ``style``, alignment, the depths of a wide table): one line per record, or for a
    table with per-depth columns one line per index value with a column group per depth."""
    records = table.frame.to_dict("records")
    fixed = [c for c in table.columns if not c.per_depth]
    spread = [c for c in table.columns if c.per_depth]
    if not spread:
        return ([c.header for c in fixed], [[c.text(rec, style) for c in fixed] for rec in records],
                "".join(c.alignment for c in fixed), [])
    depths = list(dict.fromkeys(rec.get("depth") for rec in records))
    lines = list(dict.fromkeys(rec[table.index] for rec in records))
    at = {(rec[table.index], rec.get("depth")): rec for rec in records}
    body = [[c.text(at.get((line, depths[0])) if depths else None, style) for c in fixed]
            + [c.text(at.get((line, d)), style) for d in depths for c in spread] for line in lines]
    headers = [c.header for c in fixed] + [c.header.format(depth=d) if d is not None else c.sub
                                            for d in depths for c in spread]
    align = "".join(c.alignment for c in fixed) + "".join(c.alignment for _ in depths for c in spread)
    return headers, body, align, depths


def _latex_head(table: Table, headers: Sequence[str], depths: list) -> list[str]:
    """The LaTeX header lines: one, or for a wide table two, "depth d" groups over their sub-columns."""
    fixed = [c for c in table.columns if not c.per_depth]
    spread = [c for c in table.columns if c.per_depth]
    if not spread or depths == [None]:
        return [" & ".join(latex_escape(h) for h in headers) + r" \\"]
    k, width = len(fixed), len(spread)
    groups = [rf"\multicolumn{{{width}}}{{c}}{{depth {d}}}" for d in depths]
    rules = "".join(rf"\cmidrule(lr){{{k + 1 + i * width}-{k + (i + 1) * width}}}" for i in range(len(depths)))
    subs = [latex_escape(c.header) for c in fixed] + [latex_escape(c.sub) for _ in depths for c in spread]
    return [" & ".join([""] * k + groups) + r" \\", rules, " & ".join(subs) + r" \\"]


def write_table(table: Table, out: Path, study_name: str) -> list[Path]:
    """``<out>/<name>.md``, ``.tex`` and ``.csv``."""
    out.mkdir(parents=True, exist_ok=True)
    label = "tab:" + re.sub(r"[^A-Za-z0-9]+", "-", f"{study_name}-{table.name}")
    paths = []
    for ext, text in (("md", table.markdown()), ("tex", table.latex(label)), ("csv", table.to_csv())):
        path = out / f"{table.name}.{ext}"
        with open(path, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        paths.append(path)
    return paths


def frame(records: Sequence[Mapping[str, Any]], columns: Sequence[str]):
    """A DataFrame of ``records`` (dtype object: numbers stay Python numbers, None stays None)."""
    import pandas as pd

    return pd.DataFrame([[rec.get(c) for c in columns] for rec in records], columns=list(columns), dtype=object)


def num(x: float | None, fmt: str) -> str:
    return "—" if x is None or not math.isfinite(x) else format(x, fmt)


def pct(x: float | None, digits: int = 2) -> str:
    return num(None if x is None else 100.0 * x, f".{digits}f")


def p_text(p: float | None) -> str:
    return "—" if p is None else ("<0.001" if p < 0.001 else f"{p:.3f}")


def csv_value(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return format(value, fmt) if fmt and isinstance(value, (int, float)) else str(value)


def latex_escape(text: str) -> str:
    return "".join(_TEX.get(ch, ch) for ch in str(text))


def fmt_param(v: Any) -> str:
    return format(v, ".4g") if isinstance(v, float) else str(v)


def status_notes(data: StudyData) -> list[str]:
    return [f"{data.pending} trial(s) still running or waiting are not included."] if data.pending else []
