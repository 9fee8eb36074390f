"""Verdicts for the papers' claims a study file lists (``claims:`` in the YAML, :class:`ablations.studies.spec.Claim`),
computed from the study's runs and written to ``claims.md`` / ``claims.csv``; never written by hand.

Each testable claim gives one line per row of its variant × depth (per value of any extra grid axis): a paired
comparison of the variant with its baseline on the claim's own metric (:mod:`.evidence`: accuracy, steps to the
baseline's plateau, or the share of runs that train), measured by the rate-aware bootstrap (:mod:`.resample`:
tuning seeds with each row's rate re-chosen, reported seeds, test images) and decided in the study's families
(:mod:`.decide`: Holm over the deciding tests, and over the equivalence tests, with the group-sequential share of
α of each line's look). The verdicts: held, not held, equivalent (within the declared margin), not converged, not
resolved; and

* **untestable**: the study file says the measure cannot test the claim (``testable: false``), with its reason;
* **premise absent**: the claim presupposes something the same study measures (``premise:``, e.g. "standard's
  accuracy falls with depth") and the study does not show it (its rate-aware 95% interval is not on the premise's
  side, :func:`premise_holds`); the line gives the premise's own numbers and leaves the families.

A line whose rows' rates were tuned on fewer than three seeds rests on **old evidence**: its rate choice's
uncertainty is not in its interval; it says so, and the all-claims family of the ledger does not decide it.

The Markdown is one line per verdict, deterministic text that a README quotes verbatim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..studies.claims import sides_at
from .decide import VERDICTS, family, old_evidence
from .evidence import Evidence, measure
from .format import Column, Table, frame, latex_escape, p_text
from .load import StudyData
from .resample import RESAMPLES, shares_text
from .stats import ALPHA
from .tables import signed

CLAIM_KEYS = ["id", "claim", "source", "counts", "kind", "variant", "baseline", "depth", "baseline_depth", "metric",
              "direction", "margin", "scale", "n_pairs", "delta", "ci_low", "ci_high", "levels", "coverage",
              "rates", "p", "p_holm", "p_eq", "p_eq_holm", "p_t", "m", "look_alpha", "agreement", "break_even",
              "n_chance_pairs", "all_equal", "late_variant", "late_baseline", "trained", "old_evidence", "premise",
              "premise_delta", "premise_ci_low", "premise_ci_high", "premise_n", "verdict", "detail"]
KIND_TEXT = {"superior": "better", "noninferior": "at least as good, within the margin",
             "faster": "fewer epochs to the baseline's plateau", "stable": "more (seed, rate) runs train"}


def with_metric(runs: Sequence, metric: str, data: StudyData) -> list:
    """``runs`` with ``acc`` set to ``metric`` (from each run's summary) when it is not the report's accuracy."""
    if metric == data.metric:
        return list(runs)
    return [dataclasses.replace(r, acc=_number(r.summary.get(metric))) for r in runs]


def scale_text(spec, depth) -> str:
    """The regime a line's numbers come from: dataset, width and depth (``mnist5k, width 64, depth 4``)."""
    parts = []
    if spec is not None and spec.kind == "grid":
        config = spec.run_config(spec.grid()[0])
        parts += [str(config.dataset), f"width {config.embed_dim}"]
    if depth is not None:
        parts.append(f"depth {depth}")
    return ", ".join(parts) or "—"


ACCURACY_METRICS = ("test_acc", "test_acc_at_best_val", "final_val_acc", "best_val_acc")


def claim_records(data: StudyData, claims: Sequence, alpha: float = ALPHA, spec=None,
                  resamples: int = RESAMPLES) -> tuple[list[dict], list[Evidence]]:
    """(one record per claim line with its verdict in the study's families, the evidence of the lines in them).
    ``spec`` gives the verdict rules (``verdicts:``) and the seeds of the first look; a record keeps its evidence
    under ``_evidence`` for the ledger."""
    from ..studies.rules import VerdictRules

    rules = getattr(spec, "verdicts", None) or VerdictRules()
    lines = [line for claim in claims for line in claim_lines(data, claim, rules, spec, resamples)]
    tested = [ev if ev is not None and where.get("premise_held", True) else None for _, ev, where in lines]
    first = first_look(data, spec)
    looks = [rules.look_alpha(ev.n, first, alpha) if ev is not None else alpha for ev in tested]
    accuracy = [where.get("metric") in ACCURACY_METRICS for _, _, where in lines]
    judged = family(tested, looks, alpha, accuracy, rules)
    m = sum(1 for ev in tested if ev is not None and ev.p is not None)
    records = [_record(claim, ev, where, j, m, look) for (claim, ev, where), j, look
               in zip(lines, judged, looks, strict=True)]
    return records, [ev for ev in tested if ev is not None]


def first_look(data: StudyData, spec) -> int:
    """The seeds of a study's first look: those its file lists, else the most a cell of ``data`` has."""
    listed = len((getattr(spec, "axes", None) or {}).get("seed", []))
    return listed or max((len({r.seed for r in data.by_row_depth(row, d)}) for row in data.rows
                          for d in data.depths or [None]), default=0)


def claim_lines(data: StudyData, claim, rules, spec, resamples: int) -> list[tuple[Any, Evidence | None, dict]]:
    """A claim's lines as (claim, evidence, where): one per row of its variant × depth (every depth the row ran
    at when the claim names none); an untestable claim is one line without evidence."""
    if not claim.testable:
        return [(claim, None, {})]
    metric = claim.metric or data.metric
    lines = []
    for row in [r for r in data.rows if data.row_variant.get(r) == claim.variant] or [claim.variant]:
        base_row = data.baseline_row(row, claim.baseline) or claim.baseline
        ran = [d for d in data.depths if data.by_row_depth(row, d)]  # a row may run at one depth only
        for depth in [claim.depth] if claim.depth is not None else (ran or data.depths or [None]):
            _, base_depth = sides_at(claim, depth)
            ev = measure(data, claim, row, depth, base_row, base_depth, metric, rules, resamples=resamples)
            where = {"variant": row, "baseline": base_row, "depth": depth, "metric": metric,
                     "baseline_depth": claim.baseline_depth, "scale": scale_text(spec, depth)}
            if claim.premise is not None:
                where |= premise_record(data, claim.premise, depth, rules, resamples)
            lines.append((claim, ev, where))
    return lines


def comparison_evidence(data: StudyData, variant: str, depth, baseline: str, base_depth, metric: str, rules,
                        direction: str = "higher", resamples: int = RESAMPLES) -> Evidence:
    """The rate-aware evidence of ``variant`` − ``baseline`` on ``metric`` (a superiority comparison)."""
    from ..studies.spec import Claim

    probe = Claim(id="premise", claim="", source="", variant=variant, baseline=baseline, direction=direction)
    return measure(data, probe, variant, depth, baseline, base_depth, metric, rules, resamples=resamples)


def premise_holds(direction: str, ev: Evidence | None) -> bool:
    """Whether a premise's comparison shows what it asserts (:data:`ablations.studies.spec.PREMISE_DIRECTIONS`):
    ``lower``/``higher``: its rate-aware 95% interval lies below/above 0; ``not_higher`` / ``not_lower``: it does
    not lie above/below 0. Without an interval nothing is shown: False."""
    if ev is None or ev.low is None or ev.n < 2:
        return False
    below, above = ev.high < 0, ev.low > 0
    return {"lower": below, "higher": above, "not_higher": not above, "not_lower": not below}[direction]


def premise_record(data: StudyData, premise, depth, rules, resamples: int = RESAMPLES) -> dict:
    """The premise's comparison (at its own depth, else the claim line's) as record fields and ``premise_held``."""
    at, base_at = sides_at(premise, depth)
    base_row = data.baseline_row(premise.variant, premise.baseline) or premise.baseline
    ev = comparison_evidence(data, premise.variant, at, base_row, base_at, premise.metric or data.metric, rules,
                             resamples=resamples)
    where = f" (depth {at}{'' if base_at == at else f' vs {base_at}'})" if at is not None else ""
    return {"premise": f"{premise.claim}: {premise.variant} vs {premise.baseline}{where}, {premise.direction}",
            "premise_delta": ev.estimate, "premise_ci_low": ev.low, "premise_ci_high": ev.high,
            "premise_n": ev.n, "premise_held": premise_holds(premise.direction, ev)}


def _record(claim, ev: Evidence | None, where: Mapping[str, Any], judged, m: int, look: float) -> dict:
    rec: dict[str, Any] = {k: None for k in CLAIM_KEYS} | {
        "id": claim.id, "claim": claim.claim, "source": claim.source, "counts": claim.counts or None,
        "kind": claim.kind, "_evidence": None}
    if ev is None:
        return rec | {"verdict": "untestable", "detail": claim.reason}
    rec |= {k: v for k, v in where.items() if k != "premise_held"} | evidence_fields(ev) | {
        "direction": claim.direction, "old_evidence": old_evidence(ev), "_evidence": ev}
    if not where.get("premise_held", True):
        return rec | {"verdict": "premise absent", "detail": f"premise not shown here: {premise_numbers(rec)}"}
    return rec | {"p_holm": judged.p_holm, "p_eq_holm": judged.p_eq_holm, "m": m, "look_alpha": look,
                  "agreement": judged.agreement, "break_even": judged.break_even, "verdict": judged.verdict,
                  "detail": judged.detail + (f"; old evidence: {rec['old_evidence']}" if rec["old_evidence"] else "")}


def evidence_fields(ev: Evidence) -> dict:
    """The record fields of a line's evidence (before any family)."""
    trained = None
    if ev.counts is not None:
        trained = f"{ev.counts[3]:.3f} vs {ev.counts[4]:.3f} of {ev.counts[2]} (seed, rate) runs"
    return {"margin": ev.margin if ev.kind != "faster" else float(np.exp(ev.margin)), "n_pairs": ev.n,
            "delta": ev.estimate, "ci_low": ev.low, "ci_high": ev.high, "levels": " x ".join(ev.levels) or None,
            "coverage": ev.coverage, "rates": "; ".join(f"{side}: {shares_text(s)}" for side, s in ev.rates.items()
                                                      if len(s) > 1) or None,
            "p": ev.p, "p_eq": ev.p_eq, "p_t": ev.p_t, "n_chance_pairs": ev.n_chance, "late_variant": ev.late[0],
            "late_baseline": ev.late[1], "trained": trained, "all_equal": ev.all_equal}


def premise_numbers(rec: Mapping[str, Any]) -> str:
    """``<premise>: Δ = x pp [CI], n = k`` of a claim line's premise."""
    if rec["premise_delta"] is None:
        return f"{rec['premise']}: no pairs"
    ci = (f" [{signed(rec['premise_ci_low'], 'md')}, {signed(rec['premise_ci_high'], 'md')}]"
          if rec["premise_ci_low"] is not None else "")
    return f"{rec['premise']}: Δ = {signed(rec['premise_delta'], 'md')} pp{ci}, n = {rec['premise_n']}"


def numbers_text(rec: Mapping[str, Any], style: str = "md") -> str:
    """A line's estimate with its rate-aware interval, in the metric's own terms: Δ in pp for an accuracy, the
    epochs ratio (baseline / variant) for steps to target, the shares of runs that train for stability."""
    if rec["delta"] is None:
        return "no pairs"
    if rec["kind"] == "stable":
        return f"trains in {rec['trained']}: Δ = {signed(rec['delta'], style)} pp"
    if rec["kind"] == "faster":
        ratio = f"{np.exp(rec['delta']):.2f}x"
        ci = f" [{np.exp(rec['ci_low']):.2f}x, {np.exp(rec['ci_high']):.2f}x]" if rec["ci_low"] is not None else ""
        return f"epochs to the baseline's plateau, baseline / variant = {ratio}{ci}"
    if rec.get("all_equal"):
        return f"all {rec['n_pairs']} differences equal: Δ = {signed(rec['delta'], style)} pp, no interval"
    ci = f" [{signed(rec['ci_low'], style)}, {signed(rec['ci_high'], style)}]" if rec["ci_low"] is not None else ""
    return f"Δ = {signed(rec['delta'], style)} pp{ci}"


def sureness_text(rec: Mapping[str, Any], agreement_key: str = "agreement", break_even_key: str = "break_even") -> str:
    """How sure a line is, in words: the replicates that agree with its verdict and its break-even shift."""
    parts = []
    if rec.get(agreement_key) is not None:
        parts.append(f"agrees in {100 * rec[agreement_key]:.1f}% of resamples")
    if rec.get(break_even_key) is not None:
        unit = "pp" if rec["kind"] != "faster" else "(log ratio)"
        value = 100 * rec[break_even_key] if rec["kind"] != "faster" else rec[break_even_key]
        parts.append(f"break-even shift {value:.2f} {unit}")
    return ", ".join(parts)


def line_text(rec: Mapping[str, Any]) -> str:
    """The claim's one Markdown line (quoted verbatim by the README): what is compared, on which metric, at which
    scale, the estimate and its rate-aware interval, the deciding test, how sure, and the verdict."""
    head = f"- **{rec['id']}**: {rec['claim']} ({rec['source']})."
    if rec["verdict"] == "untestable":
        return f"{head} **untestable**: {rec['detail']}"
    depth = f" vs depth {rec['baseline_depth']}" if rec.get("baseline_depth") not in (None, rec["depth"]) else ""
    what = f"{rec['variant']} vs {rec['baseline']} ({rec['scale']}{depth}), {_metric_text(rec)}"
    if rec["verdict"] == "premise absent":
        return f"{head} {what}: {numbers_text(rec)}, n = {rec['n_pairs']}: **premise absent** ({rec['detail']})."
    counts = f" Counts as held: {rec['counts']}." if rec["counts"] else ""
    numbers = f"{numbers_text(rec)}, n = {rec['n_pairs']}"
    if rec["levels"]:
        numbers += f" ({rec['levels']}"
        if rec["coverage"] is not None and rec["coverage"] < 1:
            numbers += f"; {100 * rec['coverage']:.0f}% of rate choices covered"
        numbers += ")"
    if rec["n_chance_pairs"]:
        k = rec["n_chance_pairs"]
        numbers += f", {k} pair{'s' if k != 1 else ''} with a run at chance level (diverged or failed to train)"
    test = "McNemar" if rec["kind"] == "stable" else "rate-aware"
    p = p_text(rec["p_holm"])
    numbers += f", {test} Holm p {'< ' + p[1:] if p.startswith('<') else '= ' + p} (m = {rec['m']})"
    if rec["p_t"] is not None:
        t = p_text(rec["p_t"])
        numbers += f", t-test p {'< ' + t[1:] if t.startswith('<') else '= ' + t}"
    sure = sureness_text(rec)
    return f"{head}{counts} {what}: {numbers}{'; ' + sure if sure else ''}: **{rec['verdict']}** ({rec['detail']})."


def _metric_text(rec: Mapping[str, Any]) -> str:
    kind = rec["kind"]
    if kind == "faster":
        return f"steps to target (paper: faster; equivalent within {rec['margin']:.2f}x)"
    if kind == "stable":
        return "share of (seed, rate) runs that train"
    margin = f", margin {100 * rec['margin']:.1f} pp" if rec.get("margin") is not None else ""
    return f"{rec['metric']} (paper: {rec['direction']}, {kind}{margin})"


class ClaimsTable(Table):
    """The claims as a Table (CSV and LaTeX from the frame) whose Markdown is one line per verdict."""

    def markdown(self) -> str:
        lines = [line_text(rec) for rec in self.frame.to_dict("records")]
        parts = [f"### {self.title}", "", *(lines or ["(no claims)"]), "", self.caption]
        return "\n".join(parts + [f"\nNote: {n}" for n in self.notes]) + "\n"


def delta_ci(rec: Mapping[str, Any], style: str) -> str:
    """A line's estimate and interval (:func:`numbers_text`), LaTeX-escaped for the .tex table."""
    text = numbers_text(rec, "md")
    return text if style == "md" else latex_escape(text)


def method_caption(rules, alpha: float, resamples: int) -> str:
    """What the verdicts mean and how they were computed (the claims table's caption)."""
    return (f"held / not held = the deciding test's Holm-adjusted p < {alpha} on the paper's / the other side; "
            f"equivalent = not decided, and the equivalence test (TOST within ±{100 * rules.margin:.1f} pp, or "
            f"{rules.ratio_margin:g}x for steps) Holm-adjusted p < {alpha}; not converged = it would be not held while "
            f"the row behind still rose more than {100 * rules.late_rise:.1f} pp over its last {rules.late_window} "
            "epochs; not resolved = neither. The deciding test is a t-test on n − 1 degrees of freedom (n paired "
            f"seeds) whose standard error comes from the rate-aware bootstrap ({resamples:,} replicates: the tuning "
            "seeds resampled and each row's rate re-chosen, then the reported seeds, then the test images where "
            "every run stored its per-image results), twice the share of replicates whose re-chosen rate was not "
            "trained on the reported seeds added to its p, and p scaled by the line's group-sequential share of α "
            f"({rules.spending} spending over {rules.looks} looks); stability claims: McNemar's exact test on the paired "
            "(seed, rate) runs of the whole rate grid. The interval is Δ ± t_{0.975, n−1} · SE; "
            "agreement = the share of replicates on the verdict's side; break-even = how far the baseline could move "
            "against the verdict before the line's Holm level would no longer decide it. The paired t-test over "
            "seeds at the chosen rates is a column, not the decision.")


def claims_table(data: StudyData, claims: Sequence, alpha: float = ALPHA, spec=None,
                 resamples: int = RESAMPLES) -> ClaimsTable:
    from ..studies.rules import VerdictRules

    rules = getattr(spec, "verdicts", None) or VerdictRules()
    records, _ = claim_records(data, claims, alpha, spec=spec, resamples=resamples)
    counts = {v: sum(1 for r in records if r["verdict"] == v) for v in VERDICTS}
    caption = (f"Claims of study {data.name}: verdicts computed by ablations.report.claims from the study's runs, "
               f"never written by hand ({', '.join(f'{n} {v}' for v, n in counts.items() if n)}). "
               + method_caption(rules, alpha, resamples)
               + " premise absent = the study does not show what the claim presupposes; untestable = the study file "
               "says the measure cannot test the claim.")

    def verdict(rec, style):
        return rec["verdict"] if style == "md" else latex_escape(rec["verdict"])

    columns = [Column("id", "claim"), Column("variant", "variant"), Column("baseline", "baseline"),
               Column("depth", "depth", fmt="d"), Column("delta", "estimate [rate-aware 95%]", render=delta_ci),
               Column("p_holm", "p (Holm)", render=lambda rec, style: latex_escape(p_text(rec["p_holm"]))),
               Column("agreement", "agreement (%)", fmt=".1f", scale=100.0),
               Column("verdict", "verdict", render=verdict, align="l")]
    fmts = {k: ".6g" for k in ("delta", "ci_low", "ci_high", "coverage", "p", "p_holm", "p_eq", "p_eq_holm", "p_t",
                               "look_alpha", "agreement", "break_even", "late_variant", "late_baseline", "margin",
                               "premise_delta", "premise_ci_low", "premise_ci_high")}
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
