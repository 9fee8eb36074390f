"""Protocol v3's verdicts: the rate-aware bootstrap (tuning seeds, reported seeds, test images), the deciding test
and its families, equivalence, steps to target, stability, the group-sequential share of alpha and the rule that
chooses contending rates — each against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ablations.report.decide import family
from ablations.report.evidence import Evidence, epochs_to, equivalence_t, steps_diff, two_sided_t
from ablations.report.resample import Side, accuracy_diff, number_diff, resample
from ablations.studies.rules import VerdictRules, choice_shares, contenders, parse

R = 4_000


def side(reported: dict, tune: dict | None = None, chosen: float = 1e-3) -> Side:
    tune = tune or {}
    return Side(tune=tune, order=sorted(tune) or [chosen], chosen=chosen, reported=reported)


def constant_seeds(values: dict[int, float], rate: float = 1e-3) -> dict:
    return {rate: dict(values)}


# --- the seed level -----------------------------------------------------------------------------------------------
def test_the_interval_widens_when_the_seeds_disagree():
    """Two comparisons with the same mean difference (+1 pp): one whose seeds agree (all +1 pp) has a point
    interval; one whose seeds disagree (−3 .. +5 pp) has a wide one, about ±t·sd/√n."""
    base = side(constant_seeds({s: 0.9 for s in range(8)}))
    agree = side(constant_seeds({s: 0.91 for s in range(8)}))
    spread = [-0.03, 0.05, -0.01, 0.03, 0.0, 0.02, -0.02, 0.04]  # mean +0.01 (hand-computed: 0.08 / 8)
    disagree = side(constant_seeds({s: 0.9 + d for s, d in enumerate(spread)}))
    tight = resample(agree, base, number_diff, resamples=R)
    wide = resample(disagree, base, number_diff, resamples=R)
    assert tight.estimate == pytest.approx(0.01) and wide.estimate == pytest.approx(0.01)
    assert np.ptp(tight.covered) == pytest.approx(0.0, abs=1e-12)
    low, high = np.quantile(wide.covered, [0.025, 0.975])
    sd = np.std(spread, ddof=1)
    assert high - low == pytest.approx(2 * 1.96 * sd / math.sqrt(8), rel=0.35)  # the bootstrap's normal width
    assert wide.levels == ("seeds",)


def test_the_image_level_widens_the_interval_of_runs_that_agree_on_their_accuracy():
    """Per-image results: every seed's A beats B by the same 10 of 200 images, so the seeds agree exactly and only
    the images carry doubt; the two-level interval is about ±1.96·sqrt(p(1−p)/n_images) around +5 pp."""
    images = 200
    b = np.zeros(images, dtype=bool)
    b[:150] = True
    a = b.copy()
    a[150:160] = True  # 10 more images right: +5 pp on every seed
    rep = resample(side({1e-3: {s: a for s in range(6)}}), side({1e-3: {s: b for s in range(6)}}), accuracy_diff,
                   resamples=R)
    assert rep.levels == ("seeds", "images") and rep.estimate == pytest.approx(0.05)
    low, high = np.quantile(rep.covered, [0.025, 0.975])
    half = 1.96 * math.sqrt(0.05 * 0.95 / images)  # the paired differences are 0/1 on 5% of the images
    assert (high - low) / 2 == pytest.approx(half, rel=0.2)


# --- the rate level -----------------------------------------------------------------------------------------------
def test_the_rate_aware_interval_widens_when_a_rows_two_best_rates_disagree():
    """Row A's two rates tie on the tuning seeds (each wins on some draws) and its reported seeds score +3 pp over B
    at one rate and −1 pp at the other: the rate-aware interval spans both, the rate-fixed one does not; the
    share of replicates re-choosing each rate matches the exact bootstrap of the three tuning seeds."""
    tune = {1e-3: {100: 0.90, 101: 0.92, 102: 0.91}, 2e-3: {100: 0.93, 101: 0.89, 102: 0.905}}
    b = side(constant_seeds({s: 0.9 for s in range(10)}), {1e-3: {100: .9, 101: .9, 102: .9}})
    jitter = {s: 0.001 * (s % 3) for s in range(10)}
    reported = {1e-3: {s: 0.93 + jitter[s] for s in range(10)}, 2e-3: {s: 0.89 + jitter[s] for s in range(10)}}
    a = side(reported, tune, chosen=1e-3)
    fixed = resample(side({1e-3: reported[1e-3]}, chosen=1e-3), b, number_diff, resamples=R)
    aware = resample(a, b, number_diff, resamples=R)
    assert aware.levels[0] == "rate" and aware.coverage == 1.0
    shares = choice_shares(tune, [1e-3, 2e-3])
    assert aware.rates["a"][2e-3] == pytest.approx(shares[2e-3], abs=0.03)
    assert 0.2 < shares[2e-3] < 0.8  # a real contest
    assert np.quantile(fixed.covered, 0.025) > 0.02
    assert np.quantile(aware.covered, 0.025) < 0 < np.quantile(aware.covered, 0.975)


def test_a_rechosen_rate_without_reported_runs_is_uncovered_and_counts_against_the_claim():
    """The same contest, but the reported seeds trained only at the chosen rate: the replicates that re-choose
    2e-3 cannot be evaluated (coverage = 1 − its share), and the two-sided p is at least twice that share."""
    tune = {1e-3: {100: 0.90, 101: 0.92, 102: 0.91}, 2e-3: {100: 0.93, 101: 0.89, 102: 0.905}}
    b = side(constant_seeds({s: 0.9 for s in range(10)}), {1e-3: {100: .9, 101: .9, 102: .9}})
    a = side({1e-3: {s: 0.95 for s in range(10)}}, tune, chosen=1e-3)
    rep = resample(a, b, number_diff, resamples=R)
    uncovered = 1 - rep.coverage
    assert uncovered == pytest.approx(choice_shares(tune, [1e-3, 2e-3])[2e-3], abs=0.03)
    assert np.all(rep.covered > 0.04)  # where it can be evaluated, A is +5 pp
    assert two_sided_t(0.05, 0.001, 10) < 1e-9  # +5 pp at SE 0.1 pp: certain where it can be evaluated...
    assert two_sided_t(0.05, 0.001, 10, uncovered) == pytest.approx(min(1.0, 2 * uncovered), abs=1e-9)  # ...but not


def test_choice_shares_enumerate_the_27_draws_of_three_tuning_seeds():
    """Hand count: rate X beats Y on seeds 0 and 1 by 1, loses on seed 2 by 3. A draw picks X when its mean
    difference is positive: draws with no seed 2 (8 of 27) — and none with a seed 2, since 1 + 1 − 3 < 0; ties
    (mean equal) go to the rate listed first."""
    by_seed = {1.0: {0: 1.0, 1: 1.0, 2: 0.0}, 2.0: {0: 0.0, 1: 0.0, 2: 3.0}}
    assert choice_shares(by_seed, [1.0, 2.0]) == pytest.approx({1.0: 8 / 27, 2.0: 19 / 27})
    tie = {1.0: {0: 1.0, 1: 1.0, 2: 1.0}, 2.0: {0: 1.0, 1: 1.0, 2: 1.0}}
    assert choice_shares(tie, [2.0, 1.0]) == {2.0: 1.0}


def test_contenders_are_the_rates_a_resampled_choice_picks_and_a_settled_choice_has_none():
    rules = VerdictRules()
    by_seed = {1.0: {0: 1.0, 1: 1.0, 2: 0.0}, 2.0: {0: 0.0, 1: 0.0, 2: 3.0}, 4.0: {0: 0.0, 1: 0.0, 2: 0.0}}
    assert contenders(by_seed, [1.0, 2.0, 4.0], 2.0, rules) == [1.0]
    settled = {1.0: {0: 0.9, 1: 0.9, 2: 0.9}, 2.0: {0: 0.95, 1: 0.95, 2: 0.95}}
    assert contenders(settled, [1.0, 2.0], 2.0, rules) == []
    close = {1.0: {0: 0.949, 1: 0.949, 2: 0.949}, 2.0: {0: 0.95, 1: 0.95, 2: 0.95}}  # always chosen, by 0.1 pp
    assert contenders(close, [1.0, 2.0], 2.0, rules) == [1.0]
    # won by 11.7 pp, yet overturned in 1 of the 27 draws (seed 0 thrice: 0.25 > 0.2): left uncontended, that draw
    # would add 2/27 = 0.074 to every line's p, so the rate trains on the reported seeds
    rare = {1.0: {0: 0.25, 1: 0.0, 2: 0.0}, 2.0: {0: 0.2, 1: 0.2, 2: 0.2}}
    assert choice_shares(rare, [2.0, 1.0]) == {2.0: 26 / 27, 1.0: 1 / 27}
    assert contenders(rare, [2.0, 1.0], 2.0, rules) == [1.0]


# --- the deciding test, equivalence, families ------------------------------------------------------------------------
def evidence(p: float, estimate: float, kind="superior", direction="higher", margin=0.01, p_eq=None,
             replicates=None, se=0.001, **kw) -> Evidence:
    """A line's evidence with its deciding p given (and its replicates, for agreement)."""
    ev = Evidence(kind=kind, direction=direction, margin=margin, n=10, estimate=estimate, p=p, p_eq=p_eq, se=se, **kw)
    deltas = np.asarray(replicates if replicates is not None else np.full(100, estimate), dtype=float)
    ev.oriented = (1 if direction == "higher" else -1) * deltas + (margin if kind == "noninferior" else 0.0)
    return ev


def test_the_deciding_t_uses_the_bootstrap_se_on_n_minus_one_degrees_of_freedom():
    """Δ = +1 pp, SE 0.4 pp, 10 seeds: t = 2.5 on 9 df, two-sided p = 0.0339 (scipy: 2·t.sf(2.5, 9)); 5% of
    replicates uncovered add 0.1."""
    from scipy.stats import t

    assert two_sided_t(0.01, 0.004, 10) == pytest.approx(2 * t.sf(2.5, 9))
    assert two_sided_t(0.01, 0.004, 10) == pytest.approx(0.0339, abs=1e-4)
    assert two_sided_t(-0.01, 0.004, 10, 0.05) == pytest.approx(2 * t.sf(2.5, 9) + 0.1)


def test_equivalence_within_the_margin_and_not_beyond_it():
    """TOST within ±1 pp: Δ = 0.1 pp with SE 0.2 pp on 9 df is equivalent (p = t.sf(4.5, 9) = 7e-4); Δ = 0.8 pp with
    the same SE is not (p = t.sf(1, 9) = 0.17); in the families, a decided line stays decided."""
    from scipy.stats import t

    assert equivalence_t(0.001, 0.01, 0.002, 10) == pytest.approx(t.sf(4.5, 9))
    assert equivalence_t(0.008, 0.01, 0.002, 10) == pytest.approx(t.sf(1.0, 9))
    inside = np.random.default_rng(0).uniform(-0.005, 0.005, 1000)
    judged = family([evidence(0.6, 0.001, p_eq=equivalence_t(0.001, 0.01, 0.002, 10), replicates=inside, se=0.002)],
                    [0.05])
    assert judged[0].verdict == "equivalent" and judged[0].agreement == 1.0
    # break-even: the 90% interval 0.1 ± 1.833·0.2 pp = [−0.267, +0.467] pp lies 0.533 pp inside +1 pp
    assert judged[0].break_even == pytest.approx(0.01 - (0.001 + t.ppf(0.95, 9) * 0.002))
    judged = family([evidence(0.001, 0.009, p_eq=0.3)], [0.05])
    assert judged[0].verdict == "held"  # significantly above 0: decided before equivalence is asked
    judged = family([evidence(0.4, 0.003, p_eq=0.2)], [0.05])
    assert judged[0].verdict == "not resolved"


def test_noninferiority_holds_above_the_baseline_minus_the_margin():
    judged = family([evidence(0.001, -0.004, kind="noninferior")], [0.05])  # −0.4 pp, significantly above −1 pp
    assert judged[0].verdict == "held" and "non-inferior" in judged[0].detail
    judged = family([evidence(0.001, -0.03, kind="noninferior")], [0.05])  # −3 pp: significantly below −1 pp
    assert judged[0].verdict == "not held" and "inferior" in judged[0].detail


def test_one_family_holds_every_line_and_holm_orders_them():
    """Three lines with p = 0.002, 0.02 and 0.3 in one family of m = 3: Holm multiplies them by 3, 2 and 1 (0.006,
    0.04, 0.3): the first two held, the third not resolved; alone, the second line's p stays 0.02."""
    lines = [evidence(0.002, 0.02), evidence(0.02, 0.02), evidence(0.3, 0.01)]
    judged = family(lines, [0.05] * 3)
    assert [j.verdict for j in judged] == ["held", "held", "not resolved"]
    assert [j.p_holm for j in judged] == pytest.approx([0.006, 0.04, 0.3])
    assert family([lines[1]], [0.05])[0].p_holm == pytest.approx(0.02)


def test_a_look_spends_its_share_of_alpha():
    """Pocock-type spending over 2 looks: α(1/2) = 0.05·ln(1 + (e − 1)/2) = 0.031006; the second look spends the rest;
    O'Brien–Fleming-type: 2 − 2Φ(1.95996/√0.5) = 0.005575. A line's p enters its family as p · α / its share."""
    rules = VerdictRules()
    assert rules.look_alpha(10, 10, 0.05) == pytest.approx(0.05 * math.log(1 + (math.e - 1) / 2), rel=1e-9)
    assert rules.look_alpha(10, 10, 0.05) == pytest.approx(0.031006, abs=1e-6)
    assert rules.look_alpha(20, 10, 0.05) == pytest.approx(0.05 - 0.031006, abs=1e-6)
    assert parse({"spending": "obrien_fleming"}, "x").look_alpha(10, 10, 0.05) == pytest.approx(0.005575, abs=1e-6)
    line = evidence(0.02, 0.02)
    pocock = family([line], [rules.look_alpha(10, 10, 0.05)])[0]  # 0.02 · 0.05 / 0.031006 = 0.0323
    assert pocock.verdict == "held" and pocock.p_holm == pytest.approx(0.02 * 0.05 / 0.031006, rel=1e-4)
    assert family([line], [0.005575])[0].verdict == "not resolved"  # O'Brien–Fleming's first look: 0.179


def test_a_bad_verdicts_section_is_one_line():
    with pytest.raises(ValueError, match=r"verdicts has unknown keys \['alpha'\]; valid keys: margin"):
        parse({"alpha": 0.1}, "study file 'x'")
    with pytest.raises(ValueError, match="verdicts.spending 'bonferroni' is not valid; valid choices: pocock"):
        parse({"spending": "bonferroni"}, "study file 'x'")
    with pytest.raises(ValueError, match="verdicts.looks must be a positive integer"):
        parse({"looks": 1.5}, "study file 'x'")


# --- steps to target ----------------------------------------------------------------------------------------------
def test_steps_to_target_hand_computed():
    """B's plateau: mean of its last 5 epochs (0.90 .. 0.94: 0.92), target 0.915; B first reaches it at epoch 7, A
    at epoch 3: log(7/3). A curve that never reaches it counts one epoch past its last (censored, not dropped)."""
    b = {e: v for e, v in enumerate([0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.92, 0.90, 0.91, 0.92, 0.93, 0.94], start=1)}
    a = {e: v for e, v in enumerate([0.8, 0.9, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95, 0.95], start=1)}
    assert epochs_to(b, 0.915) == 7 and epochs_to(a, 0.915) == 3
    assert steps_diff(0.005)(a, b) == pytest.approx(math.log(7 / 3))
    never = {e: 0.5 for e in range(1, 13)}
    assert steps_diff(0.005)(never, b) == pytest.approx(math.log(7 / 13))


def test_the_not_converged_rule_takes_a_not_held_from_a_row_still_rising():
    """A line significantly against its claim whose variant rose 3 pp over its last 5 epochs reads "not converged";
    the same line with a flat variant reads "not held"."""
    rules = VerdictRules()
    rising = evidence(0.001, -0.05, late=(0.03, 0.0))
    flat = evidence(0.001, -0.05, late=(0.001, 0.0))
    assert family([rising], [0.05], rules=rules)[0].verdict == "not converged"
    assert family([flat], [0.05], rules=rules)[0].verdict == "not held"


def test_stable_lines_use_mcnemar_on_the_discordant_pairs():
    """10 discordant pairs all on the variant's side: exact two-sided binomial p = 2 / 2^10."""
    from scipy.stats import binomtest

    assert binomtest(10, 10, 0.5).pvalue == pytest.approx(2 / 2 ** 10)
    ev = Evidence(kind="stable", direction="higher", margin=0.01, n=30, estimate=10 / 30, p=2 / 2 ** 10,
                  counts=(10, 0, 30, 1.0, 20 / 30))
    judged = family([ev], [0.05])
    assert judged[0].verdict == "held" and judged[0].agreement == 1.0
