"""The report's ``power`` table (seeds needed for a detectable effect): the sample sizes against G*Power's
published values, the sd interval against the χ² table, and the table from hand-made paired differences."""

from __future__ import annotations

import pytest

from ablations.report.load import Run, StudyData
from ablations.report.power import MAX_SEEDS, power_table, sd_range, seeds_needed
from ablations.report.stats import ALPHA, main_cells, mde


def test_seeds_needed_matches_the_textbook_sample_sizes():
    """Paired t, two-sided α = 0.05, power 0.8: effect size d = Δ/s_d = 1 needs n = 10, d = 0.5 needs n = 34
    (G*Power's values; the normal shortcut would say 8 and 32)."""
    assert seeds_needed(lambda n: mde(0.01, n, 0.05), 0.01) == 10
    assert seeds_needed(lambda n: mde(0.01, n, 0.05), 0.005) == 34
    # the smallest such n: one seed fewer misses the target
    assert mde(0.01, 9, 0.05) > 0.01 >= mde(0.01, 10, 0.05)
    assert seeds_needed(lambda n: mde(1.0, n, 0.05), 1e-4) is None  # beyond MAX_SEEDS


def test_sd_interval_from_the_chi_square_table():
    """n = 20: χ²(19) quantiles 8.907 and 32.852 give √(19/32.852) = 0.760 and √(19/8.907) = 1.461."""
    low, high = sd_range(20)
    assert low == pytest.approx(0.7605, abs=1e-4) and high == pytest.approx(1.4606, abs=1e-4)


def _run(row: str, seed: int, acc: float, wall: float) -> Run:
    return Run(number=seed, state="complete", row=row, variant=row, depth=4, seed=seed, acc=acc,
               summary={"test_acc": acc, "wall_time_s": wall})


def test_power_table_from_hand_made_differences():
    """Two rows against standard over 6 seeds: 'noisy' differences of ±1 pp around +1, 'equal' all exactly +2 pp
    (no sd: no plan, like no MDE). The plan's seeds and the study's cost follow from s_d and the wall times."""
    standard = [0.90, 0.91, 0.89, 0.92, 0.90, 0.91]
    noisy = [+0.02, 0.00, +0.02, 0.00, +0.02, 0.00]  # s_d = 1.095 pp
    runs = [_run("standard", s, a, 2000.0 if s == 5 else 10.0) for s, a in enumerate(standard)]  # one paused
    runs += [_run("noisy", s, a + d, 30.0) for s, (a, d) in enumerate(zip(standard, noisy, strict=True))]
    runs += [_run("equal", s, a + 0.02, 80.0) for s, a in enumerate(standard)]
    rows = ["standard", "noisy", "equal"]
    data = StudyData(name="t", kind="grid", metric="test_acc", runs=runs, rows=rows, row_variant={r: r for r in rows},
                     row_extras={r: () for r in rows}, depths=[4])
    cells = main_cells(data)
    table = power_table(data, cells)
    records = table.frame.to_dict("records")
    assert [r["variant"] for r in records] == ["noisy"]  # 'equal' has no sd, standard is the baseline
    rec = records[0]
    sd = 0.010954451150103323
    assert rec["n_pairs"] == 6 and rec["sd"] == pytest.approx(sd)
    alpha = ALPHA / 1  # one comparison with a test: m = 1
    for target in (2.0, 1.0, 0.5):
        n = rec[f"seeds_{target:g}pp"]
        assert mde(sd, n, alpha) <= target / 100 < mde(sd, n - 1, alpha)
    assert rec["seeds_1pp"] == 12  # d = 1/1.095 = 0.913 (the normal shortcut (1.96 + 0.84)²/d² says 10)
    # cost: 3 rows per seed at the mean of the rows' median trial times 10, 30 and 80 s: 40 s (the paused run is
    # not the median of its row; all 18 runs' mean would be 151 s, their median 30 s)
    n = rec["seeds_1pp"]
    assert f"the median MDE ≤ 1.0 pp needs {n} seeds per row ({3 * n} reported trials, " \
           f"{3 * n * 40 / 3600:.1f} worker-hours)" in table.caption
    # n = 6: χ²(5) quantiles 0.831 and 12.833: √(5/12.833) = 0.62, √(5/0.831) = 2.45
    assert "40 s per trial and worker, the mean over the study's cells of each cell's median trial" in table.caption
    assert "0.62–2.45 × s_d" in table.caption
    assert "| noisy     |       4 |       6 |       1.10 |" in table.markdown()


def test_power_plan_over_depths_with_a_tuning_stage_and_without_wall_times():
    """Two depths (4 cells per seed), two tuning runs: the plan counts cells × seeds + the tuning trials; without
    any recorded wall time it gives no worker-hours; a hopeless sd reads '> 10000'."""
    runs, number = [], 0
    for depth, spread in ((4, 0.001), (8, 0.45)):  # depth 8: differences of ±45 pp, out of reach at 0.5 pp
        for s in range(4):
            base = 0.5
            runs.append(Run(number=number, state="complete", row="standard", variant="standard", depth=depth, seed=s,
                            acc=base))
            runs.append(Run(number=number + 1, state="complete", row="other", variant="other", depth=depth, seed=s,
                            acc=base + (spread if s % 2 else -spread) + 0.01))
            number += 2
    tune = [Run(number=100 + i, state="complete", row="standard", variant="standard", depth=4, seed=100, acc=0.5,
                phase="tune") for i in range(2)]
    data = StudyData(name="t", kind="grid", metric="test_acc", runs=runs, rows=["standard", "other"],
                     row_variant={"standard": "standard", "other": "other"},
                     row_extras={"standard": (), "other": ()}, depths=[4, 8], tune_runs=tune)
    table = power_table(data, main_cells(data))
    records = {r["depth"]: r for r in table.frame.to_dict("records")}
    assert set(records) == {4, 8} and records[8]["seeds_0.5pp"] is None
    assert f"> {MAX_SEEDS}" in table.markdown() and "worker-hours" not in table.caption
    n = records[4]["seeds_2pp"]
    assert n is not None
    # the median of two comparisons is their mean sd: its seeds for 1 pp, 4 cells per seed + 2 tuning trials
    assert "needs" in table.caption and " + 2 tuning trials)" in table.caption
    import re

    counts = [(int(a), int(b)) for a, b in re.findall(r"needs (\d+) seeds per row \((\d+) reported", table.caption)]
    assert counts and all(reported == 4 * seeds for seeds, reported in counts)


def test_no_power_table_without_an_sd_to_plan_from():
    """Every comparison with all paired differences equal: no MDE, so no table (the report leaves it out)."""
    runs = [Run(number=i, state="complete", row=row, variant=row, depth=4, seed=i // 2,
                acc=0.5 + (0.02 if row == "other" else 0.0) + 0.01 * (i // 2))
            for i, row in enumerate(["standard", "other"] * 3)]
    data = StudyData(name="t", kind="grid", metric="test_acc", runs=runs, rows=["standard", "other"],
                     row_variant={"standard": "standard", "other": "other"},
                     row_extras={"standard": (), "other": ()}, depths=[4])
    assert power_table(data, main_cells(data)) is None
