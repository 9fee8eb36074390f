"""The report's tables: each built once as a pandas DataFrame of numbers (:class:`Table`), rendered by one
formatter (:func:`render`) to Markdown, LaTeX (booktabs) or CSV.

A table's ``frame`` holds one record per result line (numbers as floats/ints, None when undefined); its
``columns`` say how the Markdown/LaTeX view shows them. Columns marked ``per_depth`` are spread into one group per
depth (a wide table: one line per variant), everything else is shown as it is (a long table). The CSV is the frame
itself (``csv`` names and formats its columns), so the CSV always stays long and machine-readable.
"""

from __future__ import annotations

import csv
import io
import math
import re
import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .events import ATTN_ENTROPY_MEAN, ATTN_SIM_ADJ_MEAN, SIMILAR_BLOCKS, RunEvents, read_run
from .load import (
    AUC_KEY,
    BASELINE,
    EPOCH_TIME_KEY,
    FRACTION_KEYS,
    PARAMS_KEY,
    THROUGHPUT_KEY,
    WALL_TIME_KEY,
    Run,
    StudyData,
    best_per_row,
    finite,
    first_line,
    mean_of,
)
from .stats import ALPHA, CONFIDENCE, POWER, ZERO_SD, Cell, family_size

MARK = "*"  # Holm-significant paired difference
MIN_IMPORTANCE_TRIALS = 4  # fewer completed trials in a scope: a note instead of importances
_TEX = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
        "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
        "†": r"$^{\dagger}$", "±": r"$\pm$", "×": r"$\times$", "≥": r"$\geq$", "<": r"$<$", ">": r"$>$",
        "—": "---", "–": "--", "−": "$-$", "‖": r"$\|$", "Δ": r"$\Delta$", "γ": r"$\gamma$", "α": r"$\alpha$",
        "′": r"$'$", "·": r"$\cdot$", "√": r"$\surd$", "≤": r"$\leq$", "τ": r"$\tau$", "≈": r"$\approx$"}


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
        if self.render is not None:
            return self.render(record, style)
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
    records = table.frame.to_dict("records")
    if style == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow([header for _, header, _ in table.csv])
        for rec in records:
            writer.writerow([csv_value(rec.get(key), fmt) for key, _, fmt in table.csv])
        return out.getvalue()
    fixed = [c for c in table.columns if not c.per_depth]
    spread = [c for c in table.columns if c.per_depth]
    if spread:  # wide: one line per index value, one column group per depth
        depths = list(dict.fromkeys(rec.get("depth") for rec in records))
        lines = list(dict.fromkeys(rec[table.index] for rec in records))
        at = {(rec[table.index], rec.get("depth")): rec for rec in records}
        body = [[c.text(at.get((line, depths[0])) if depths else None, style) for c in fixed]
                + [c.text(at.get((line, d)), style) for d in depths for c in spread] for line in lines]
        headers = [c.header for c in fixed] + [c.header.format(depth=d) if d is not None else c.sub
                                                for d in depths for c in spread]
        align = "".join(c.alignment for c in fixed) + "".join(c.alignment for _ in depths for c in spread)
    else:
        depths = []
        body = [[c.text(rec, style) for c in fixed] for rec in records]
        headers = [c.header for c in fixed]
        align = "".join(c.alignment for c in fixed)
    if style == "md":
        from tabulate import tabulate

        text = tabulate(body, headers=headers, tablefmt="pipe", disable_numparse=True,
                        colalign=[{"l": "left", "r": "right"}[a] for a in align]) if body else \
            "| " + " | ".join(headers) + " |\n|" + "|".join("---" for _ in headers) + "|"
        parts = [f"### {table.title}", "", text, "", table.caption]
        parts += [f"\nNote: {n}" for n in table.notes]
        return "\n".join(parts) + "\n"
    caption = latex_escape(table.caption + "".join(f" Note: {n}" for n in table.notes))
    head = [" & ".join(latex_escape(h) for h in headers) + r" \\"]
    if spread and depths != [None]:  # two header lines: "depth d" groups over their sub-columns
        k, width = len(fixed), len(spread)
        groups = [rf"\multicolumn{{{width}}}{{c}}{{depth {d}}}" for d in depths]
        rules = "".join(rf"\cmidrule(lr){{{k + 1 + i * width}-{k + (i + 1) * width}}}" for i in range(len(depths)))
        subs = [latex_escape(c.header) for c in fixed] + [latex_escape(c.sub) for _ in depths for c in spread]
        head = [" & ".join([""] * k + groups) + r" \\", rules, " & ".join(subs) + r" \\"]
    return "\n".join([r"\begin{table}", r"\centering", rf"\caption{{{caption}}}", rf"\label{{{label}}}",
                      rf"\begin{{tabular}}{{{align}}}", r"\toprule", *head, r"\midrule",
                      *(" & ".join(line) + r" \\" for line in body), r"\bottomrule", r"\end{tabular}",
                      r"\end{table}"]) + "\n"


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


# --- main table (grid studies) -------------------------------------------------------------------------------------
MAIN_KEYS = ["variant", "depth", "lr", "n", "n_runs", "mean", "std", "n_diverged", "n_failed", "best", "baseline",
             "seeds", "n_pairs", "delta", "sd", "ci_low", "ci_high", "p_t", "p_t_holm", "p_wilcoxon",
             "p_wilcoxon_holm", "wilcoxon_too_small", "mde", "significant", "n_diverged_pairs", "pair_seeds"]
CI_LABEL = f"{100 * CONFIDENCE:.0f}% CI, unadjusted"


def cell_records(cells: Sequence[Cell]) -> list[dict[str, Any]]:
    """The cells as plain records (accuracies and differences as fractions)."""
    records = []
    for c in cells:
        cmp = c.comparison
        records.append({
            "variant": c.row, "depth": c.depth, "n": c.n, "n_runs": c.n_runs, "mean": c.mean, "std": c.std,
            "n_diverged": c.n_diverged, "n_failed": c.n_failed, "best": c.best, "baseline": c.baseline,
            "seeds": list(c.seeds), "n_pairs": cmp.n if cmp else None, "delta": cmp.delta if cmp else None,
            "sd": cmp.sd if cmp else None, "ci_low": cmp.ci_low if cmp else None,
            "ci_high": cmp.ci_high if cmp else None, "p_t": cmp.p_t if cmp else None, "p_t_holm": c.p_t_holm,
            "p_wilcoxon": cmp.p_wilcoxon if cmp else None, "p_wilcoxon_holm": c.p_wilcoxon_holm,
            "wilcoxon_too_small": cmp.wilcoxon_too_small if cmp else None, "mde": c.mde,
            "significant": c.significant if c.p_t_holm is not None else None,  # None: no test
            "n_diverged_pairs": c.n_diverged_pairs if cmp else None, "pair_seeds": list(c.pair_seeds),
        })
    return records


def acc_text(rec: Mapping[str, Any], style: str) -> str:
    """A main-table accuracy cell: ``mean ± sd (n=k)``, bold when best in its depth, with its diverged and
    failed runs."""
    tail = ""
    if rec["n_diverged"]:
        tail += f" ({rec['n_diverged']}/{rec['n_runs']} diverged)"
    if rec["n_failed"]:
        tail += f" ({rec['n_failed']} failed)"
    if rec["mean"] is None:
        return ("—" if style == "md" else "---") + tail
    pm = " ± " if style == "md" else r" $\pm$ "
    core = pct(rec["mean"]) + (pm + pct(rec["std"]) if rec["std"] is not None else "")
    if rec["best"]:
        core = f"**{core}**" if style == "md" else rf"\textbf{{{core}}}"
    return f"{core} (n={rec['n']}){tail}"


def cell_text(cell: Cell, style: str) -> str:
    return acc_text(cell_records([cell])[0], style)


def signed(x: float | None, style: str, digits: int = 2) -> str:
    text = num(None if x is None else 100.0 * x, f"+.{digits}f").replace("-", "−")
    return text if style == "md" else latex_escape(text)


def all_equal(rec: Mapping[str, Any]) -> bool:
    """n ≥ 2 paired differences, all equal (s_d = 0): no interval, no test."""
    return rec["n_pairs"] is not None and rec["n_pairs"] >= 2 and rec["sd"] is not None and rec["sd"] <= ZERO_SD


def equal_text(rec: Mapping[str, Any], style: str) -> str:
    """The text of a comparison without variance: ``all n differences equal: Δ = x, no interval``."""
    return f"all {rec['n_pairs']} differences equal: Δ = {signed(rec['delta'], 'md')} pp, no interval" \
        if style == "md" else latex_escape(equal_text(rec, "md"))


def ci_text(rec: Mapping[str, Any], style: str) -> str:
    """``[CI low, CI high]`` in pp; the no-interval text for differences without variance; ``—``."""
    if all_equal(rec):
        return equal_text(rec, style)
    if rec["ci_low"] is None:
        return "—" if style == "md" else "---"
    return f"[{signed(rec['ci_low'], style)}, {signed(rec['ci_high'], style)}]"


def delta_text(rec: Mapping[str, Any], style: str) -> str:
    """``Δ [CI low, CI high]`` in percentage points, ``*`` when Holm-significant; ``baseline`` / ``—``."""
    if rec["baseline"]:
        return "baseline"
    if rec["n_pairs"] is None or rec["delta"] is None:
        return "—" if style == "md" else "---"
    if all_equal(rec):
        text = equal_text(rec, style)
    else:
        text = signed(rec["delta"], style) + (f" {ci_text(rec, style)}" if rec["ci_low"] is not None else "")
    if rec["significant"]:
        text += MARK if style == "md" else r"$^{*}$"
    if rec["n_pairs"] != rec["n"]:
        text += f" ({rec['n_pairs']} pair{'s' if rec['n_pairs'] != 1 else ''})"
    return text


def _mde_range(cells: Sequence[Cell]) -> str:
    values = sorted(c.mde for c in cells if c.mde is not None)
    if not values:
        return "no cell has an MDE (fewer than 2 pairs or all paired differences equal)"
    return (f"MDE over the table: {100 * values[0]:.2f} – {100 * statistics.median(values):.2f} – "
            f"{100 * values[-1]:.2f} pp (min – median – max)")


def _seeds_text(data: StudyData) -> str:
    seeds = sorted({r.seed for r in data.runs if r.seed is not None})
    return f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} ({', '.join(map(str, seeds))})" if seeds else "seeds"


def _method(data: StudyData, cells: Sequence[Cell]) -> str:
    """The statistics sentences shared by the main and the paired table's captions (and the claims')."""
    if not any(c.comparison is not None for c in cells):
        return f"No paired comparison: the study has no '{BASELINE}' variant (or no results for it)."
    return method_text(cells, f"{BASELINE} at the same depth", "of the table")


def method_text(cells: Sequence[Cell], against: str, family: str, wilcoxon: bool = True) -> str:
    """Test, correction, family size m for each test, interval, MDE and how diverged, tied and small-n comparisons
    are treated, for the comparisons of ``cells`` (one Holm family)."""
    m = family_size(cells)
    compared = [c for c in cells if c.comparison is not None]
    significant = [c for c in compared if c.significant]
    found = (f"{len(significant)} of the {m} comparisons significant after Holm" if m
             else "no comparison has a test")
    equal = [c for c in compared if c.comparison.all_equal]
    small = [c for c in compared if c.comparison.wilcoxon_too_small]
    diverged = sum(c.n_diverged_pairs for c in compared)
    check = (f"; Wilcoxon signed-rank test (two-sided, scipy.stats.wilcoxon) as a check, Holm-adjusted over the "
             f"same m = {m} comparisons; {MARK} = Holm-adjusted paired t-test p < {ALPHA}; {found}. The exact "
             f"Wilcoxon test cannot reject at n ≤ 5 pairs (its smallest two-sided p is 2/2^n = {2 / 2 ** 5:.4g} at "
             f"n = 5): such cells read 'n too small' ({len(small)} here)." if wilcoxon else f"; {found}.")
    text = (f"Δ = mean paired difference to {against} in percentage points (pp), paired by seed (common random "
            f"numbers: the same seed gives every variant the same initial weights, data split, batch order and "
            f"augmentation), with its {100 * CONFIDENCE:.0f}% t-based confidence interval, unadjusted for the m comparisons. "
            f"Test: paired two-sided t-test over seeds (scipy.stats.ttest_rel), Holm–Bonferroni over the m = {m} "
            f"comparisons {family} with a defined test at α = {ALPHA}{check} MDE = minimum detectable effect: the "
            f"true Δ the paired t-test at "
            f"the Bonferroni level α′ = α/m = {ALPHA / max(1, m):.4g} (Holm's first, strictest step) detects with "
            f"power {POWER}, from the noncentral t distribution (df = n−1, noncentrality Δ·√n/s_d; s_d = sample sd "
            f"of the n paired differences); {_mde_range(cells)}. Diverged runs stay in the pairs as failures at "
            f"chance-level accuracy (1/number of classes): {diverged} pair{'s' if diverged != 1 else ''} "
            f"counted that way. A comparison with fewer than 2 pairs has no test and no MDE")
    if equal:
        text += (f"; {len(equal)} comparison{'s' if len(equal) != 1 else ''} with all paired differences equal "
                 f"(s_d = 0) {'have' if len(equal) != 1 else 'has'} no interval, no test and no MDE and never "
                 f"count{'' if len(equal) != 1 else 's'} as significant")
    return text + "."


def lr_text(data: StudyData, row: str) -> str:
    """The learning rate(s) the row's report-phase runs trained at: one value, 'mixed: a, b' when they disagree,
    '—' when no run stored it."""
    lrs = sorted({r.lr for r in data.runs if r.row == row and r.lr is not None})
    if not lrs:
        return "—"
    return fmt_param(lrs[0]) if len(lrs) == 1 else "mixed: " + ", ".join(fmt_param(v) for v in lrs)


def main_table(data: StudyData, cells: Sequence[Cell]) -> Table:
    """Wide: one line per variant with its LR; per depth the accuracy (mean ± sd) and Δ [95% CI] vs the baseline."""
    records = [rec | {"lr": lr_text(data, rec["variant"])} for rec in cell_records(cells)]
    acc_header = "depth {depth}" if data.depths else "accuracy"
    columns = [Column("variant", "variant"), Column("lr", "LR", align="r"),
               Column("mean", acc_header, render=acc_text, per_depth=True, sub="acc. (%)"),
               Column("delta", f"Δ vs {BASELINE} (pp) [{CI_LABEL}], depth {{depth}}", render=delta_text,
                      per_depth=True, sub=f"Δ vs {BASELINE} (pp) [{CI_LABEL}]")]
    csv_cols = [("variant", "variant", ""), ("depth", "depth", ""), ("lr", "lr", ""), ("n", "n", ""),
                ("n_runs", "n_runs", ""), ("mean", f"mean_{data.metric}", ".6f"), ("std", f"std_{data.metric}", ".6f"),
                ("n_diverged", "n_diverged", ""), ("n_failed", "n_failed", ""), ("n_pairs", "n_pairs", ""),
                ("delta", "delta_vs_standard", ".6f"), ("ci_low", "ci_low", ".6f"), ("ci_high", "ci_high", ".6f"),
                ("p_t_holm", "p_ttest_rel_holm", ".6g"), ("significant", "significant", ""),
                ("best", "best_in_depth", ""), ("seeds", "seeds", "")]
    caption = (f"Top-1 {'test' if data.metric.startswith('test') else 'validation'} accuracy (%) of study {data.name}: {data.metric} ({METRIC_TEXT.get(data.metric, data.metric)}"
               f" of each run), mean ± sample sd (ddof=1) over {_seeds_text(data)}, n = ok runs (completed, not "
               f"diverged). LR = the peak learning rate the variant's reported runs trained at. Bold: best mean per "
               f"depth. {_method(data, cells)} Raw and adjusted p-values of both tests and the MDE of every cell are "
               f"in table 'paired'. Diverged runs (non-finite loss) are shown as 'k/n diverged' and excluded from "
               f"mean and sd (not from the pairs); failed or pruned runs as '(k failed)' and drop their seed's pair.")
    split = "test" if data.metric.startswith("test") else "val"
    return Table("main", f"{data.name}: top-1 {split} accuracy (%) by depth", caption, frame(records, MAIN_KEYS),
                 columns, csv_cols, status_notes(data))


METRIC_TEXT = {"best_val_acc": "the best epoch's val accuracy", "final_val_acc": "the final epoch's val accuracy",
               "test_acc": "the test split's accuracy at the final epoch",
               "test_acc_at_best_val": "the test split's accuracy at the epoch chosen on validation"}


def wilcoxon_text(key: str) -> Callable[[Mapping[str, Any], str], str]:
    """A Wilcoxon p cell: ``n too small`` when the exact test can never reject at this n."""
    def render(rec: Mapping[str, Any], style: str) -> str:
        text = "n too small" if rec["wilcoxon_too_small"] else p_text(rec[key])
        return latex_escape(text) if style == "tex" else text
    return render


def paired_table(data: StudyData, cells: Sequence[Cell]) -> Table:
    """Long: one line per compared variant × depth with n, Δ, CI, both tests raw and Holm-adjusted, MDE."""
    records = [rec for rec, c in zip(cell_records(cells), cells, strict=True) if c.comparison is not None]

    def p(key):
        return lambda rec, style: latex_escape(p_text(rec[key])) if style == "tex" else p_text(rec[key])

    columns = [Column("variant", "variant"), Column("depth", "depth", fmt="d"), Column("n_pairs", "pairs", fmt="d"),
               Column("delta", "Δ (pp)", render=lambda rec, style: signed(rec["delta"], style)),
               Column("ci_low", f"{CI_LABEL} (pp)", render=ci_text),
               Column("p_t", "p (t)", render=p("p_t")), Column("p_t_holm", "p (t, Holm)", render=p("p_t_holm")),
               Column("p_wilcoxon", "p (Wilcoxon)", render=wilcoxon_text("p_wilcoxon")),
               Column("p_wilcoxon_holm", "p (Wilcoxon, Holm)", render=wilcoxon_text("p_wilcoxon_holm")),
               Column("mde", "MDE (pp)", fmt=".2f", scale=100.0),
               Column("n_diverged_pairs", "diverged in pairs", fmt="d"),
               Column("significant", "significant",
                      render=lambda rec, style: {True: "yes", False: "no"}.get(rec["significant"], "—" if style == "md" else "---"),
                      align="l")]
    csv_cols = [("variant", "variant", ""), ("depth", "depth", ""), ("n_pairs", "n_pairs", ""),
                ("delta", "delta", ".6f"), ("sd", "sd_differences", ".6f"), ("ci_low", "ci_low", ".6f"),
                ("ci_high", "ci_high", ".6f"), ("p_t", "p_ttest_rel", ".6g"), ("p_t_holm", "p_ttest_rel_holm", ".6g"),
                ("p_wilcoxon", "p_wilcoxon", ".6g"), ("p_wilcoxon_holm", "p_wilcoxon_holm", ".6g"),
                ("wilcoxon_too_small", "wilcoxon_n_too_small", ""), ("mde", "mde", ".6f"),
                ("n_diverged_pairs", "n_diverged_pairs", ""), ("significant", "significant", ""),
                ("pair_seeds", "pair_seeds", "")]
    caption = (f"Paired comparisons with {BASELINE} in study {data.name} ({data.metric}; differences in percentage "
               f"points, CSV in fractions), over {_seeds_text(data)}; pairs = seeds where both runs have a result "
               f"(a diverged run counts at chance level; failed or missing runs drop their seed). "
               f"{_method(data, cells)}")
    return Table("paired", f"{data.name}: paired differences vs {BASELINE}", caption,
                 frame(records, MAIN_KEYS), columns, csv_cols, status_notes(data))


# --- convergence ----------------------------------------------------------------------------------------------------
def convergence_table(data: StudyData) -> Table:
    records = []
    for row in data.rows:
        for depth in data.depths or [None]:
            runs = data.by_row_depth(row, depth)
            if not runs:
                continue
            ok = [r for r in runs if r.ok]
            rec = {"variant": row, "depth": depth, "n": len(ok), "n_diverged": sum(1 for r in runs if r.diverged)}
            for key in (*FRACTION_KEYS, AUC_KEY, EPOCH_TIME_KEY, WALL_TIME_KEY):
                rec[key] = mean_of(r.summary.get(key) for r in ok)
            records.append(rec)
    columns = [Column("variant", "variant"), Column("depth", "depth", fmt="d", align="l"), Column("n", "n", fmt="d"),
               *(Column(k, f"epochs to {p}%", fmt=".1f") for k, p in zip(FRACTION_KEYS, (90, 95, 99), strict=True)),
               Column(AUC_KEY, "val-acc AUC (%)", fmt=".2f", scale=100.0),
               Column(EPOCH_TIME_KEY, "s / epoch", fmt=".2f"), Column(WALL_TIME_KEY, "wall time (s)", fmt=".1f"),
               Column("n_diverged", "div.", fmt="d")]
    csv_cols = [("variant", "variant", ""), ("depth", "depth", ""), ("n", "n", ""),
                *((k, k, ".4f") for k in FRACTION_KEYS), (AUC_KEY, AUC_KEY, ".6f"),
                (EPOCH_TIME_KEY, EPOCH_TIME_KEY, ".6f"), (WALL_TIME_KEY, WALL_TIME_KEY, ".6f"),
                ("n_diverged", "n_diverged", "")]
    caption = ("Convergence per variant and depth, means over the non-diverged completed runs (n): first epoch "
               "(1-based) reaching 90/95/99% of the run's own best val accuracy; val-acc AUC = mean val accuracy "
               "over the planned epochs (unmeasured epochs count 0); wall time per epoch (train + val) and per run; "
               "div. = diverged runs (not in the means).")
    keys = ["variant", "depth", "n", *FRACTION_KEYS, AUC_KEY, EPOCH_TIME_KEY, WALL_TIME_KEY, "n_diverged"]
    return Table("convergence", f"{data.name}: convergence", caption, frame(records, keys), columns, csv_cols)


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
                ev = events.get(run.number, RunEvents()) if events is not None else read_run(run.log_dir)
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
GAIN_TAGS = {"forward": "diag/composite_gain/forward", "backward": "diag/composite_gain/backward"}
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
                ev = (events.get(run.number, RunEvents()) if events is not None else read_run(run.log_dir)) \
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
    if run.log_dir is not None and (run.log_dir / "hparams.yaml").is_file():
        for key, value in _DIM_RE.findall((run.log_dir / "hparams.yaml").read_text()):
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


def cost_table(data: StudyData, representative: dict[str, Run], *, depth_note: str) -> Table:
    """Params and forward FLOPs (``costs.measure``, batch 1) of each row's representative config (as the trial
    stored it) vs the same config with the standard residual; measured train images/s (mean over the row's
    completed runs at that depth)."""
    import inspect

    from ..costs import measure

    accepted = set(inspect.signature(measure).parameters)
    cache: dict[tuple, dict] = {}
    records, notes = [], []
    ignored: set[str] = set()
    for row in data.rows:
        run = representative.get(row)
        if run is None:
            continue
        cfg = run.config
        dims = model_dims(run)
        size = dict(embed_dim=cfg.get("embed_dim"), depth=run.depth or cfg.get("depth"), num_heads=cfg.get("num_heads"),
                    img_size=dims.get("img_size"), patch_size=dims.get("patch_size"),
                    num_classes=dims.get("num_classes"), in_chans=dims.get("in_chans"))
        for key in ("mlp_ratio", "global_pool", "qkv_bias", "class_token"):
            if key in accepted and key in cfg:
                size[key] = cfg[key]
            elif key == "mlp_ratio" and cfg.get(key) is not None:
                ignored.add(f"mlp_ratio={cfg[key]}")
        options = dict(cfg.get("residual_options") or {})
        residual = cfg.get("residual", run.variant)
        try:
            if any(v is None for v in size.values()):
                raise ValueError("model size unknown (no hparams.yaml and the dataset cannot be constructed)")
            own = _measure(measure, cache, residual, options, size)
            base = _measure(measure, cache, "standard", {}, size)
        except Exception as exc:  # noqa: BLE001 - one unmeasurable row must not stop the report
            own = base = None
            notes.append(f"{row}: not measured ({first_line(exc)}).")
        same_depth = [r for r in data.runs if r.row == row and r.depth == run.depth and r.state == "complete"]
        trained = mean_of(r.summary.get(PARAMS_KEY) for r in same_depth)
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
               "torch FlopCounterMode via ablations.costs.measure) of the variant's own configuration (as its trial "
               "stored it), overhead vs the same configuration with the standard residual; trained params = "
               "param_count of the trained runs (run summary); train img/s = measured training throughput, mean over "
               "the variant's completed runs at that depth (n).")
    if ignored:
        notes.append(f"costs.measure() takes no mlp_ratio: FLOPs/params are for its default MLP width, not the "
                     f"trained {', '.join(sorted(ignored))}.")
    return Table("cost", f"{data.name}: cost", caption, frame(records, keys), columns,
                 [(k, k, fmts.get(k, "")) for k in keys], notes)


def _measure(measure, cache: dict, residual: str, options: dict, size: dict) -> dict:
    key = (residual, repr(sorted(options.items())), repr(sorted(size.items())))
    if key not in cache:
        cache[key] = measure(residual, options, **size)
    return cache[key]


# --- search studies ------------------------------------------------------------------------------------------------
def search_table(data: StudyData) -> Table:
    best = best_per_row(data)
    records = []
    for row in data.rows:
        runs = [r for r in data.runs if r.row == row]
        b = best.get(row)
        records.append({"variant": row, **{s: sum(1 for r in runs if r.state == s)
                                            for s in ("complete", "pruned", "failed")},
                        data.metric: b.acc if b else None, "trial": b.number if b else None,
                        "searched_values": ", ".join(f"{k}={fmt_param(v)}" for k, v in sorted(b.searched.items()))
                        if b else ""})
    columns = [Column("variant", "variant"), *(Column(s, s, fmt="d") for s in ("complete", "pruned", "failed")),
               Column(data.metric, "best top-1 (%)", fmt=".2f", scale=100.0), Column("trial", "trial", fmt="d"),
               Column("searched_values", "searched values")]
    keys = ["variant", "complete", "pruned", "failed", data.metric, "trial", "searched_values"]
    caption = (f"Search study {data.name}: best trial per variant by {data.metric} "
               f"({METRIC_TEXT.get(data.metric, data.metric)}), its searched values, and trial counts (pruned "
               "trials stopped early by the pruner).")
    return Table("search_best", f"{data.name}: best trial per variant", caption, frame(records, keys), columns,
                 [(k, k, ".6f" if k == data.metric else "") for k in keys], status_notes(data))


def importance_table(study, data: StudyData) -> Table:
    """Parameter importances with PED-ANOVA (named in the caption): over all completed trials for the
    parameters every trial has, then per variant for its own (conditional) searched parameters."""
    import optuna
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

    evaluator_name = "PedAnovaImportanceEvaluator"
    numbers = {r.number for r in data.runs if r.state == "complete"}
    complete = [t for t in study.get_trials(deepcopy=False) if t.number in numbers and t.value is not None]
    scopes: list[tuple[str, list, list[str]]] = []
    common = sorted(set.intersection(*(set(t.params) for t in complete))) if complete else []
    scopes.append(("all variants", complete, common))
    for row in data.rows:
        label = data.row_variant[row]
        trials = [t for t in complete if t.params.get("variant") == label]
        names = sorted({k for t in trials for k in t.params if k.startswith(f"{label}.")})
        if names:
            scopes.append((row, trials, names))
    records, notes = [], []
    for scope, trials, names in scopes:
        names = [n for n in names if all(n in t.params for t in trials)]
        if not names:
            continue
        if len(trials) < MIN_IMPORTANCE_TRIALS:
            notes.append(f"{scope}: too few completed trials ({len(trials)} < {MIN_IMPORTANCE_TRIALS}) for "
                         f"importances of {', '.join(names)}.")
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sub = optuna.create_study(direction=study.direction)  # in memory: never touches the storage
                sub.add_trials(trials)
                result = get_param_importances(sub, evaluator=PedAnovaImportanceEvaluator(), params=names,
                                               normalize=True)
        except Exception as exc:  # noqa: BLE001 - importance is a best-effort summary
            notes.append(f"{scope}: importances not computed ({first_line(exc)}).")
            continue
        if len(names) == 1:
            notes.append(f"{scope}: one parameter ({names[0]}), so its normalised importance is 1 by definition.")
        for name in sorted(result, key=lambda n: (-round(float(result[n]), 12), n)):
            records.append({"scope": scope, "parameter": name, "trials": len(trials),
                            "importance": float(result[name])})
    if not records:
        records.append({"scope": "—", "parameter": "—", "trials": 0, "importance": None})
    columns = [Column("scope", "scope"), Column("parameter", "parameter"), Column("trials", "trials", fmt="d"),
               Column("importance", f"importance ({evaluator_name})", fmt=".4f")]
    keys = ["scope", "parameter", "trials", "importance"]
    caption = (f"Parameter importances of study {data.name} for {data.metric}, from optuna.importance."
               f"get_param_importances with evaluator {evaluator_name} (default settings, normalised to sum 1 "
               "per scope), over completed trials: 'all variants' for the parameters every trial has, then each "
               "variant over its own conditional search space.")
    return Table("importance", f"{data.name}: parameter importances", caption, frame(records, keys), columns,
                 [(k, k, ".6f" if k == "importance" else "") for k in keys], notes)
