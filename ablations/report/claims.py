"""Verdicts for the papers' claims a study file lists (``claims:`` in the YAML, :class:`ablations.studies.spec.Claim`),
computed from the report-phase runs and written to ``claims.md`` / ``claims.csv``; never written by hand.

Each testable claim is a paired comparison of its variant with its baseline over seeds (at its depth, or one line
per depth; per value of any extra grid axis), on its metric (default: the study's), with the statistics of
:mod:`.stats` (diverged runs at chance level). The claims of one study are one Holm family (m = the comparisons with
a defined test). The verdict of a line:

* **held**: Holm-adjusted paired t-test p < α and Δ in the paper's direction;
* **not held**: Holm-adjusted p < α and Δ in the other direction;
* **not resolved**: not significant after Holm (or no test: fewer than 2 pairs, all paired differences equal); the
  MDE says how large an effect could have hidden;
* **untestable**: the study file says the measure cannot test the claim (``testable: false``), with its reason;
* **premise absent**: the claim presupposes something the same study measures (``premise:``, e.g. "standard's
  accuracy falls with depth") and the study does not show it (:func:`premise_holds`); the line gives the premise's
  own numbers, and it is not a test of the claim (it leaves the Holm family).

The Markdown is one line per verdict, deterministic text that a README quotes verbatim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from .format import Column, Table, frame, latex_escape, p_text
from .load import StudyData
from .stats import ALPHA, POWER, Cell, adjust, compare, make_cell
from .tables import CI_LABEL, all_equal, boot_text, ci_text, equal_text, signed

VERDICTS = ("held", "not held", "not resolved", "premise absent", "untestable")
CLAIM_KEYS = ["id", "claim", "source", "counts", "variant", "baseline", "depth", "baseline_depth", "metric", "direction",
              "n_pairs", "delta", "sd", "ci_low", "ci_high", "boot_low", "boot_high", "p_t", "p_t_holm", "m", "mde",
              "n_diverged_pairs", "premise", "premise_delta", "premise_ci_low", "premise_ci_high", "premise_n",
              "verdict", "detail"]


def with_metric(runs: Sequence, metric: str, data: StudyData) -> list:
    """``runs`` with ``acc`` set to ``metric`` (from each run's summary) when it is not the report's accuracy."""
    if metric == data.metric:
        return list(runs)
    return [dataclasses.replace(r, acc=_number(r.summary.get(metric))) for r in runs]


def claim_records(data: StudyData, claims: Sequence, alpha: float = ALPHA,
                  power: float = POWER) -> tuple[list[dict], list[Cell]]:
    """(one record per claim line, with its verdict — a testable claim gives one line per row of its variant ×
    depth —, the compared cells: the Holm family). A line whose premise the study does not show leaves the family."""
    lines: list[tuple[Any, Cell | None, dict]] = []
    for claim in claims:
        if not claim.testable:
            lines.append((claim, None, {}))
            continue
        metric = claim.metric or data.metric
        rows = [r for r in data.rows if data.row_variant.get(r) == claim.variant] or [claim.variant]
        for row in rows:
            base_row = data.baseline_row(row, claim.baseline)
            ran = [d for d in data.depths if data.by_row_depth(row, d)]  # a row may run at one depth only
            for depth in [claim.depth] if claim.depth is not None else (ran or data.depths or [None]):
                base_depth = depth if claim.baseline_depth is None else claim.baseline_depth
                own, ref = comparison_cells(data, row, depth, base_row or claim.baseline, base_depth, metric,
                                            has_baseline=base_row is not None)
                where = {"variant": row, "baseline": ref.row, "depth": depth, "metric": metric,
                         "baseline_depth": claim.baseline_depth}
                if claim.premise is not None:
                    where |= premise_record(data, claim.premise, depth)
                lines.append((claim, own, where))
    cells = [cell for _, cell, where in lines if cell is not None and where.get("premise_held", True)]
    m = adjust(cells, alpha, power)
    return [_record(claim, cell, where, m, alpha) for claim, cell, where in lines], cells


def comparison_cells(data: StudyData, row: str, depth, base_row: str, base_depth, metric: str,
                     has_baseline: bool = True) -> tuple[Cell, Cell]:
    """The two cells of a paired comparison on ``metric`` (``own`` carries the comparison with ``ref``)."""
    own = make_cell(row, depth, with_metric(data.by_row_depth(row, depth), metric, data))
    ref = make_cell(base_row, base_depth,
                    with_metric(data.by_row_depth(base_row, base_depth), metric, data) if has_baseline else [])
    own.pair_seeds, own.comparison, own.n_diverged_pairs = compare(own, ref)
    return own, ref


def premise_holds(direction: str, cmp) -> bool:
    """Whether a premise's paired comparison shows what it asserts (:data:`ablations.studies.spec.PREMISE_DIRECTIONS`):
    ``lower``/``higher``: the 95% t-interval lies below/above 0 (all differences equal: their sign); ``not_higher``
    / ``not_lower``: it does not lie above/below 0. Without 2 pairs nothing is shown: False."""
    if cmp is None or cmp.n < 2 or cmp.delta is None:
        return False
    if cmp.all_equal:
        below, above = cmp.delta < 0, cmp.delta > 0
    else:
        below, above = cmp.ci_high < 0, cmp.ci_low > 0
    return {"lower": below, "higher": above, "not_higher": not above, "not_lower": not below}[direction]


def premise_record(data: StudyData, premise, depth) -> dict:
    """The premise's comparison (at its own depth, else the claim line's) as record fields and ``premise_held``."""
    at = premise.depth if premise.depth is not None else depth
    base_at = premise.baseline_depth if premise.baseline_depth is not None else at
    base_row = data.baseline_row(premise.variant, premise.baseline) or premise.baseline
    own, _ = comparison_cells(data, premise.variant, at, base_row, base_at, premise.metric or data.metric)
    cmp = own.comparison
    where = f" (depth {at}{'' if base_at == at else f' vs {base_at}'})" if at is not None else ""
    return {"premise": f"{premise.claim}: {premise.variant} vs {premise.baseline}{where}, {premise.direction}",
            "premise_delta": cmp.delta, "premise_ci_low": cmp.ci_low, "premise_ci_high": cmp.ci_high,
            "premise_n": cmp.n, "premise_held": premise_holds(premise.direction, cmp)}


def _record(claim, cell: Cell | None, where: Mapping[str, Any], m: int, alpha: float) -> dict:
    rec: dict[str, Any] = {k: None for k in CLAIM_KEYS} | {
        "id": claim.id, "claim": claim.claim, "source": claim.source, "counts": claim.counts or None}
    if cell is None:
        return rec | {"verdict": "untestable", "detail": claim.reason}
    cmp = cell.comparison
    rec |= {k: v for k, v in where.items() if k != "premise_held"} | {
        "direction": claim.direction, "n_pairs": cmp.n, "delta": cmp.delta, "sd": cmp.sd, "ci_low": cmp.ci_low,
        "ci_high": cmp.ci_high, "boot_low": cmp.boot_low, "boot_high": cmp.boot_high, "p_t": cmp.p_t,
        "p_t_holm": cell.p_t_holm, "m": m, "mde": cell.mde, "n_diverged_pairs": cell.n_diverged_pairs}
    if not where.get("premise_held", True):
        return rec | {"p_t_holm": None, "m": None, "mde": None, "verdict": "premise absent",
                      "detail": f"premise not shown here: {premise_numbers(rec)}"}
    if cell.p_t_holm is not None and cell.p_t_holm < alpha:
        along = cmp.delta > 0 if claim.direction == "higher" else cmp.delta < 0
        return rec | {"verdict": "held" if along else "not held",
                      "detail": "significant in the paper's direction" if along else "significant in the other direction"}
    if cmp.n < 2:
        detail = f"{cmp.n} pair{'s' if cmp.n != 1 else ''}: no test"
    elif cmp.all_equal:
        detail = "all paired differences equal: no interval, no test"
    elif cmp.ci_low <= 0 <= cmp.ci_high:
        detail = "the CI includes 0"
    else:
        detail = "the unadjusted CI excludes 0, but not significant after Holm"
    return rec | {"verdict": "not resolved", "detail": detail}


def premise_numbers(rec: Mapping[str, Any]) -> str:
    """``<premise>: Δ = x pp [CI], n = k`` of a claim line's premise."""
    if rec["premise_delta"] is None:
        return f"{rec['premise']}: no pairs"
    ci = (f" [{signed(rec['premise_ci_low'], 'md')}, {signed(rec['premise_ci_high'], 'md')}]"
          if rec["premise_ci_low"] is not None else "")
    return f"{rec['premise']}: Δ = {signed(rec['premise_delta'], 'md')} pp{ci}, n = {rec['premise_n']}"


def line_text(rec: Mapping[str, Any]) -> str:
    """The claim's one Markdown line (quoted verbatim by the README)."""
    head = f"- **{rec['id']}**: {rec['claim']} ({rec['source']})."
    if rec["verdict"] == "untestable":
        return f"{head} **untestable**: {rec['detail']}"
    if rec["verdict"] == "premise absent":
        depth = f", depth {rec['depth']}" if rec["depth"] is not None else ""
        numbers = "no pairs" if rec["delta"] is None else f"Δ = {signed(rec['delta'], 'md')} pp"
        return (f"{head} {rec['variant']} vs {rec['baseline']}{depth}, {rec['metric']}: {numbers}, n = "
                f"{rec['n_pairs']}: **premise absent** ({rec['detail']}).")
    depth = f", depth {rec['depth']}" if rec["depth"] is not None else ""
    if rec.get("baseline_depth") is not None and rec["baseline_depth"] != rec["depth"]:
        depth += f" vs depth {rec['baseline_depth']}"
    comparison = f"{rec['variant']} vs {rec['baseline']}{depth}, {rec['metric']} (paper: {rec['direction']})"
    if rec["delta"] is None:
        numbers = "no pairs"
    elif all_equal(rec):
        numbers = equal_text(rec, "md")
    else:
        ci = f" {ci_text(rec, 'md')} ({CI_LABEL})" if rec["ci_low"] is not None else ""
        if rec.get("boot_low") is not None:
            ci += f", {boot_text(rec, 'md')} (two-level: seeds x test images)"
        numbers = f"Δ = {signed(rec['delta'], 'md')} pp{ci}"
    numbers += f", n = {rec['n_pairs']} pair{'s' if rec['n_pairs'] != 1 else ''}"
    if rec["n_diverged_pairs"]:
        numbers += f" ({rec['n_diverged_pairs']} with a diverged run at chance level)"
    p = p_text(rec["p_t_holm"])
    numbers += f", Holm p {'< ' + p[1:] if p.startswith('<') else '= ' + p} (m = {rec['m']})"
    numbers += f", MDE {'—' if rec['mde'] is None else format(100 * rec['mde'], '.2f') + ' pp'}"
    counts = f" Counts as held: {rec['counts']}." if rec["counts"] else ""
    return f"{head}{counts} {comparison}: {numbers}: **{rec['verdict']}** ({rec['detail']})."


class ClaimsTable(Table):
    """The claims as a Table (CSV and LaTeX from the frame) whose Markdown is one line per verdict."""

    def markdown(self) -> str:
        lines = [line_text(rec) for rec in self.frame.to_dict("records")]
        parts = [f"### {self.title}", "", *(lines or ["(no claims)"]), "", self.caption]
        return "\n".join(parts + [f"\nNote: {n}" for n in self.notes]) + "\n"


def delta_ci(rec: Mapping[str, Any], style: str) -> str:
    """``Δ [CI]`` of a claim line; the no-interval text when its differences are all equal; ``—`` without pairs."""
    if rec["delta"] is None:
        return "—" if style == "md" else "---"
    if all_equal(rec):
        return equal_text(rec, style)
    return f"{signed(rec['delta'], style)} {ci_text(rec, style)}"


def claims_table(data: StudyData, claims: Sequence, alpha: float = ALPHA, power: float = POWER) -> ClaimsTable:
    from .tables import method_text

    records, cells = claim_records(data, claims, alpha, power)
    against = ("the claim's baseline (same seeds; at the control's depth where the claim names one, else the same "
               "depth)" if any(c.baseline_depth for c in claims) else "the claim's baseline (same depth, same seeds)")
    counts = {v: sum(1 for r in records if r["verdict"] == v) for v in VERDICTS}
    caption = (f"Claims of study {data.name}: verdicts computed by ablations.report.claims from the report-phase "
               f"runs, never written by hand ({', '.join(f'{n} {v}' for v, n in counts.items())}). held = "
               f"Holm-adjusted paired t-test p < {alpha} with Δ in the paper's direction; not held = significant in "
               f"the other direction; not resolved = not significant after Holm (an effect up to the MDE could hide); "
               f"premise absent = the study does not show what the claim presupposes (its 95% t-interval does not "
               f"lie on the premise's side of 0), so the line is no test of the claim and leaves the Holm family; "
               f"untestable = the study file says the measure cannot test the claim. "
               + (method_text(cells, against, "of the claims", wilcoxon=False) if cells else "No testable claim."))

    def verdict(rec, style):
        return rec["verdict"] if style == "md" else latex_escape(rec["verdict"])

    columns = [Column("id", "claim"), Column("variant", "variant"), Column("baseline", "baseline"),
               Column("depth", "depth", fmt="d"),
               Column("delta", f"Δ (pp) [{CI_LABEL}]", render=delta_ci),
               Column("p_t_holm", "p (t, Holm)", render=lambda rec, style: latex_escape(p_text(rec["p_t_holm"]))),
               Column("mde", "MDE (pp)", fmt=".2f", scale=100.0), Column("verdict", "verdict", render=verdict,
                                                                        align="l")]
    fmts = {"delta": ".6f", "sd": ".6f", "ci_low": ".6f", "ci_high": ".6f", "p_t": ".6g", "p_t_holm": ".6g",
            "mde": ".6f"}
    return ClaimsTable("claims", f"{data.name}: the papers' claims", caption, frame(records, CLAIM_KEYS), columns,
                       [(k, k, fmts.get(k, "")) for k in CLAIM_KEYS])


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def misquoted(text: str, claims_files: Mapping[str, str]) -> list[str]:
    """The lines of ``text`` (e.g. the README) that quote a claim — start with ``- **<id>**:`` for an id of one of
    ``claims_files`` (path -> claims.md text) — without being a verbatim line of that file."""
    lines: dict[str, set[str]] = {}
    for content in claims_files.values():
        for line in content.splitlines():
            if line.startswith("- **"):
                lines.setdefault(line.split("**")[1], set()).add(line)
    return [line for line in text.splitlines()
            if line.startswith("- **") and line.split("**")[1] in lines and line not in lines[line.split("**")[1]]]
