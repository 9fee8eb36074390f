"""How a study's claims are decided, declared before the runs (the ``verdicts:`` section of a study file or of the
protocol it extends; every key optional).

    verdicts:
      margin: 0.01          # the smallest accuracy difference worth having (1 pp): non-inferiority and equivalence
      ratio_margin: 1.25    # the same for a steps-to-target ratio: within [1/1.25, 1.25] the speeds are equivalent
      target_drop: 0.005    # steps-to-target: the target is the baseline's plateau (its last 5 epochs) minus this
      late_window: 5        # a row still rising: its last 3 epochs' mean val accuracy over the 3 epochs 5 before...
      late_rise: 0.005      # ...by more than this (0.5 pp) has not converged: it cannot carry an accuracy "not held"
      settled_share: 1.0    # a rate choice is settled when re-chosen in this share of tuning-seed resamples...
      settled_margin: 0.005 # ...and won by at least this much mean tuning value
      contend_share: 0.0    # an unsettled cell's contenders: every rate re-chosen in more than this share, and the
                            # runner-up when the margin is below settled_margin, up to max_rates in all
      max_rates: 3
      looks: 2              # group-sequential: the first look at the study's seeds, then up to looks x that many
      spending: pocock      # alpha spending over the looks: pocock (ln(1 + (e - 1) t)) or obrien_fleming

A claim may state its own ``margin`` where its paper states the effect it is about.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

SPENDING = ("pocock", "obrien_fleming")


@dataclass(frozen=True)
class VerdictRules:
    margin: float = 0.01
    ratio_margin: float = 1.25
    target_drop: float = 0.005
    late_window: int = 5
    late_rise: float = 0.005
    settled_share: float = 1.0  # a replicate at an untrained rate counts against its line (twice its share in p):
    settled_margin: float = 0.005  # a choice left uncontended must be one no resample re-chooses
    contend_share: float = 0.0
    max_rates: int = 3
    looks: int = 2
    spending: str = "pocock"

    def spent(self, t: float, alpha: float) -> float:
        """The alpha spent by information fraction ``t`` (0 < t ≤ 1): Pocock-type α·ln(1 + (e − 1)t) or
        O'Brien–Fleming-type 2 − 2Φ(z_{1−α/2} / √t) (Lan & DeMets 1983)."""
        from scipy.stats import norm

        t = min(max(t, 0.0), 1.0)
        if t == 0.0:
            return 0.0
        if self.spending == "pocock":
            return alpha * math.log(1.0 + (math.e - 1.0) * t)
        return float(2.0 - 2.0 * norm.cdf(norm.ppf(1.0 - alpha / 2.0) / math.sqrt(t)))

    def look_alpha(self, n: int, first: int, alpha: float) -> float:
        """The alpha a line may spend at its look: the looks are at ``first``, 2·first, … up to ``looks``·first
        paired seeds; a line with n seeds is at look k = ⌈n / first⌉ (at most ``looks``) and spends
        α(t_k) − α(t_{k−1}), t_k = k / looks. Bonferroni over the looks: the family-wise error stays at α however many
        looks a line takes."""
        if first <= 0 or self.looks <= 1:
            return alpha
        k = min(max(1, math.ceil(n / first)), self.looks)
        return self.spent(k / self.looks, alpha) - self.spent((k - 1) / self.looks, alpha)


def parse(raw: Any, where: str, base: VerdictRules | None = None) -> VerdictRules:
    """The ``verdicts:`` mapping over ``base`` (defaults); a one-line ValueError naming a bad key or value."""
    rules = base or VerdictRules()
    if raw is None:
        return rules
    fields = {f.name: f for f in dataclasses.fields(VerdictRules)}
    if not isinstance(raw, dict) or any(k not in fields for k in raw):
        bad = sorted(set(raw) - set(fields)) if isinstance(raw, dict) else raw
        raise ValueError(f"{where}: verdicts has unknown keys {bad}; valid keys: {', '.join(fields)}")
    values = {}
    for key, value in raw.items():
        kind = type(getattr(rules, key))
        if kind is str:
            if value not in SPENDING:
                raise ValueError(f"{where}: verdicts.{key} '{value}' is not valid; valid choices: {', '.join(SPENDING)}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 \
                or (kind is int and value != int(value)):
            raise ValueError(f"{where}: verdicts.{key} must be a positive {'integer' if kind is int else 'number'}, "
                             f"got {value!r}")
        values[key] = kind(value)
    rules = dataclasses.replace(rules, **values)
    if rules.ratio_margin <= 1 or not 0 < rules.settled_share <= 1 or not 0 <= rules.contend_share < 1:
        raise ValueError(f"{where}: verdicts needs ratio_margin > 1, settled_share in (0, 1] and contend_share in "
                         f"[0, 1), got {rules.ratio_margin}, {rules.settled_share}, {rules.contend_share}")
    return rules


def choice_shares(by_seed: dict[float, dict[int, float]], order: list[float], resamples: int = 20_000,
                  seed: int = 0) -> dict[float, float]:
    """How often each rate is the tuning stage's choice when its tuning seeds are drawn again with replacement: the
    highest mean over the drawn seeds, ties to the rate listed first in ``order`` (the rule's own tie-break). Every
    ordered draw is enumerated when there are at most ``resamples`` of them (3 seeds: 27), else ``resamples``
    random draws (fixed seed)."""
    import itertools

    import numpy as np

    seeds = sorted(set.intersection(*(set(by_seed[r]) for r in order))) if order else []
    if not seeds:
        return {}
    values = np.array([[by_seed[r][s] for s in seeds] for r in order])  # (rates, k)
    k = len(seeds)
    if k ** k <= resamples:
        draws = np.array(list(itertools.product(range(k), repeat=k)))
    else:
        draws = np.random.default_rng(seed).integers(0, k, size=(resamples, k))
    means = values[:, draws].mean(axis=2)  # (rates, draws)
    picks = np.argmax(means >= means.max(axis=0, keepdims=True) - 1e-12, axis=0)
    counts = np.bincount(picks, minlength=len(order))
    return {rate: float(c) / len(draws) for rate, c in zip(order, counts, strict=True) if c}


def contenders(by_seed: dict[float, dict[int, float]], order: list[float], chosen: float,
               rules: VerdictRules) -> list[float]:
    """The rates besides ``chosen`` whose reported seeds a rate-aware verdict needs: none when the choice is settled
    (re-chosen in at least ``settled_share`` of the tuning-seed resamples and won by at least ``settled_margin``);
    else every rate re-chosen in more than ``contend_share`` of them, and the runner-up when the margin is below
    ``settled_margin``, the most often re-chosen first, ``max_rates`` rates in all with the chosen one."""
    import statistics

    shares = choice_shares(by_seed, order)
    means = {r: statistics.fmean(by_seed[r].values()) for r in order if by_seed.get(r)}
    others = sorted((r for r in means if r != chosen), key=lambda r: -means[r])
    margin = means[chosen] - means[others[0]] if others and chosen in means else float("inf")
    if shares.get(chosen, 0.0) >= rules.settled_share and margin >= rules.settled_margin:
        return []
    picked = [r for r in sorted(shares, key=lambda r: (-shares[r], order.index(r)))
              if r != chosen and shares[r] > rules.contend_share]
    if others and margin < rules.settled_margin and others[0] not in picked:
        picked.append(others[0])
    return picked[:max(0, rules.max_rates - 1)]
