"""The claims ledger: every paper claim every study tested, from the studies' committed ``runs.csv`` files alone
(``python -m ablations.report --ledger`` writes ``<results-dir>/claims.md`` and ``claims.csv``).

Each study's claims are judged as its own report judges them (:mod:`.claims`: one Holm family per study). The
ledger adds what no single study can say:

* **One family over all claims.** Every judged claim line of every study (not untestable, premise not absent) enters
  one Holm–Bonferroni family; its verdict under that family is held / not held when the family-wise adjusted p is
  below α in the paper's / the other direction, else not resolved. A claim that holds in its study but not here held
  only because its study was a small family.
* **Shared runs are not replications.** Studies reuse identical runs (the same residual and options, learning rate,
  depth, seed and parameter count, with the same results): a claim line whose two sides are runs another line
  already compared says "the same runs as <study> (<claim>)", enters the all-claims family once (with the first
  line's adjusted p), and does not count as a second study.
* **Comparisons across studies.** Lines comparing the same rows (variant vs baseline labels, which name the same
  forms across the study files, on the same metric and in the same direction) are grouped, so a claim tested by
  several studies shows each; the group counts how many of them trained the variant's runs themselves
  (replications), and a line whose baseline (or variant) runs are another study's says so.
* **The protocol each study ran under**: its number of tuning seeds (from the runs themselves).

A study's folder is ``<results-dir>/<study>`` (its default budget) or ``<results-dir>/<study>-<budget>`` (another
setting, e.g. the GPU budget). The output is deterministic: regenerating it from the same files gives the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .claims import ACCURACY_METRICS, claim_records, numbers_text, premise_numbers, sureness_text
from .decide import DECIDED, VERDICTS, family
from .format import p_text
from .load import Run, StudyData
from .premises import premise_elsewhere
from .stats import ALPHA

LEDGER_KEYS = ["group", "study", "setting", "tuning_seeds", "id", "claim", "source", "kind", "variant", "baseline",
               "depth", "scale", "metric", "direction", "margin", "n_pairs", "delta", "ci_low", "ci_high", "trained", "levels",
               "coverage", "p", "p_eq", "look_alpha", "p_t", "p_holm", "m", "agreement", "verdict", "p_all_holm", "m_all",
               "agreement_all",
               "break_even_all", "verdict_all", "old_evidence", "same_runs_as", "shared_side", "premise",
               "premise_delta", "premise_ci_low", "premise_ci_high", "premise_n", "premise_elsewhere", "detail",
               "detail_all"]


@dataclass
class StudyClaims:
    """One study's claim lines, as its report computes them, with what the ledger needs beside them."""

    folder: str  # results/<folder>/runs.csv
    study: str
    budget: str
    data: StudyData
    records: list[dict]
    tuning_seeds: int
    spec: Any = None  # the study file it was judged under (its claims' premises)


def study_folders(results_dir: Path) -> list[tuple[str, str, str]]:
    """(folder, study, budget) of every ``<results-dir>/<folder>/runs.csv`` whose folder names a registered study
    (``<study>`` or ``<study>-<budget>``), sorted by folder name."""
    from ..studies.spec import BUDGETS, available_studies

    studies = available_studies()
    found = []
    for path in sorted(Path(results_dir).glob("*/runs.csv")):
        folder = path.parent.name
        if folder in studies:
            found.append((folder, folder, "default"))
            continue
        study, _, budget = folder.rpartition("-")
        if study in studies and budget in BUDGETS:
            found.append((folder, study, budget))
    return found


def load_study_claims(results_dir: Path) -> list[StudyClaims]:
    """Every study folder's claim lines (:func:`study_folders`), judged from its runs.csv under its study file."""
    from ..studies.spec import load_spec
    from .runs import read

    out = []
    for folder, study, budget in study_folders(results_dir):
        spec = load_spec(study, budget)
        data = read(Path(results_dir) / folder / "runs.csv", spec, folder)
        records, _ = claim_records(data, spec.claims, spec=spec)
        seeds = {r.seed for r in data.tune_runs if r.seed is not None}
        out.append(StudyClaims(folder, study, budget, data, records, len(seeds), spec))
    return out


def fingerprint(run: Run) -> tuple:
    """What makes two stored runs the same run: configuration, seed and result."""
    config = run.config or {}
    return (config.get("residual"), json.dumps(config.get("residual_options") or {}, sort_keys=True), run.lr,
            run.depth, run.seed, run.summary.get("param_count"), run.summary.get("epochs_completed"),
            None if run.acc is None else round(float(run.acc), 9), run.diverged)


def _side(data: StudyData, row: str | None, depth) -> frozenset:
    return frozenset(fingerprint(r) for r in data.by_row_depth(row, depth)) if row else frozenset()


def ledger_records(studies: Sequence[StudyClaims], alpha: float = ALPHA) -> list[dict]:
    """One record per claim line of every study, with its verdict in its study and under the all-claims family,
    its group (the same variant and baseline labels, metric and direction), the earlier line whose runs it reuses on
    both sides (``same_runs_as``: a repeat, in the family once) or on one side (``shared_side``)."""
    lines, first_line, first_side = [], {}, {}
    elsewhere = premise_elsewhere(studies)
    for sc in studies:
        for rec in sc.records:
            out = _ledger_line(sc, rec, first_line, first_side)
            out["premise_elsewhere"] = elsewhere.get((sc.folder, rec["id"], rec.get("depth")))
            lines.append((out, None if rec["verdict"] == "untestable" else rec))
    _all_claims(lines, alpha)
    order = {g: i for i, g in enumerate(dict.fromkeys(out["group"] for out, _ in lines))}
    return [out for out, _ in sorted(lines, key=lambda item: order[item[0]["group"]])]


def _ledger_line(sc: StudyClaims, rec: dict, first_line: dict, first_side: dict) -> dict:
    """A study's claim line as a ledger record: its group, and the earlier line whose runs it reuses (both sides:
    ``same_runs_as``; one side: ``shared_side``); ``first_line`` and ``first_side`` remember the lines seen so far."""
    out = {k: rec.get(k) for k in LEDGER_KEYS if k in rec} | {
        "study": sc.study, "setting": sc.budget if sc.budget != "default" else "", "tuning_seeds": sc.tuning_seeds,
        "same_runs_as": None, "shared_side": None, "p_all_holm": None, "m_all": None,
        "verdict_all": rec["verdict"] if rec["verdict"] in ("untestable", "premise absent") else None}
    if rec["verdict"] == "untestable":
        return out | {"group": f"untestable: {rec['id']}"}
    out["group"] = f"{rec['variant']} vs {rec['baseline']}, {_measure(rec)}, {rec['direction']}"
    here = f"{sc.folder} ({rec['id']})"
    sides = (("variant", _side(sc.data, rec["variant"], rec["depth"])),
             ("baseline", _side(sc.data, rec["baseline"], rec["baseline_depth"] or rec["depth"])))
    key = (sides[0][1], sides[1][1], rec["metric"], rec["kind"])
    if all(side for _, side in sides) and key in first_line:
        out["same_runs_as"] = first_line[key]
    else:
        first_line.setdefault(key, here)
        shared = [f"{name}: the same runs as {first_side[side][1]}" for name, side in sides
                  if side and first_side.get(side, (sc.folder,))[0] != sc.folder]
        out["shared_side"] = "; ".join(shared) or None
    for _, side in sides:
        if side:
            first_side.setdefault(side, (sc.folder, here))
    return out


def _all_claims(lines: list[tuple[dict, dict | None]], alpha: float) -> None:
    """Every judged line of every study in one family (repeats once, with their first line's numbers; lines on old
    evidence in it but never decided there): the all-claims fields of each record."""
    members = [(out, rec) for out, rec in lines
               if rec is not None and out["verdict_all"] is None and out["same_runs_as"] is None
               and rec.get("_evidence") is not None and rec["_evidence"].p is not None]
    judged = family([rec["_evidence"] for _, rec in members], [rec["look_alpha"] or alpha for _, rec in members], alpha,
                    [rec["metric"] in ACCURACY_METRICS for _, rec in members], rules=None,
                    capped=[bool(rec["old_evidence"]) for _, rec in members])
    keys = ("p_all_holm", "m_all", "agreement_all", "break_even_all", "verdict_all", "detail_all")
    by_line = {}
    for (out, _), j in zip(members, judged, strict=True):
        out |= dict(zip(keys, (j.p_holm, len(members), j.agreement, j.break_even, _keep_not_converged(out, j.verdict),
                               j.detail), strict=True))
        by_line[f"{out['study']}{'-' + out['setting'] if out['setting'] else ''} ({out['id']})"] = out
    for out, rec in lines:
        if rec is None or out["verdict_all"] is not None:
            continue
        first = by_line.get(out["same_runs_as"]) if out["same_runs_as"] is not None else None
        if first is not None:
            out |= {k: first[k] for k in keys}
        else:
            out["verdict_all"], out["m_all"] = "not resolved", len(members)


def _measure(rec: dict) -> str:
    """What a line measures, for its group: the metric, or the kind of claim where that is not an accuracy."""
    return {"faster": "steps to plateau", "stable": "runs that train"}.get(rec["kind"], rec["metric"])


def _keep_not_converged(out: dict, verdict: str) -> str:
    """The all-claims verdict, "not converged" where the study's own judgement found the row behind still rising."""
    return "not converged" if verdict == "not held" and out.get("verdict") == "not converged" else verdict


def _numbers(rec: dict) -> str:
    if rec["verdict"] == "untestable":
        return "—"
    if rec["delta"] is None:
        return "no pairs"
    return numbers_text(rec).replace("|", "/") + f" (n = {rec['n_pairs']})"


def decided_line(rec: dict) -> str:
    """One line of a claim decided under the all-claims family (quoted verbatim by the README): the claim, the
    comparison with its metric and scale, the estimate and interval, the Holm p, and how sure."""
    where = rec["study"] + (f" ({rec['setting']})" if rec["setting"] else "")
    sure = sureness_text(rec, "agreement_all", "break_even_all")
    return (f"- **{rec['id']}** ({where}; {rec['scale']}): {rec['claim']} — {rec['variant']} vs {rec['baseline']}, "
            f"{_measure(rec)}: {_numbers(rec)}, Holm p over all claims {p_text(rec['p_all_holm'])}"
            f"{'; ' + sure if sure else ''}: **{rec['verdict_all']}**.")


def ledger_markdown(records: list[dict], studies: Sequence[StudyClaims], alpha: float = ALPHA) -> str:
    """The ledger as Markdown: a summary of both families' verdicts, then one section per group of lines."""
    lines = _summary(records, studies, alpha)
    decided = [r for r in records if r["verdict_all"] in DECIDED and not r["same_runs_as"]]
    lines += ["", f"Decided with every claim in one family ({len(decided)} lines; the README quotes them):", ""]
    lines += [decided_line(r) for r in decided] or ["(none)"]
    groups: dict[str, list[dict]] = {}
    for rec in records:
        groups.setdefault(rec["group"], []).append(rec)
    for group, recs in groups.items():
        own = {r["study"] for r in recs if not r["same_runs_as"] and r["verdict"] != "untestable"
               and not (r["shared_side"] or "").startswith("variant:")}
        lines += ["", f"### {group}", ""]
        if len(own) > 1:
            lines += [f"Tested on their own runs by {len(own)} studies: {', '.join(sorted(own))}.", ""]
        lines += ["| study | claim | scale | estimate [rate-aware 95%] | in its study (Holm p) | all claims (Holm p, "
                  "agreement) | note |", "|---|---|---|---|---|---|---|"]
        lines += [_group_row(r) for r in recs]
    return "\n".join(lines) + "\n"


def _summary(records: list[dict], studies: Sequence[StudyClaims], alpha: float) -> list[str]:
    """The ledger's head: what it is, both families' verdict counts, the studies and their tuning seeds."""
    counts = {name: {v: sum(1 for r in records if r[key] == v) for v in VERDICTS}
              for name, key in (("in its study", "verdict"), ("all claims", "verdict_all"))}
    m_all = next((r["m_all"] for r in records if r["m_all"]), 0)
    shared = sum(1 for r in records if r["same_runs_as"])
    decided_all = sum(1 for r in records if r["verdict_all"] in DECIDED)
    old = sum(1 for r in records if r["old_evidence"])
    lines = ["# Claims ledger", "",
             "Every paper claim the studies test, regenerated by `python -m ablations.report --ledger --results-dir "
             "results` from each study's committed `runs.csv` (never written by hand). Two families: **in its "
             "study** is the verdict of the study's own claims.md (its lines in one Holm family); **all claims** "
             "puts every judged line of "
             f"every study into one Holm–Bonferroni family (m = {m_all}, α = {alpha}). Each line is judged on its "
             "own metric by the rate-aware bootstrap (tuning seeds with each row's rate re-chosen, reported seeds, "
             "test images; docs/protocol.md, \"Verdicts\"), with the equivalence test deciding \"equivalent\" where "
             f"a difference is within the declared margin. A line on the same runs as an earlier one ({shared} "
             f"here) is a repeat, not a replication: it enters the family once. {old} lines rest on old evidence "
             "(a rate tuned on fewer than three seeds): their own study states a verdict, the all-claims family "
             f"decides none of them. Decided with all claims in one family: {decided_all} of {len(records)} lines.",
             "", "| verdicts | " + " | ".join(VERDICTS) + " |", "|---|" + "---|" * len(VERDICTS)]
    lines += [f"| {name} | " + " | ".join(str(c[v]) for v in VERDICTS) + " |" for name, c in counts.items()]
    lines += ["", "| study | setting | tuning seeds | claim lines |", "|---|---|---:|---:|"]
    return lines + [f"| {sc.study} | {sc.budget} | {sc.tuning_seeds} | {len(sc.records)} |" for sc in studies]


def _group_row(r: dict) -> str:
    """A line's row in its group's table, with the note that says what it rests on."""
    study = r["study"] + (f" ({r['setting']})" if r["setting"] else "")
    note = f"the same runs as {r['same_runs_as']}: a repeat" if r["same_runs_as"] else (r["shared_side"] or "")
    if r["verdict"] == "premise absent":
        note = "premise: " + premise_numbers(r).replace("|", "/")
        if r.get("premise_elsewhere"):
            note += "; looked for deeper: " + r["premise_elsewhere"].replace("|", "/")
    elif r["verdict"] == "untestable":
        note = str(r["detail"]).replace("|", "/")
    elif r["old_evidence"]:
        note = ("old evidence: " + r["old_evidence"] + ("; " + note if note else "")).replace("|", "/")
    agree = f", {100 * r['agreement_all']:.1f}%" if r.get("agreement_all") is not None else ""
    return (f"| {study} | **{r['id']}**: {r['claim']} ({r['source']}) | {r.get('scale') or ''} | "
            f"{_numbers(r)} | {r['verdict']} ({p_text(r['p_holm'])}) | {r['verdict_all']} "
            f"({p_text(r['p_all_holm'])}{agree}) | {note} |")


def ledger_csv(records: list[dict]) -> str:
    import csv
    import io

    from .runs import text

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(LEDGER_KEYS)
    for rec in records:
        writer.writerow([text(rec.get(k)) for k in LEDGER_KEYS])
    return out.getvalue()


def write_ledger(results_dir: Path) -> tuple[list[Path], list[dict]]:
    """``<results-dir>/claims.md`` and ``claims.csv`` from every study folder's runs.csv, and the ledger's records;
    ReportError (one line) when there is no study folder."""
    from .load import ReportError

    results_dir = Path(results_dir)
    studies = load_study_claims(results_dir)
    if not studies:
        raise ReportError(f"no study results under '{results_dir}' (a <study>/runs.csv per study): nothing to ledger")
    records = ledger_records(studies)
    paths = [results_dir / "claims.md", results_dir / "claims.csv"]
    paths[0].write_text(ledger_markdown(records, studies), encoding="utf-8")
    paths[1].write_text(ledger_csv(records), encoding="utf-8")
    return paths, records


def summary(records: list[dict]) -> dict[str, Any]:
    """Counts per verdict under both families (for the CLI's printout)."""
    return {key: {v: sum(1 for r in records if r[key] == v) for v in VERDICTS} for key in ("verdict", "verdict_all")}
