"""A study's second look (``ablations.run.rounds``): the rows of the claim lines its first look left undecided train
as many new seeds again, never a tuning seed; decided, futile and old-evidence lines get none; the runs are reported
runs of their own stage, numbered apart in a report."""

from __future__ import annotations

import numpy as np
import optuna
import pytest
from helpers import STUDY_TEST_MARKS, run_claim_study, run_in_process, url_of
from optuna.trial import TrialState

from ablations.report.evidence import Evidence
from ablations.report.load import ROUND_OFFSET
from ablations.run.rounds import futile, new_seeds, undecided_cells
from ablations.studies.rules import VerdictRules
from ablations.studies.spec import load_spec

pytestmark = STUDY_TEST_MARKS


def test_a_second_look_trains_as_many_new_seeds_and_never_a_tuning_seed():
    spec = load_spec("residual_variants")
    assert new_seeds(spec) == list(range(20, 40))
    small = load_spec("init_values")
    assert small.axes["seed"] == [0, 1, 2, 3, 4] and new_seeds(small) == [5, 6, 7, 8, 9]
    import dataclasses

    crowded = dataclasses.replace(spec, axes=dict(spec.axes) | {"seed": list(range(95, 100))})
    assert new_seeds(crowded) == [103, 104, 105, 106, 107]  # 100-102 are the tuning seeds
    stage = spec.round_stage([{"variant": "standard", "depth": 4, "seed": 20}])
    assert stage.study_name == "residual_variants-round" and stage.grid() == [{"variant": "standard", "depth": 4,
                                                                               "seed": 20}]
    assert 20 in stage.axes["seed"] and stage.tune is not None  # it trains at the tuned rate of its cell


def evidence(estimate: float, se: float, n: int = 10, kind: str = "superior") -> Evidence:
    return Evidence(kind=kind, direction="higher", margin=0.01, n=n, estimate=estimate, se=se, p=0.5,
                    oriented=np.zeros(10))


def test_a_line_is_futile_when_twice_the_seeds_could_decide_nothing():
    """+0.5 pp at SE 0.3 pp: at 20 seeds the SE is 0.21 pp, t = 2.36 on 19 df, p = 0.029, scaled by α over the second
    look's share (0.019): 0.076 — not decidable; but equivalence within 1 pp is (the interval would be inside): not
    futile. +2 pp at SE 3 pp: neither. +1.5 pp at SE 0.5 pp: decidable."""
    rules = VerdictRules()
    assert not futile(evidence(0.005, 0.003), rules, 0.05)
    assert futile(evidence(0.02, 0.03), rules, 0.05)
    assert not futile(evidence(0.015, 0.005), rules, 0.05)
    assert futile(Evidence(kind="superior", direction="higher", margin=0.01), rules, 0.05)  # no test at all


def test_only_undecided_lines_worth_it_get_a_second_look():
    rules = VerdictRules()
    rec = {"variant": "a", "baseline": "standard", "depth": 4, "baseline_depth": None, "old_evidence": None}
    records = [rec | {"verdict": "not resolved", "_evidence": evidence(0.015, 0.005)},
               rec | {"variant": "b", "verdict": "held", "_evidence": evidence(0.03, 0.002)},
               rec | {"variant": "c", "verdict": "not resolved", "_evidence": evidence(0.02, 0.03)},  # futile
               rec | {"variant": "d", "verdict": "not resolved", "old_evidence": "rate tuned on 1 seed",
                      "_evidence": evidence(0.015, 0.005)},
               rec | {"variant": "e", "baseline": "post_ln", "baseline_depth": 16, "verdict": "not resolved",
                      "_evidence": evidence(0.015, 0.005)}]
    assert undecided_cells(records, rules, 0.05) == {("a", 4), ("standard", 4), ("e", 4), ("post_ln", 16)}


@pytest.mark.slow  # tiny real trainings: 12 tuning, 4 reported, a second look of up to 4, its contending runs
def test_an_undecided_line_gets_a_second_look_end_to_end(tmp_path, monkeypatch):
    """Two seeds cannot decide a claim (a t on one degree of freedom would need t > 20): the second look trains seeds
    2 and 3 of both rows at their tuned rates in 'cont-round'; the report reads them as reported runs (phase round,
    numbered from 100,000) and the line's pairs grow to four. (Futility is switched off: whether two more seeds
    could decide depends on this machine's numbers.)"""
    import ablations.run.rounds as rounds

    monkeypatch.setattr(rounds, "futile", lambda *args: False)
    path, db, result = run_claim_study(tmp_path, {"margin": 0.0001})  # nothing is equivalent within 0.01 pp
    assert result.returncode == 0, result.stderr
    assert "a second look trains 2 more seeds of rezero depth=1, standard depth=1" in result.stderr
    second = optuna.load_study(study_name="cont-round", storage=url_of(db))
    done = second.get_trials(states=(TrialState.COMPLETE,))
    assert {(t.params["variant"], int(t.params["seed"])) for t in done} == {
        (v, s) for v in ("standard", "rezero") for s in (2, 3)}
    chosen = optuna.load_study(study_name="cont", storage=url_of(db)).user_attrs["tuned_lr"]
    assert {t.user_attrs["config"]["lr"] for t in done if t.params["variant"] == "rezero"} == \
        {v for k, v in chosen.items() if "rezero" in k}
    from ablations.report.cli import main as report_main
    from ablations.report.runs import read

    out = tmp_path / "report"
    result = run_in_process("--study", str(path), "--storage", url_of(db), "--results-dir", "results", "--out", out,
                            "--no-figures", "--no-tensorboard", "--no-note", cwd=tmp_path, main=report_main)
    assert result.returncode == 0, result.stderr
    data = read(out / "runs.csv", load_spec(str(path)), "cont")
    rounds = [r for r in data.runs if r.phase == "round"]
    assert len(rounds) == 4 and all(r.number >= ROUND_OFFSET for r in rounds)
    assert {r.seed for r in data.by_row_depth("rezero", 1)} == {0, 1, 2, 3}
    # the report's runs.csv continues the whole study in a new storage: every stage's rows join as done, the second
    # look's as its own stage, and nothing trains again
    again = tmp_path / "again.db"
    result = run_in_process("--study", str(path), "--storage", url_of(again), "--results-dir", "results",
                            "--no-progress", "--import-runs", out / "runs.csv", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "4 completed second-look trial(s) joined 'cont-round' as done" in result.stderr, result.stderr
    for name in ("cont-tune", "cont", "cont-round"):
        trials = optuna.load_study(study_name=name, storage=url_of(again)).get_trials()
        assert trials and all("imported_from" in t.user_attrs for t in trials), name


@pytest.mark.slow  # the first look's verdicts over 18 lines, 10,000 rate-aware resamples each (about 20 s)
def test_a_dry_run_prices_the_second_look_that_an_imported_first_look_calls_for(tmp_path, capsys):
    """From `frontier`'s committed runs.csv, whose reported grid and contending rates are complete: the contending
    stage is all in the file (nothing left to price); the second look is every cell of a line still undecided — never
    one only a decided line compares —, 10 new seeds each, and each new point again at its cell's contending rates (the
    rates the first look's contending runs trained there). Each trial is priced at its cell's median measured wall
    time, a cell not measured at the estimate. With part of the contending runs left out, which lines stay undecided
    is not known yet, and the dry run prices the most it can take."""
    import csv
    import dataclasses
    import io
    from collections import Counter

    from committed import REPO

    from ablations.report.runs import read, write
    from ablations.run.contend import dry_run_trials as contend_trials
    from ablations.run.durations import duration_text
    from ablations.run.later import say_later_stages
    from ablations.run.looks import first_look_runs
    from ablations.run.rounds import dry_run_trials

    spec = load_spec("frontier")  # its first look (a second look's runs, once committed, left out)
    full = read(REPO / "results/frontier/runs.csv", spec, spec.study_name)
    data = first_look_runs(spec, full)
    known, most, done, untuned = contend_trials(spec, data)
    assert known == done and sum(known.values()) == len(data.contend_runs) > 0 and not untuned
    assert all(most[cell] >= n for cell, n in known.items())
    points, cells, contending, done = dry_run_trials(spec, data)
    assert not done and cells and len(points) == 10 * len(cells)
    assert {(p["variant"], p["depth"]) for p in points} == cells and {p["seed"] for p in points} == set(range(10, 20))
    rates = {cell: {r.lr for r in data.contend_runs if (r.row, r.depth) == cell} for cell in cells}
    assert contending == Counter({cell: 10 * len(rates[cell]) for cell in cells if rates[cell]})
    lines = list(csv.DictReader(io.StringIO((REPO / "results/frontier/claims.csv").read_text(encoding="utf-8"))))
    sides = {v: {(line["variant"], int(line["depth"])) for line in lines if line["verdict"] == v} |
             {(line["baseline"], int(line["depth"])) for line in lines if line["verdict"] == v}
             for v in ("held", "not resolved")}
    if not any(r.phase == "round" for r in full.runs):  # claims.csv holds the first look's verdicts
        assert cells <= sides["not resolved"] and not cells & (sides["held"] - sides["not resolved"])
    trials = len(points) + sum(contending.values())
    path = write(data, tmp_path / "first.csv")
    say_later_stages(spec, path, 60.0, 2)
    out = capsys.readouterr().out
    assert f"({sum(known.values())} of them in the imported runs); none left" in out
    assert (f"train 10 more seeds each — {len(points)} trials, and {sum(contending.values())} at their contending "
            f"rates; about {duration_text(60.0 * trials / 2)} more\n") in out
    # one cell measured at 200 s a trial (the median of its runs), the others at the estimate, 60 s
    one = sorted(cells)[0]
    at_one = 10 + contending[one]
    say_later_stages(spec, path, 60.0, 2, factor=0.5, measured={one: [100.0, 200.0, 900.0]})
    out = capsys.readouterr().out
    assert (f"about {duration_text((200.0 * at_one + 60.0 * (trials - at_one)) / 2)} more ({at_one} trials at their "
            f"cell's median wall time, {trials - at_one} at the estimate x 0.50 as this study's measured cells ran)"
            ) in out
    part = dataclasses.replace(data, contend_runs=data.contend_runs[: len(data.contend_runs) // 2])
    part_done = contend_trials(spec, part).held
    assert sum(part_done.values()) == len(data.contend_runs) // 2 and dry_run_trials(spec, part) is None
    say_later_stages(spec, write(part, tmp_path / "part.csv"), 60.0, 2)
    out = capsys.readouterr().out
    left = sum(known.values()) - len(data.contend_runs) // 2
    assert f"about {duration_text(60.0 * left / 2)} more" in out and f"at most {spec.size} trials" in out
