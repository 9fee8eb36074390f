"""The depth premises of a study with several depths, as results of their own: how each row's accuracy moves from
its shallowest depth (a paired, rate-aware difference with its interval), and what share of its runs train at each
depth (over every (seed, rate) run of the tuning grid and the reported seeds, with a Clopper–Pearson interval).

From these the table's caption states, per row, the first depth at which the accuracy falls by more than the
study's margin (``verdicts.margin``: pre-LN "degrades") and the first depth at which at least half of the runs fail
to train (post-LN "fails"), or the deepest depth at which it still did not. The figure ``depth_premises`` draws both
against depth: one line per row, a band of ± one sd over the reported seeds, and the share that trains.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from .claims import comparison_evidence
from .evidence import trained
from .format import Column, Table, frame
from .load import StudyData
from .resample import RESAMPLES
from .tables import signed

DEPTH_KEYS = ["variant", "depth", "n", "mean", "sd", "delta", "ci_low", "ci_high", "runs", "trained", "share_trained",
              "share_low", "share_high"]
FAIL_SHARE = 0.5  # a row "fails to train" at a depth where at least this share of its runs do


def depth_records(data: StudyData, rules, resamples: int = RESAMPLES) -> list[dict]:
    """One record per row × depth: accuracy mean and sd over the reported runs that trained, the paired rate-aware
    difference from the row's shallowest depth, and the runs that train over every phase."""
    from scipy.stats import binomtest

    records = []
    for row in data.rows:
        depths = [d for d in data.depths if data.by_row_depth(row, d)]
        if not depths:
            continue
        shallow = depths[0]
        for depth in depths:
            ok = [float(r.acc) for r in data.by_row_depth(row, depth) if r.ok]
            rec = {"variant": row, "depth": depth, "n": len(ok), "mean": statistics.fmean(ok) if ok else None,
                   "sd": statistics.stdev(ok) if len(ok) >= 2 else None, "delta": None, "ci_low": None,
                   "ci_high": None}
            if depth != shallow:
                ev = comparison_evidence(data, row, depth, row, shallow, data.metric, rules, resamples=resamples)
                rec |= {"delta": ev.estimate, "ci_low": ev.low, "ci_high": ev.high}
            outcomes = [t for run in [*data.tune_runs, *data.runs, *data.contend_runs]
                        if run.row == row and run.depth == depth and (t := trained(run)) is not None]
            k, n = sum(outcomes), len(outcomes)
            rec |= {"runs": n, "trained": k, "share_trained": k / n if n else None, "share_low": None,
                    "share_high": None}
            if n:
                ci = binomtest(k, n).proportion_ci(0.95, method="exact")
                rec |= {"share_low": ci.low, "share_high": ci.high}
            records.append(rec)
    return records


def _delta(rec: dict) -> str:
    """``Δ = −x.xx pp [lo, hi]`` of a depth record (the interval where it has one)."""
    ci = f" [{signed(rec['ci_low'], 'md')}, {signed(rec['ci_high'], 'md')}]" if rec["ci_low"] is not None else ""
    return f"Δ = {signed(rec['delta'], 'md')} pp{ci}"


def premise_sentences(records: list[dict], margin: float) -> list[str]:
    """Per row: where its accuracy first falls by more than ``margin`` from its shallowest depth (interval wholly
    below −margin), and where at least :data:`FAIL_SHARE` of its runs first fail to train — or that neither is shown
    up to its deepest depth (with the difference measured there: a fall the interval cannot yet place beyond the
    margin is not stated as absent)."""
    out = []
    for row in dict.fromkeys(r["variant"] for r in records):
        rows = [r for r in records if r["variant"] == row]
        deepest, shallow = rows[-1]["depth"], rows[0]["depth"]
        falls = next((r for r in rows if r["ci_high"] is not None and r["ci_high"] < -margin), None)
        fails = next((r for r in rows if r["share_trained"] is not None and 1 - r["share_trained"] >= FAIL_SHARE),
                     None)
        last = rows[-1]
        if falls:
            text = (f"{row}: accuracy falls by more than {100 * margin:.1f} pp from depth {shallow} first at depth "
                    f"{falls['depth']} ({_delta(falls)})")
        else:
            text = (f"{row}: accuracy is not shown to fall by more than {100 * margin:.1f} pp from depth {shallow} "
                    f"up to depth {deepest} (no interval wholly below −{100 * margin:.1f} pp"
                    + (f"; at depth {deepest}: {_delta(last)})" if last["delta"] is not None else ")"))
        text += (f"; at least {FAIL_SHARE:.0%} of its runs fail to train first at depth {fails['depth']} "
                 f"({fails['runs'] - fails['trained']} of {fails['runs']})" if fails else
                 f"; fewer than {FAIL_SHARE:.0%} of its runs fail to train up to depth {deepest}")
        out.append(text.replace("-", "−").replace("+−", "−") + ".")
    return out


def depth_table(data: StudyData, rules, resamples: int = RESAMPLES) -> Table | None:
    """The ``depth`` table of a study with at least two depths (None otherwise)."""
    if len(data.depths) < 2:
        return None
    records = depth_records(data, rules, resamples)

    def delta(rec, style):
        if rec["delta"] is None:
            return "—" if style == "md" else "---"
        text = f"{100 * rec['delta']:+.2f}" + (f" [{100 * rec['ci_low']:+.2f}, {100 * rec['ci_high']:+.2f}]"
                                               if rec["ci_low"] is not None else " (no interval)")
        return text.replace("-", "−") if style == "md" else text

    def share(rec, style):
        if rec["share_trained"] is None:
            return "—" if style == "md" else "---"
        dash = "–" if style == "md" else "--"  # ASCII LaTeX (the table escapes the %)
        return f"{rec['trained']}/{rec['runs']} [{100 * rec['share_low']:.0f}{dash}{100 * rec['share_high']:.0f}%]"

    columns = [Column("variant", "variant"), Column("depth", "depth", fmt="d"), Column("n", "n", fmt="d"),
               Column("mean", "accuracy (%)", fmt=".2f", scale=100.0), Column("sd", "sd (pp)", fmt=".2f", scale=100.0),
               Column("delta", "Δ from its shallowest depth (pp) [rate-aware 95%]", render=delta),
               Column("trained", "runs that train [95% CI]", render=share)]
    fmts = {k: ".6g" for k in ("mean", "sd", "delta", "ci_low", "ci_high", "share_trained", "share_low", "share_high")}
    caption = (f"Depth premises of study {data.name} ({data.metric}): per row and depth, the mean and sd over the "
               "reported runs that trained; Δ = the paired difference from the row's shallowest depth (same seeds), "
               "its interval rate-aware (tuning seeds with the rate re-chosen, seeds, test images: docs/protocol.md, "
               "Verdicts); runs that train = (seed, rate) runs of every phase above the floor with a finite loss, "
               "with a Clopper–Pearson interval. " + " ".join(premise_sentences(records, rules.margin)))
    return Table("depth", f"{data.name}: accuracy and training against depth", caption, frame(records, DEPTH_KEYS),
                 columns, [(k, k, fmts.get(k, "")) for k in DEPTH_KEYS])


def depth_figure(records: list[dict], rows: list[str], name: str, out: Path) -> list[Path]:
    """``depth_premises``: accuracy against depth (log-2 axis), one line per row with a ± sd band over the reported
    seeds (left), and the share of its (seed, rate) runs that train with its interval (right)."""
    from .figures import apply_style, close, colors, new_figure, place_legends, save

    apply_style()
    palette = colors(rows)
    fig = new_figure(9.0, 3.6, legend=rows)
    left, right = fig.subplots(1, 2)
    for row in rows:
        mine = [r for r in records if r["variant"] == row]
        acc = [r for r in mine if r["mean"] is not None]
        if acc:
            x = [r["depth"] for r in acc]
            y = [100 * r["mean"] for r in acc]
            sd = [100 * (r["sd"] or 0.0) for r in acc]
            left.plot(x, y, marker="o", ms=3, lw=1.2, color=palette[row], label=row)
            left.fill_between(x, [a - b for a, b in zip(y, sd, strict=True)], [a + b for a, b in zip(y, sd, strict=True)],
                              color=palette[row], alpha=0.15, lw=0)
        shares = [r for r in mine if r["share_trained"] is not None]
        if shares:
            x = [r["depth"] for r in shares]
            y = [100 * r["share_trained"] for r in shares]
            err = [[a - 100 * r["share_low"] for a, r in zip(y, shares, strict=True)],
                   [100 * r["share_high"] - a for a, r in zip(y, shares, strict=True)]]
            right.errorbar(x, y, yerr=err, marker="o", ms=3, lw=1.2, capsize=2, color=palette[row])
    for ax, label in ((left, "test accuracy (%), mean ± sd over seeds"), (right, "runs that train (%), 95% CI")):
        ax.set_xscale("log", base=2)
        depths = sorted({r["depth"] for r in records})
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.set_xlabel("depth (blocks)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    right.set_ylim(-5, 105)
    fig.suptitle(f"{name}: accuracy and training against depth", fontsize=9)
    place_legends(fig, [left], rows, fontsize="small")
    paths = save(fig, out, "depth_premises")
    close(fig)
    return paths
