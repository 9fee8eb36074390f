"""Where an absent premise was looked for beyond its own study: a claim line whose premise its study does not show
("post-LN struggles at depth 12") names the deeper depths at which another committed study with the same two rows
measured that premise, and what it found there (:func:`premise_elsewhere`), so that the ledger says at which
depths it looked and where, if anywhere, the premise appears.

The premise is measured in the other study exactly as in its own (:func:`.claims.premise_record`: the rate-aware
interval, each row at its own tuned rate): at every depth of that study deeper than the premise's, the variant at
that depth against the baseline at the same depth, or, for a premise across depths ("pre-LN at 16 below pre-LN at
4"), against the baseline at the premise's own baseline depth when that study ran it there."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..studies.claims import sides_at
from .claims import premise_numbers, premise_record, scale_text
from .resample import RESAMPLES


def premise_elsewhere(studies: Sequence[Any], resamples: int = RESAMPLES) -> dict[tuple, str]:
    """For each premise-absent line of ``studies`` (:class:`.ledger.StudyClaims`), keyed (folder, claim id, depth):
    what the other studies that ran both of its premise's rows deeper found, as text ("deep_premise (mnist5k, width
    32), depth 64, shown: Δ = ... pp [...], n = 10; ..."); lines no other study looked further for are left out."""
    from ..studies.rules import VerdictRules

    found = {}
    for sc in studies:
        premises = {c.id: c.premise for c in sc.spec.claims if c.premise is not None}
        for rec in sc.records:
            premise = premises.get(rec["id"])
            if rec["verdict"] != "premise absent" or premise is None:
                continue
            at = premise.depth if premise.depth is not None else rec["depth"]
            looks = [_look(other, premise, depth, getattr(other.spec, "verdicts", None) or VerdictRules(), resamples)
                     for other in studies if other.folder != sc.folder
                     for depth in sorted(d for d in other.data.depths if d is not None and at is not None and d > at)]
            looks = [text for text in looks if text]
            if looks:
                found[(sc.folder, rec["id"], rec["depth"])] = "; ".join(looks)
    return found


def _look(other, premise, depth: int, rules, resamples: int) -> str | None:
    """The premise measured in study ``other`` at ``depth`` (its baseline at the premise's baseline depth for a
    premise across depths), as text; None when that study lacks either side there."""
    premise = dataclasses.replace(premise, depth=depth)
    _, base_at = sides_at(premise, depth)
    data = other.data
    if not data.by_row_depth(premise.variant, depth) or not data.by_row_depth(premise.baseline, base_at):
        return None
    rec = premise_record(data, premise, depth, rules, resamples)
    where = f"depth {depth}" + (f" vs {base_at}" if base_at != depth else "")
    scale = scale_text(other.spec, None)  # the other study's dataset and width: its regime may not be this one's
    name = other.folder + (f" ({scale})" if scale != "—" else "")
    return premise_numbers(rec | {"premise": f"{name}, {where}, {'shown' if rec['premise_held'] else 'absent'}"})
