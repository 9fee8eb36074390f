"""The depth premises (``ablations.report.depth``) on hand-made runs: the paired difference from a row's shallowest
depth, the share of runs that train with its Clopper-Pearson interval, and the sentences that name the depth at
which a row degrades or fails."""

from __future__ import annotations

import pytest
from scipy import stats
from test_protocol import BASE, SEEDS, run, spec_of

from ablations.report.depth import depth_figure, depth_records, depth_table, premise_sentences
from ablations.report.load import assemble


def data_of(falls: dict[int, float], failed: dict[int, int], spread: float = 0.0):
    """standard at depths 4, 16, 64: its accuracy shifted by ``falls[depth]`` on every seed (± ``spread`` by seed
    below depth 4, mean 0), and ``failed[depth]`` of its six seeds below the floor (final val accuracy 0.3 < 5x
    chance)."""
    spec = spec_of(["standard"], [], depths=(4, 16, 64), floor={"metric": "final_val_acc", "chance_multiple": 5})
    runs = []
    for depth in (4, 16, 64):
        for s in SEEDS:
            noise = spread * (s % 3 - 1) if depth != 4 else 0.0
            acc = 0.3 if s < failed.get(depth, 0) else BASE[s] + falls.get(depth, 0.0) + 0.001 * (s % 2) + noise
            runs.append(run(100 * depth + s, "standard", s, acc, depth=depth))
    return spec, assemble("hand", spec, runs)


def test_a_row_that_degrades_and_fails_is_named_at_the_first_depth_it_does():
    spec, data = data_of({16: -0.002, 64: -0.05}, {64: 4})
    records = depth_records(data, spec.verdicts, resamples=2000)
    by_depth = {r["depth"]: r for r in records}
    assert by_depth[4]["delta"] is None
    assert by_depth[16]["delta"] == pytest.approx(-0.002, abs=1e-9)  # the same seeds, shifted by 0.2 pp
    assert by_depth[64]["trained"] == 2 and by_depth[64]["runs"] == 6
    ci = stats.binomtest(2, 6).proportion_ci(0.95, method="exact")
    assert (by_depth[64]["share_low"], by_depth[64]["share_high"]) == pytest.approx((ci.low, ci.high))
    (sentence,) = premise_sentences(records, spec.verdicts.margin)
    assert "falls by more than 1.0 pp from depth 4 first at depth 64" in sentence
    assert "at least 50% of its runs fail to train first at depth 64 (4 of 6)" in sentence
    steady_spec, steady = data_of({16: 0.001, 64: 0.002}, {})
    (sentence,) = premise_sentences(depth_records(steady, steady_spec.verdicts, resamples=2000), 0.01)
    assert "is not shown to fall by more than 1.0 pp from depth 4 up to depth 64" in sentence
    assert "at depth 64: Δ = +0.20 pp)" in sentence  # measured where it looked last (no spread: no interval)
    unclear_spec, unclear = data_of({64: -0.012}, {}, spread=0.01)  # a fall beyond the margin, interval across it
    records = depth_records(unclear, unclear_spec.verdicts, resamples=2000)
    (sentence,) = premise_sentences(records, 0.01)
    low, high = records[-1]["ci_low"], records[-1]["ci_high"]
    assert records[-1]["delta"] == pytest.approx(-0.012, abs=1e-9) and low < -0.01 < high
    assert "does not fall" not in sentence and "at depth 64: Δ = −1.20 pp [" in sentence
    assert "fewer than 50% of its runs fail to train up to depth 64" in sentence


def test_the_depth_table_and_figure_are_written_for_a_study_of_several_depths(tmp_path):
    spec, data = data_of({64: -0.05}, {64: 4})
    table = depth_table(data, spec.verdicts, resamples=2000)
    assert table is not None and "2/6 [4–78%]" in table.markdown()
    assert "2/6 [4--78\\%]" in table.latex("tab:x")  # ASCII, and a % that does not comment out the rest of the row
    paths = depth_figure(table.frame.to_dict("records"), data.rows, data.name, tmp_path)
    assert [p.name for p in paths] == ["depth_premises.png", "depth_premises.pdf"] and paths[0].stat().st_size > 0
    one_spec = spec_of(["standard"], [])
    assert depth_table(assemble("hand", one_spec, [run(s, "standard", s, BASE[s]) for s in SEEDS]),
                       one_spec.verdicts) is None


def test_the_same_comparison_gets_the_same_interval_in_the_depth_table_a_claim_and_a_premise():
    """Replicates are seeded by the comparison (study, both sides, metric), not by the line that asks: a claim on
    depth 64 vs 4, another claim of a different kind on the same sides, a premise and the depth table all report
    one interval, to the last Monte-Carlo digit."""
    from ablations.report.claims import claim_records

    base_spec, data = data_of({16: -0.004, 64: -0.03}, {}, spread=0.01)
    claims = [{"id": name, "claim": name, "source": "none", "variant": "standard", "baseline": "standard",
               "depth": 64, "baseline_depth": 4, "direction": "lower", **extra}
              for name, extra in (("falls", {}), ("falls_again", {"kind": "noninferior"}))]
    claims.append({"id": "after_a_premise", "claim": "x", "source": "none", "variant": "standard",
                   "baseline": "standard", "depth": 16, "baseline_depth": 4, "direction": "lower",
                   "premise": {"claim": "it falls", "variant": "standard", "baseline": "standard", "depth": 64,
                               "baseline_depth": 4, "direction": "lower"}})
    spec = spec_of(["standard"], claims, depths=(4, 16, 64), floor={"metric": "final_val_acc", "chance_multiple": 5})
    records, _ = claim_records(data, spec.claims, spec=spec, resamples=2000)
    by_id = {r["id"]: r for r in records}
    deep = next(r for r in depth_records(data, base_spec.verdicts, resamples=2000) if r["depth"] == 64)
    interval = (deep["ci_low"], deep["ci_high"])
    assert interval[0] < -0.03 < interval[1] < 0  # a real interval around the 3 pp fall
    assert (by_id["falls"]["ci_low"], by_id["falls"]["ci_high"]) == interval
    assert (by_id["falls_again"]["ci_low"], by_id["falls_again"]["ci_high"]) == interval
    assert (by_id["after_a_premise"]["premise_ci_low"], by_id["after_a_premise"]["premise_ci_high"]) == interval
    shallow = next(r for r in depth_records(data, base_spec.verdicts, resamples=2000) if r["depth"] == 16)
    assert (by_id["after_a_premise"]["ci_low"], by_id["after_a_premise"]["ci_high"]) == (shallow["ci_low"],
                                                                                       shallow["ci_high"])
