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
    known, most, done, untuned = dry_run_trials(spec, data)
    assert known == done == expected and sum(expected.values()) == 40 and not untuned
    assert most == {cell: 10 * (spec.verdicts.max_rates - 1) for cell in cells}
    one_seed = dataclasses.replace(data, tune_runs=[r for r in data.tune_runs if r.seed == min(spec.tune.seeds)])
    assert dry_run_trials(spec, one_seed)[:3] == (None, most, done)


# A hand-made study whose points carry no depth (a row's depth comes from its configuration) and, in a second form,
# an extra grid axis (rows labelled "b [mlp_ratio=2.0]"): standard's rate choice is settled (2e-3 by 5 pp), b's a
# near-tie (2e-3 by 0.2 pp over 4e-3: one contending rate).
HAND_TUNE = {"standard": {0.001: 0.80, 0.002: 0.95, 0.004: 0.90}, "b": {0.001: 0.80, 0.002: 0.950, 0.004: 0.948}}
HAND_SEEDS = [0, 1, 2, 3]


def hand_study(extra: dict | None = None, contend_seeds=(0, 1), drop_report: bool = False):
    """(spec, data) of the hand-made study: its tuning stage, its reported grid at 2e-3 (less b's first point with
    ``drop_report``), and b's contending runs at 4e-3 on ``contend_seeds`` (seed 0 twice: counted once)."""
    import yaml

    from ablations.report import Run
    from ablations.report.load import assemble
    from ablations.studies.spec import _build

    doc = {"name": "hand", "kind": "grid", "metric": "test_acc", "base": {"dataset": "synthetic", "depth": 6},
           "variants": [{"label": "standard", "residual": "standard"}, {"label": "b", "residual": "standard"}],
           "axes": {"seed": HAND_SEEDS} | (extra or {}),
           "tune": {"lr": [0.001, 0.002, 0.004], "seeds": [100, 101, 102], "bounds": [0.001, 0.004],
                    "metric": "final_val_acc"},
           "claims": [{"id": "b_better", "claim": "b is better", "source": "none", "variant": "b",
                       "baseline": "standard", "direction": "higher"}]}
    spec = _build(yaml.safe_load(yaml.safe_dump(doc)), "default", "hand.yaml")
    grid = itertools.product(*extra.values()) if extra else [()]
    extras = [tuple(zip(extra or {}, values, strict=True)) for values in grid]
    runs, number = [], itertools.count()

    def add(variant, seed, lr, acc, phase, ex):
        runs.append(Run(number=next(number), state="complete", variant=variant, depth=6, seed=seed, row="", extras=ex,
                        acc=acc, config={"num_classes": 10, "lr": lr}, phase=phase,
                        summary={"test_acc": acc, "final_val_acc": acc, "num_classes": 10}))

    for ex in extras:
        for variant, by_rate in HAND_TUNE.items():
            for lr, acc in by_rate.items():
                for seed in (100, 101, 102):
                    add(variant, seed, lr, acc, "tune", ex)
            for seed in HAND_SEEDS:
                if not (drop_report and variant == "b" and seed == 0):
                    add(variant, seed, 0.002, 0.95 + 0.001 * seed, "report", ex)
        for seed in [*contend_seeds, *contend_seeds[:1]]:  # the first stored twice
            add("b", seed, 0.004, 0.94, "contend", ex)
    return spec, assemble("hand", spec, runs)


@pytest.mark.parametrize("extra", [None, {"mlp_ratio": [2.0, 4.0]}], ids=["no depth axis", "an extra axis"])
def test_a_dry_run_counts_contending_trials_where_the_runs_carry_their_rows_and_depths(extra, tmp_path, capsys):
    """The runs carry depth 6 (the configuration's) and, with an extra axis, rows labelled by it: b's cell (one per
    mlp_ratio) contends at 4e-3 on its 4 reported seeds, standard's does not; the file holds 2 of them per cell (seed 0
    stored twice counts once), priced under the (variant, depth) cell a stored trial names — (b, None) here."""
    from collections import Counter

    from ablations.run.contend import dry_run_trials

    spec, data = hand_study(extra)
    cells = 2 if extra else 1
    known, most, held, untuned = dry_run_trials(spec, data)
    assert known == Counter({("b", None): 4 * cells}) and held == Counter({("b", None): 2 * cells}) and not untuned
    assert most == Counter({("b", None): 4 * cells * 2, ("standard", None): 4 * cells * 2})
    one_seed = dataclasses.replace(data, tune_runs=[r for r in data.tune_runs if r.seed == 100])
    assert dry_run_trials(spec, one_seed)[:3] == (None, most, held)  # the count not known, the held runs are
    # a file that has not tuned b yet: standard's cell is known (settled: none), b's is at its most
    no_b = dataclasses.replace(data, tune_runs=[r for r in data.tune_runs if r.variant != "b"])
    assert dry_run_trials(spec, no_b)[0] == Counter() and dry_run_trials(spec, no_b).untuned == Counter(
        {("b", None): most[("b", None)]})
    from ablations.report.runs import write
    from ablations.run.later import say_later_stages

    say_later_stages(spec, write(no_b, tmp_path / "runs.csv"), 60.0, 1)
    assert (f"0 trials for the rate choices of the file's tuning stage that are not settled, and at most "
            f"{most[('b', None)]} for the cells it has not tuned yet (each reported point") in capsys.readouterr().out
    assert dry_run_trials(dataclasses.replace(spec, tune=dataclasses.replace(spec.tune, seeds=[100])), data) is None


def test_a_dry_run_prices_an_exact_second_look_only_from_a_complete_first_look(tmp_path, monkeypatch, capsys):
    """The second look is known once every reported point and every contending run of the first look is in: b's
    line is undecided (futility switched off), so b and standard get 4 new seeds each (4-7) and b's new points its
    contending rate too: 8 + 4 trials, of which the file holds b's round runs at seeds 4 and 5 and its contending run
    at seed 4 (3). A file missing one reported point, or one contending run, leaves it unknown ("at most")."""
    from collections import Counter

    import ablations.run.rounds as rounds
    from ablations.report.runs import write
    from ablations.run.durations import duration_text
    from ablations.run.later import say_later_stages

    monkeypatch.setattr(rounds, "futile", lambda *args: False)
    spec, data = hand_study(contend_seeds=(0, 1, 2, 3))
    points, cells, contending, held = rounds.dry_run_trials(spec, data)
    assert cells == {("b", 6), ("standard", 6)} and {p["seed"] for p in points} == {4, 5, 6, 7} and len(points) == 8
    assert contending == Counter({("b", None): 4}) and not held
    extra = [dataclasses.replace(r, number=1000 + i, seed=s, phase="round")
             for i, (r, s) in enumerate(itertools.product([r for r in data.runs if r.row == "b"][:1], (4, 5)))]
    extra.append(dataclasses.replace(data.contend_runs[0], number=2000, seed=4))
    more = dataclasses.replace(data, runs=data.runs + extra[:2], contend_runs=data.contend_runs + extra[2:])
    assert rounds.dry_run_trials(spec, more)[3] == Counter({("b", None): 3})
    path = write(more, tmp_path / "runs.csv")
    say_later_stages(spec, path, 60.0, 1)
    out = capsys.readouterr().out
    assert "(4 of them in the imported runs); none left" in out  # the contending stage
    assert (f"8 trials, and 4 at their contending rates (3 of them in the imported runs); about "
            f"{duration_text(9 * 60.0)}") in out
    partials = (hand_study(contend_seeds=(0, 1, 2))[1], hand_study(contend_seeds=(0, 1, 2, 3), drop_report=True)[1])
    for partial in partials:
        assert rounds.dry_run_trials(spec, partial) is None
