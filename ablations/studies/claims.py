"""A study's claims: the papers' claims it tests (``claims:`` in a study file) and what each presupposes (``premise:``),
parsed and checked. The verdicts are the report's (:mod:`ablations.report.claims`); nothing here decides one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config.tree import check_keys

_CLAIM_KEYS = ("id", "claim", "source", "variant", "baseline", "depth", "baseline_depth", "direction", "counts",
               "metric", "testable", "reason", "premise", "kind", "margin")
CLAIM_DIRECTIONS = ("higher", "lower")
#: what a claim asserts (:mod:`ablations.report.verdicts`): ``superior`` — better on its metric; ``noninferior`` —
#: at least as good, within the margin ("matches", "at least as well"); ``faster`` — reaches the baseline's plateau
#: in fewer epochs; ``stable`` — a larger share of its (seed, rate) runs train
CLAIM_KINDS = ("superior", "noninferior", "faster", "stable")
_PREMISE_KEYS = ("claim", "variant", "baseline", "depth", "baseline_depth", "direction", "metric")
#: what a premise asserts of its paired comparison (variant − baseline): ``lower`` / ``higher``: the 95% interval
#: lies below / above 0; ``not_higher`` / ``not_lower``: it is not significantly above / below 0 (e.g. "saturates")
PREMISE_DIRECTIONS = ("lower", "higher", "not_higher", "not_lower")
#: Metrics a claim may compare (fractions, so a diverged run counts at chance level): the accuracies and the AUC.
CLAIM_METRICS = ("best_val_acc", "final_val_acc", "test_acc", "test_acc_at_best_val", "val_acc_auc")


@dataclass(frozen=True)
class Claim:
    """A paper's claim the study tests: ``variant`` vs ``baseline`` (at ``depth``, or every depth the variant ran at
    when None; the baseline at ``baseline_depth`` when it is a control of another depth, e.g. a deeper plain ViT of
    the same parameter count, else at the variant's) in ``direction`` on ``metric`` (None: the study's metric); or,
    with ``testable`` False, a claim the study's measure cannot test, with the ``reason``. The verdict is computed
    by the report, never written here."""

    id: str
    claim: str
    source: str
    variant: str | None = None
    baseline: str | None = None
    depth: int | None = None
    baseline_depth: int | None = None
    direction: str = "higher"
    counts: str = ""
    metric: str | None = None
    testable: bool = True
    reason: str = ""
    premise: Premise | None = None
    kind: str = "superior"  # CLAIM_KINDS
    margin: float | None = None  # the claim's own smallest effect worth having (None: the study's verdicts.margin)


@dataclass(frozen=True)
class Premise:
    """What a claim presupposes, measured in the same study as a paired comparison (``variant`` − ``baseline`` at
    ``depth`` / ``baseline_depth`` on ``metric``), e.g. "standard's accuracy falls from depth 4 to 16" =
    ``{variant: standard, depth: 16, baseline: standard, baseline_depth: 4, direction: lower}``. When the study does
    not show it (:data:`PREMISE_DIRECTIONS`), the claim's verdict is "premise absent", with the premise's numbers."""

    claim: str
    variant: str
    baseline: str
    depth: int | None = None
    baseline_depth: int | None = None
    direction: str = "lower"
    metric: str | None = None



def parse_claims(raw: Any, labels: list[str], where: str) -> tuple[Claim, ...]:
    """The ``claims:`` list: each a mapping of :data:`_CLAIM_KEYS`; ids unique; a testable claim names two variant
    labels and a direction, an untestable one (``testable: false``) its reason."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError(f"{where}: 'claims' must be a list of mappings with keys: {', '.join(_CLAIM_KEYS)}")
    claims = [_claim(item, index, labels, where) for index, item in enumerate(raw)]
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{where}: claim ids must be unique, got {', '.join(ids)}")
    return tuple(claims)


def _claim(raw: Any, index: int, labels: list[str], where: str) -> Claim:
    at = f"{where} claims[{index}]"
    check_keys(raw, _CLAIM_KEYS, at)
    for key in ("id", "claim", "source"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ValueError(f"{at}: '{key}' must be a non-empty string")
    at = f"{where} claim '{raw['id']}'"
    testable = raw.get("testable", True)
    if not isinstance(testable, bool):
        raise ValueError(f"{at}: 'testable' must be true or false, got '{testable}'")
    if not testable:
        if not isinstance(raw.get("reason"), str) or not raw["reason"].strip():
            raise ValueError(f"{at}: an untestable claim ('testable: false') needs a 'reason'")
        return Claim(id=raw["id"], claim=raw["claim"], source=raw["source"], testable=False, reason=raw["reason"])
    for key in ("variant", "baseline"):
        if raw.get(key) not in labels:
            raise ValueError(f"{at}: {key} '{raw.get(key)}' is not a variant label of the study; valid labels: "
                             f"{', '.join(labels)}")
    if raw["variant"] == raw["baseline"] and (raw.get("depth") is None
                                              or raw.get("baseline_depth") in (None, raw.get("depth"))):
        raise ValueError(f"{at}: variant and baseline are both '{raw['variant']}': a row against itself needs a "
                         f"'depth' and another 'baseline_depth'")
    if raw.get("direction") not in CLAIM_DIRECTIONS:
        raise ValueError(f"{at}: direction '{raw.get('direction')}' is not valid; valid choices: "
                         f"{', '.join(CLAIM_DIRECTIONS)}")
    depth, baseline_depth = raw.get("depth"), raw.get("baseline_depth")
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise ValueError(f"{at}: depth must be a positive integer (or left out: every depth), got '{depth}'")
    if baseline_depth is not None and (isinstance(baseline_depth, bool) or not isinstance(baseline_depth, int)
                                       or baseline_depth < 1):
        raise ValueError(f"{at}: baseline_depth must be a positive integer (or left out: the variant's depth), "
                         f"got '{baseline_depth}'")
    metric = raw.get("metric")
    if metric is not None and metric not in CLAIM_METRICS:
        raise ValueError(f"{at}: metric '{metric}' is not valid; valid choices: {', '.join(CLAIM_METRICS)}")
    if "reason" in raw:
        raise ValueError(f"{at}: 'reason' is for untestable claims ('testable: false') only")
    kind, margin = raw.get("kind", "superior"), raw.get("margin")
    if kind not in CLAIM_KINDS:
        raise ValueError(f"{at}: kind '{kind}' is not valid; valid choices: {', '.join(CLAIM_KINDS)}")
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float)) or margin <= 0):
        raise ValueError(f"{at}: margin must be a positive number (an accuracy fraction, or a ratio above 1 for kind "
                         f"faster), got {margin!r}")
    return Claim(id=raw["id"], claim=raw["claim"], source=raw["source"], variant=raw["variant"],
                 baseline=raw["baseline"], depth=depth, baseline_depth=baseline_depth, direction=raw["direction"],
                 counts=str(raw.get("counts", "")), metric=metric, premise=_premise(raw.get("premise"), labels, at),
                 kind=kind, margin=None if margin is None else float(margin))


def _premise(raw: Any, labels: list[str], at: str) -> Premise | None:
    """A claim's ``premise:`` (:class:`Premise`) checked: one-line ValueErrors, or None when it has none."""
    if raw is None:
        return None
    at = f"{at} premise"
    check_keys(raw, _PREMISE_KEYS, at)
    if not isinstance(raw.get("claim"), str) or not raw["claim"].strip():
        raise ValueError(f"{at}: 'claim' must say what the premise is, in words")
    for key in ("variant", "baseline"):
        if raw.get(key) not in labels:
            raise ValueError(f"{at}: {key} '{raw.get(key)}' is not a variant label of the study; valid labels: "
                             f"{', '.join(labels)}")
    for key in ("depth", "baseline_depth"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{at}: {key} must be a positive integer, got '{value}'")
    if raw["variant"] == raw["baseline"] and raw.get("baseline_depth") in (None, raw.get("depth")):
        raise ValueError(f"{at}: variant and baseline are both '{raw['variant']}' at the same depth")
    direction = raw.get("direction", "lower")
    if direction not in PREMISE_DIRECTIONS:
        raise ValueError(f"{at}: direction '{direction}' is not valid; valid choices: {', '.join(PREMISE_DIRECTIONS)}")
    metric = raw.get("metric")
    if metric is not None and metric not in CLAIM_METRICS:
        raise ValueError(f"{at}: metric '{metric}' is not valid; valid choices: {', '.join(CLAIM_METRICS)}")
    return Premise(claim=raw["claim"], variant=raw["variant"], baseline=raw["baseline"], depth=raw.get("depth"),
                   baseline_depth=raw.get("baseline_depth"), direction=direction, metric=metric)


def compared_cells(claims: tuple[Claim, ...], depths: list[int]) -> frozenset[tuple[str, int | None]] | None:
    """The (variant label, depth) cells the claim lines and their premises compare — the cells whose learning-rate
    choice can move a verdict: a claim without a depth at every depth of ``depths`` (the grid's; none: depth
    None), its baseline at ``baseline_depth`` where given, a premise at its own depths, else the line's. None when
    the study makes no testable claim (then every cell counts)."""
    testable = [c for c in claims if c.testable]
    if not testable:
        return None
    cells = set()
    for claim in testable:
        for depth in [claim.depth] if claim.depth is not None else (depths or [None]):
            cells |= _pair(claim, depth)
            if claim.premise is not None:
                cells |= _pair(claim.premise, depth)
    return frozenset((label, depth if depths else None) for label, depth in cells)


def sides_at(comparison: Claim | Premise, depth: int | None) -> tuple[int | None, int | None]:
    """(the variant's depth, the baseline's depth) of a claim line or premise compared at ``depth``: its own
    ``depth`` where it names one, the baseline at its ``baseline_depth`` where given, else at the variant's."""
    at = comparison.depth if comparison.depth is not None else depth
    return at, comparison.baseline_depth if comparison.baseline_depth is not None else at


def _pair(comparison: Claim | Premise, depth: int | None) -> set[tuple[str, int | None]]:
    at, base = sides_at(comparison, depth)
    return {(comparison.variant, at), (comparison.baseline, base)}
