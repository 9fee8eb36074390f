"""From a family of claim lines' evidence (:mod:`.evidence`) to their verdicts.

**The deciding test** of a line is a t-test whose standard error is the rate-aware bootstrap's (tuning seeds with
each row's rate re-chosen, reported seeds, test images; :mod:`.resample`), with the n − 1 degrees of freedom of the
paired seeds — the bootstrap's own percentiles are over-confident at ten seeds — and a replicate whose re-chosen
rate was not trained on the reported seeds counted against the claim; for a stability claim the exact McNemar
test. The paired t-test over seeds at the chosen rates stays beside it as a column.

**Seeds in rounds (group-sequential).** A study's first look is at the seeds its file lists; undecided lines may
get more seeds in rounds up to ``verdicts.looks`` times as many. A line at look k spends α(t_k) − α(t_{k−1}) of α
(``verdicts.spending``, Pocock-type by default): its p enters the families as p · α / (that share), so that however
many looks a line takes, the family-wise error stays at α (Bonferroni over the looks).

**Two families, Holm–Bonferroni in each**: the lines' deciding p-values; and the equivalence p-values (TOST within
±δ) of the superiority and steps-to-target lines. A line is

* **held** — deciding Holm p < α, on the paper's side (for ``noninferior``: above B − δ);
* **not held** — deciding Holm p < α, on the other side;
* **not converged** — it would be "not held" on accuracy while the row behind was still rising (its last three
  epochs' mean validation accuracy above that of three epochs ``late_window`` earlier by more than ``late_rise``):
  it has not shown its final accuracy;
* **equivalent** — not decided by the deciding test, equivalence Holm p < α: any difference is smaller than δ;
* **not resolved** — neither.

Each line reports **agreement** — the share of the rate-aware replicates on its verdict's side (an uncovered
replicate never agrees) — and, when decided, its **break-even shift**: how far the baseline's mean could move
against the verdict before the line's own Holm level would no longer decide it (for equivalence, the distance of its
interval at that level from ±δ).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .evidence import Evidence
from .stats import ALPHA, holm

DECIDED = ("held", "not held", "equivalent")
VERDICTS = ("held", "not held", "equivalent", "not converged", "not resolved", "premise absent", "untestable")
MIN_TUNE_SEEDS = 3  # below this a rate choice's uncertainty is not measured: the line is on old evidence
ACCURACY_KINDS = ("superior", "noninferior")


@dataclass
class Judged:
    """A line's verdict in one family, with what the verdict rests on."""

    verdict: str
    detail: str
    p_holm: float | None = None
    p_eq_holm: float | None = None
    agreement: float | None = None
    break_even: float | None = None  # in the metric's units
    level: float | None = None  # the raw-p level the line had to beat in its family (Holm step x look's share)


def old_evidence(ev: Evidence) -> str | None:
    """Why a line rests on a rate choice whose uncertainty is not measured (a side tuned on fewer than
    :data:`MIN_TUNE_SEEDS` seeds), None when it does not."""
    if ev.kind == "stable":
        return None
    short = [n for n in ev.tune_seeds if 0 < n < MIN_TUNE_SEEDS]
    if not short:
        return None
    return (f"rate tuned on {min(short)} seed{'s' if min(short) != 1 else ''}: the choice's uncertainty is not in the "
            "interval (re-tune on at least 3)")


def family(evidence: Sequence[Evidence | None], looks: Sequence[float], alpha: float = ALPHA,
           accuracy: Sequence[bool] | None = None, rules=None, capped: Sequence[bool] | None = None) -> list[Judged]:
    """The verdicts of one family: ``evidence`` per line (None: not a test, left out), ``looks`` the alpha each
    line may spend at its look, ``accuracy`` whether its metric is an accuracy (the not-converged rule), ``capped``
    lines that may not be decided here (old evidence)."""
    n = len(evidence)
    accuracy = accuracy or [True] * n
    capped = capped or [False] * n
    tested = [i for i, ev in enumerate(evidence) if ev is not None and ev.p is not None]
    scaled = [min(1.0, evidence[i].p * alpha / looks[i]) for i in tested]
    p_holm = dict(zip(tested, holm(scaled), strict=True))
    levels = _levels(tested, scaled, looks, alpha)
    eq = [i for i in tested if evidence[i].p_eq is not None]
    p_eq = dict(zip(eq, holm([min(1.0, evidence[i].p_eq * alpha / looks[i]) for i in eq]), strict=True))
    eq_levels = _levels(eq, [evidence[i].p_eq * alpha / looks[i] for i in eq], looks, alpha)
    out = []
    for i, ev in enumerate(evidence):
        if i not in p_holm:
            out.append(Judged("not resolved", _undecided(ev)))
            continue
        judged = _verdict(ev, p_holm[i], p_eq.get(i), alpha, accuracy[i], rules)
        judged.level = eq_levels.get(i) if judged.verdict == "equivalent" else levels[i]
        judged.agreement = agreement(ev, judged.verdict)
        if judged.verdict in DECIDED:
            judged.break_even = break_even(ev, judged.verdict, judged.level)
        if capped[i] and judged.verdict in DECIDED:
            judged = Judged("not resolved", f"{judged.verdict} in its study, on old evidence: {old_evidence(ev)}",
                            judged.p_holm, judged.p_eq_holm, judged.agreement)
        out.append(judged)
    return out


def _levels(index: list[int], scaled: list[float], looks: Sequence[float], alpha: float) -> dict[int, float]:
    """The raw-p level each line had to beat: α/(m − k + 1) at its Holm step k, times its look's share of α."""
    m = len(index)
    order = sorted(range(m), key=lambda j: scaled[j])
    return {index[j]: alpha / (m - rank) * looks[index[j]] / alpha for rank, j in enumerate(order)}


def _verdict(ev: Evidence, p_holm: float, p_eq_holm: float | None, alpha: float, accuracy: bool, rules) -> Judged:
    if p_holm < alpha:
        oriented = ev.orientation * ev.estimate + ev.shift
        if oriented > 0:
            detail = "significant on the paper's side" if ev.kind != "noninferior" else \
                f"non-inferior: above the baseline minus {_margin_text(ev)}"
            behind = 1 if ev.estimate > 0 else 0
            rise = ev.late[behind] if accuracy and ev.kind in ACCURACY_KINDS else None
            if rise is not None and rules is not None and rise > rules.late_rise:
                detail += (f"; the row behind was still rising (+{100 * rise:.1f} pp over its last "
                           f"{rules.late_window} epochs)")
            return Judged("held", detail, p_holm, p_eq_holm)
        behind = 0 if ev.estimate < 0 else 1
        rise = ev.late[behind] if accuracy and ev.kind in ACCURACY_KINDS else None
        if rise is not None and rules is not None and rise > rules.late_rise:
            return Judged("not converged", f"significant on the other side, but {'the variant' if behind == 0 else 'the baseline'} "
                          f"was still rising (+{100 * rise:.1f} pp over its last {rules.late_window} epochs): its final "
                          "accuracy is not shown", p_holm, p_eq_holm)
        return Judged("not held", "significant on the other side" if ev.kind != "noninferior" else
                      f"inferior: below the baseline minus {_margin_text(ev)}", p_holm, p_eq_holm)
    if p_eq_holm is not None and p_eq_holm < alpha:
        return Judged("equivalent", f"any difference is within ±{_margin_text(ev)}", p_holm, p_eq_holm)
    return Judged("not resolved", _undecided(ev), p_holm, p_eq_holm)


def _margin_text(ev: Evidence) -> str:
    if ev.kind == "faster":
        return f"{np.exp(ev.margin):.2f}x"
    return f"{100 * ev.margin:.1f} pp"


def _undecided(ev: Evidence | None) -> str:
    if ev is None or ev.estimate is None:
        return "no pairs"
    if ev.all_equal:
        return "all paired differences equal: no interval, no test"
    if ev.p is None:
        return f"{ev.n} pair{'s' if ev.n != 1 else ''}: no test"
    if ev.coverage is not None and ev.coverage < 0.95:
        return (f"neither decided nor equivalent; {100 * (1 - ev.coverage):.0f}% of the re-chosen rates were not "
                "trained on the reported seeds: their contending runs are not in yet")
    return "neither decided nor equivalent within the margin"


def agreement(ev: Evidence, verdict: str) -> float | None:
    """Share of the replicates on the verdict's side (uncovered replicates never agree); for a stability line the
    share of discordant pairs on its side."""
    if ev.oriented is None:
        if ev.counts is None or not (ev.counts[0] + ev.counts[1]):
            return None
        up, down = ev.counts[:2]
        return (up if (ev.orientation * ev.estimate) > 0 else down) / (up + down)
    d = ev.oriented
    if verdict == "held":
        return float(np.mean(np.nan_to_num(d, nan=-np.inf) > 0))
    if verdict in ("not held", "not converged"):
        return float(np.mean(np.nan_to_num(d, nan=np.inf) < 0))
    if verdict == "equivalent":
        raw = ev.orientation * (d - ev.shift)
        return float(np.mean(np.abs(np.nan_to_num(raw, nan=np.inf)) < ev.margin))
    return ev.along()


def break_even(ev: Evidence, verdict: str, level: float | None) -> float | None:
    """How far the baseline could move against the verdict before the line would fail its level (metric units):
    |oriented Δ| − t_{1 − level/2, n−1}·SE (equivalence: the distance of its 1 − 2·level interval from ±δ)."""
    if ev.se is None or level is None or ev.estimate is None:
        return None
    oriented = ev.orientation * ev.estimate + ev.shift
    if verdict == "held":
        return oriented - ev.critical(level / 2) * ev.se
    if verdict == "not held":
        return -oriented - ev.critical(level / 2) * ev.se
    half = ev.critical(level) * ev.se
    return min(ev.margin - (ev.estimate + half), (ev.estimate - half) + ev.margin)
