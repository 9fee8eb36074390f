"""The contending rates' stage (``ablations.run.contend``): after the reported grid, the reported seeds of every
cell whose rate choice is not settled train again at the rates a resampled choice could have picked, as a study of
their own; the report reads them (phase ``contend``) and the rate-aware verdicts cover the choice."""

from __future__ import annotations

import csv
import dataclasses
import itertools
import statistics

import optuna
import pytest
from helpers import STUDY_TEST_MARKS, run_claim_study, run_in_process, url_of
from optuna.trial import TrialState

from ablations.report.cli import main as report_main
from ablations.report.runs import read
from ablations.studies.spec import load_spec

pytestmark = STUDY_TEST_MARKS


def shares_by_hand(by_seed: dict[float, dict[int, float]], order: list[float]) -> dict[float, float]:
    """The 27 ordered draws of three tuning seeds, each choosing the highest mean (ties: first in ``order``)."""
    seeds = sorted(next(iter(by_seed.values())))
    counts = dict.fromkeys(order, 0)
    draws = list(itertools.product(seeds, repeat=len(seeds)))
    for draw in draws:
        means = {r: statistics.fmean(by_seed[r][s] for s in draw) for r in order}
        best = max(means.values())
        counts[next(r for r in order if means[r] >= best - 1e-12)] += 1
    return {r: c / len(draws) for r, c in counts.items()}


def test_the_contend_stage_spec_is_exactly_its_points():
    spec = load_spec("residual_variants")
    points = [{"variant": "standard", "depth": 4, "seed": s, "lr": 0.004} for s in (0, 1)]
    stage = spec.contend_stage(points)
    assert stage.stage == "contend" and stage.study_name == "residual_variants-contend"
    assert stage.grid() == points and stage.size == 2 and stage.tune is None
    config = stage.run_config(points[0])
    assert config.lr == 0.004 and config.seed == 0 and config.residual == "standard"


def test_only_the_cells_a_claim_compares_contend():
    """A cell no claim line (nor its premise) compares has no contending rates to train: its rate choice moves no
    verdict. completep_depth's claims are at depths 8 and 16 (both rows at the rate each chose at depth 2), so its
    depth-2 points do not contend; a premise's own depths do (depth_scaling's pre-LN at 16 against 4), and a study
    without claims keeps every cell."""
    from ablations.run.contend import claim_points
    from ablations.studies.claims import Claim, Premise, compared_cells

    spec = load_spec("completep_depth")
    points = claim_points(spec)
    assert len(spec.grid()) == 60 and len(points) == 40
    assert {(p["variant"], p["depth"]) for p in points} == {(v, d) for v in ("standard", "completep") for d in (8, 16)}
    premise = Premise(claim="p", variant="standard", baseline="standard", depth=16, baseline_depth=4)
    claims = (Claim(id="a", claim="c", source="s", variant="rezero", baseline="standard", depth=8, premise=premise),
              Claim(id="b", claim="c", source="s", variant="layerscale", baseline="standard", baseline_depth=16),
              Claim(id="u", claim="c", source="s", testable=False, reason="r"))
    assert compared_cells(claims, [4, 8, 16]) == {
        ("rezero", 8), ("standard", 8), ("standard", 16), ("standard", 4),  # claim a and its premise
        ("layerscale", 4), ("layerscale", 8), ("layerscale", 16)}  # claim b at every depth, its baseline at 16
    assert compared_cells(claims, []) == {("rezero", None), ("standard", None), ("layerscale", None)}
    assert compared_cells(claims[2:], [4]) is None  # no testable claim: every cell contends
    bare = dataclasses.replace(spec, claims=())
    assert claim_points(bare) == bare.grid()


@pytest.mark.slow  # tiny real trainings: 12 tuning, 4 reported and 4 contending runs (about a minute on 2 cores)
def test_unsettled_cells_train_their_reported_seeds_at_each_contending_rate(tmp_path):
    """End to end: a margin rule that leaves every choice unsettled (``settled_margin`` 0.5: no rate wins by 50 pp)
    makes each cell's runner-up contend; the stage trains exactly the reported points at it (recomputed here from the
    tuning trials by hand), its runs carry phase ``contend`` into runs.csv, and the claims' rate-aware replicates
    are then all covered when the resampled choices pick only the two rates trained."""
    path, db, result = run_claim_study(tmp_path, {"settled_margin": 0.5, "looks": 1})  # one look: no second round
    assert result.returncode == 0, result.stderr
    assert "the reported seeds train again at" in result.stderr
    tune = optuna.load_study(study_name="cont-tune", storage=url_of(db))
    chosen = optuna.load_study(study_name="cont", storage=url_of(db)).user_attrs["tuned_lr"]
    expected = set()
    for variant in ("standard", "rezero"):
        by_seed: dict[float, dict[int, float]] = {}
        for t in tune.get_trials(states=(TrialState.COMPLETE,)):
            if t.params["variant"] == variant:
                by_seed.setdefault(float(t.params["lr"]), {})[int(t.params["seed"])] = t.user_attrs["final_val_acc"]
        key = next(k for k in chosen if variant in k)
        means = {r: statistics.fmean(v.values()) for r, v in by_seed.items()}
        runner_up = max((r for r in means if r != chosen[key]), key=lambda r: means[r])
        shares = shares_by_hand(by_seed, [1e-3, 2e-3])
        assert 0 < shares.get(chosen[key], 0) <= 1
        expected |= {(variant, seed, runner_up) for seed in (0, 1)}
    stage = optuna.load_study(study_name="cont-contend", storage=url_of(db))
    trained = {(t.params["variant"], int(t.params["seed"]), float(t.params["lr"]))
               for t in stage.get_trials(states=(TrialState.COMPLETE,))}
    assert trained == expected
    assert all(t.user_attrs["phase"] == "contend" for t in stage.get_trials(states=(TrialState.COMPLETE,)))
    out = tmp_path / "report"
    result = run_in_process("--study", str(path), "--storage", url_of(db), "--results-dir", "results", "--out", out,
                            "--no-figures", "--no-tensorboard", "--no-note", cwd=tmp_path, main=report_main)
    assert result.returncode == 0, result.stderr
    data = read(out / "runs.csv", load_spec(str(path)), "cont")
    assert {(r.variant, r.seed, r.lr) for r in data.contend_runs} == expected
    (line,) = list(csv.DictReader((out / "claims.csv").open()))
    assert line["levels"].startswith("rate x seeds") and float(line["coverage"]) == 1.0


def test_the_contending_runs_keep_the_mode_of_the_studys_reported_runs(tmp_path):
    """The contending stage's kept mode comes from the study's own reported runs (and its tuning stage's): its runs
    differ from the chosen rate's runs by their rate, never by an attention kernel this machine would pick."""
    from ablations import layout
    from ablations.run.kept_modes import stored_kept, study_trials

    storage = f"sqlite:///{tmp_path / 'o.db'}"
    model = {layout.MODEL_KEY: {"embed_dim": 64, "img_size": 28, "patch_size": 7}, "device": "cpu"}
    explicit = model | {"precision": "32-true", "fused_attn": False, "phase": "report"}
    for name, n in (("s", 3), ("s-tune", 2), ("s-contend", 0)):
        study = optuna.create_study(study_name=name, storage=storage)
        for _ in range(n):
            study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, value=1.0, params={},
                                                      distributions={}, user_attrs=explicit))
    assert len(study_trials(storage, "s-contend", "contend")) == 5  # none of its own yet: the study's 3 and 2
    kept = stored_kept(storage, "s-contend", "contend")
    assert {(m.precision, m.fused_attn) for m in kept.values()} == {("32-true", False)}
    assert list(kept) == [("cpu", 64, 17)]


def test_a_dry_run_counts_only_the_imported_contending_runs_the_stage_would_train():
    """`completep_depth`'s committed runs.csv holds contending runs at depths 2, 8 and 16, but its claims compare
    depths 8 and 16 only: the stage calls for each of those cells' ten reported seeds at its one contending rate (40),
    and of the file's runs only those 40 count as done — the depth-2 ones are in no cell a claim reads. A file of
    fewer than three tuning seeds cannot tell which choices are settled: the count is not known, the most is."""
    from committed import REPO

    from ablations.run.contend import claim_points, dry_run_trials

    spec = load_spec("completep_depth")
    data = read(REPO / "results/completep_depth/runs.csv", spec, spec.study_name)
    at = {(r.row, r.depth) for r in data.contend_runs}
    assert {("completep", 2), ("standard", 2)} <= at  # runs in cells no claim compares
    cells = {(p["variant"], p["depth"]) for p in claim_points(spec)}
    assert cells == {(row, depth) for row in ("completep", "standard") for depth in (8, 16)}
    expected = {cell: len({r.lr for r in data.contend_runs if (r.row, r.depth) == cell}) * 10 for cell in cells}
    known, most, done = dry_run_trials(spec, data)
    assert known == done == expected and sum(expected.values()) == 40
    assert most == {cell: 10 * (spec.verdicts.max_rates - 1) for cell in cells}
    one_seed = dataclasses.replace(data, tune_runs=[r for r in data.tune_runs if r.seed == min(spec.tune.seeds)])
    assert dry_run_trials(spec, one_seed) == (None, most, done)
