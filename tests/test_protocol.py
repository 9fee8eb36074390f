"""The fair protocol's verdict rules on hand-made runs: significance on the Holm-adjusted p (never the raw one), a
claim's premise checked before its verdict, runs below the study's floor counted like diverged ones, and the
two-level bootstrap interval (seeds x test images) from each run's per-image test results."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from scipy import stats

from ablations.report import Run
from ablations.report.bootstrap import two_level_ci
from ablations.report.claims import claim_records, line_text
from ablations.report.load import assemble
from ablations.report.runs import read, to_csv
from ablations.report.stats import main_cells
from ablations.report.tables import acc_text, cell_records, paired_table
from ablations.studies.spec import _build
from lit_modules.predictions import pack, unpack

SEEDS = list(range(6))
BASE = [0.80, 0.81, 0.79, 0.805, 0.795, 0.802]


def spec_of(variants: list[str], claims: list[dict], depths=(4,), **keys):
    doc = {"name": "hand", "kind": "grid", "metric": "test_acc", "base": {"dataset": "synthetic"},
           "variants": [{"label": v, "residual": "standard"} for v in variants],
           "axes": {"depth": list(depths), "seed": SEEDS}, "claims": claims, **keys}
    return _build(yaml.safe_load(yaml.safe_dump(doc)), "default", "hand.yaml")


def run(number: int, variant: str, seed: int, acc: float, depth: int = 4, diverged: bool = False,
        **summary) -> Run:
    return Run(number=number, state="complete", variant=variant, depth=depth, seed=seed, row="", acc=acc,
               diverged=diverged, config={"num_classes": 10, "lr": 1e-3},
               summary={"test_acc": acc, "final_val_acc": acc, "num_classes": 10} | summary)


def test_significance_is_decided_on_the_holm_p_not_the_raw_one():
    """Three variants with the same paired differences: each raw t-test p is below 0.05, Holm's (x3) above. Neither
    the main table nor a claim may call them significant."""
    diffs = [0.012, 0.002, 0.015, -0.001, 0.009, 0.006]
    raw = stats.ttest_rel(np.array(diffs), np.zeros(6)).pvalue
    assert raw < 0.05 < 3 * raw  # the premise of this test: one side of 0.05 raw, the other after Holm
    variants = ["standard", "a", "b", "c"]
    runs = [run(i, "standard", s, BASE[s]) for i, s in enumerate(SEEDS)]
    runs += [run(10 * k + s, v, s, BASE[s] + diffs[s]) for k, v in enumerate(variants[1:], 1) for s in SEEDS]
    claims = [{"id": f"{v}_better", "claim": "better", "source": "none", "variant": v, "baseline": "standard",
               "direction": "higher"} for v in variants[1:]]
    spec = spec_of(variants, claims)
    data = assemble("hand", spec, runs)
    cells = [c for c in main_cells(data) if c.comparison is not None]
    assert [c.comparison.p_t for c in cells] == pytest.approx([raw] * 3)
    assert all(c.p_t_holm == pytest.approx(3 * raw) and not c.significant for c in cells)
    records, _ = claim_records(data, spec.claims, spec=spec)
    assert [r["verdict"] for r in records] == ["not resolved"] * 3
    assert all(r["p_t"] == pytest.approx(raw) and r["p"] < 0.05 < r["p_holm"] and r["m"] == 3 for r in records)


def test_a_claim_whose_premise_is_absent_gets_premise_absent_and_leaves_the_holm_family():
    """CaiT's 'LayerScale keeps improving with depth where the baseline saturates', with the premise "standard falls
    from depth 4 to 16": where standard rises, the verdict is 'premise absent' with the premise's own numbers;
    where it falls, the claim is judged (m counts only judged lines)."""
    claim = {"id": "ls_deep", "claim": "LayerScale keeps improving with depth", "source": "CaiT",
             "variant": "layerscale", "baseline": "standard", "depth": 16, "direction": "higher",
             "premise": {"claim": "standard's accuracy falls with depth", "variant": "standard", "depth": 16,
                         "baseline": "standard", "baseline_depth": 4, "direction": "lower"}}
    other = {"id": "ls_shallow", "claim": "LayerScale improves", "source": "CaiT", "variant": "layerscale",
             "baseline": "standard", "depth": 4, "direction": "higher"}
    spec = spec_of(["standard", "layerscale"], [claim, other], depths=(4, 16))
    ups = [0.010, 0.012, 0.008, 0.011, 0.009, 0.010]

    def data(deep_shift: list[float]):
        runs = [run(s, "standard", s, BASE[s], depth=4) for s in SEEDS]
        runs += [run(10 + s, "standard", s, BASE[s] + deep_shift[s], depth=16) for s in SEEDS]
        runs += [run(20 + s, "layerscale", s, BASE[s] + ups[s], depth=4) for s in SEEDS]
        runs += [run(30 + s, "layerscale", s, BASE[s] + deep_shift[s] + ups[s], depth=16) for s in SEEDS]
        return assemble("hand", spec, runs)

    rises = data([0.004, 0.006, 0.005, 0.003, 0.007, 0.005])
    records, family = claim_records(rises, spec.claims, spec=spec)
    deep = records[0]
    assert deep["verdict"] == "premise absent" and deep["p_holm"] is None and deep["m"] is None
    assert len(family) == 1 and records[1]["m"] == 1  # only the judged line is in the Holm family
    assert deep["premise_delta"] == pytest.approx(0.005) and deep["premise_ci_low"] > 0
    text = line_text(deep)
    assert "**premise absent**" in text and "standard's accuracy falls with depth" in text and "Δ = +0.50 pp" in text
    falls = data([-0.020, -0.025, -0.018, -0.022, -0.019, -0.021])
    records, family = claim_records(falls, spec.claims, spec=spec)
    assert records[0]["verdict"] == "held" and records[0]["m"] == 2 and len(family) == 2


def test_a_run_below_the_floor_failed_to_train_and_counts_at_chance_in_the_pairs():
    """floor: final_val_acc below 5x chance (10 classes: 50 %). A 0.45 run is out of the mean and sd, shown as
    '1/6 failed to train', and in the pairs at 0.1, as a diverged run would be."""
    spec = spec_of(["standard", "seedform"], [], floor={"metric": "final_val_acc", "chance_multiple": 5})
    values = [0.60, 0.62, 0.45, 0.61, 0.63, 0.59]
    runs = [run(s, "standard", s, BASE[s]) for s in SEEDS] + [run(10 + s, "seedform", s, v)
                                                              for s, v in enumerate(values)]
    data = assemble("hand", spec, runs)
    assert [r.failed_training for r in data.runs if r.variant == "seedform"] == [False, False, True, False, False,
                                                                                  False]
    cell = next(c for c in main_cells(data) if c.row == "seedform")
    assert cell.n == 5 and cell.mean == pytest.approx(np.mean([0.60, 0.62, 0.61, 0.63, 0.59]))
    assert cell.pair_values[2] == pytest.approx(0.1) and cell.comparison.n == 6
    assert cell.comparison.delta == pytest.approx(np.mean([v - b for v, b in zip([*values[:2], 0.1, *values[3:]],
                                                                                    BASE, strict=True)]))
    assert "(1/6 failed to train)" in acc_text(cell_records([cell])[0], "md")


def test_the_two_level_bootstrap_covers_the_test_images_where_the_t_interval_cannot():
    """Every seed with the same paired Δ: the t-interval is undefined (all differences equal), yet a different draw
    of test images would move Δ; the two-level interval has the width the images give (a paired bootstrap over
    images: about Δ ± 1.96 sd(d_i)/√N), and identical runs give [0, 0]."""
    rng = np.random.default_rng(1)
    images = 1000
    ref = rng.random(images) < 0.8
    own = ref.copy()
    flip = rng.choice(np.flatnonzero(~ref), size=40, replace=False)
    own[flip] = True  # +4.0 pp on the same images, on every seed
    low, high = two_level_ci({s: own for s in SEEDS}, {s: ref for s in SEEDS})
    d = own.astype(float) - ref.astype(float)
    half = 1.96 * d.std() / np.sqrt(images)
    assert low == pytest.approx(0.04 - half, abs=0.003) and high == pytest.approx(0.04 + half, abs=0.003)
    assert two_level_ci({s: ref for s in SEEDS}, {s: ref for s in SEEDS}) == (0.0, 0.0)
    # a run at chance level (no per-image results) counts at its constant value in every resample
    low, high = two_level_ci({0: 0.1, 1: 0.1}, {0: ref, 1: ref})
    assert low == pytest.approx(0.1 - ref.mean(), abs=0.03) and high < 0


def test_per_image_results_round_trip_through_runs_csv_and_give_the_paired_tables_their_interval(tmp_path):
    rng = np.random.default_rng(0)
    spec = spec_of(["standard", "better"], [])
    runs = []
    for s in SEEDS:
        ref = rng.random(500) < 0.8
        own = ref | (rng.random(500) < 0.1)
        runs += [run(s, "standard", s, float(ref.mean()), test_correct=pack(ref)),
                 run(10 + s, "better", s, float(own.mean()), test_correct=pack(own))]
    data = assemble("hand", spec, runs)
    path = tmp_path / "runs.csv"
    path.write_text(to_csv(data))
    back = read(path, spec, "hand")
    assert [unpack(r.summary["test_correct"]).tolist() for r in back.runs] == \
        [unpack(r.summary["test_correct"]).tolist() for r in data.runs]
    cell = next(c for c in main_cells(back) if c.row == "better")
    assert cell.comparison.boot_low is not None and cell.comparison.boot_low < cell.comparison.delta \
        < cell.comparison.boot_high
    table = paired_table(back, main_cells(back)).markdown()
    assert "two-level 95% interval (pp)" in table and "also covers the sampling of the test images" in table


def test_pack_and_unpack_are_inverse_and_refuse_garbage():
    bits = np.array([True, False, True, True, False, False, False, True, True])
    assert unpack(pack(bits)).tolist() == bits.tolist() and pack(bits).startswith("9:")
    assert unpack(pack(np.zeros(0, bool))).size == 0
    for bad in ("x", "12:AA==", "3:!!"):
        with pytest.raises(ValueError, match="not a packed per-image result"):
            unpack(bad)
