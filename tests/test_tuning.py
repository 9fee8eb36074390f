"""The tuning stage of a study (``tune:``): each variant's learning rate chosen on tuning seeds that are never
reported, by mean validation accuracy, stored with the study; the reported grid trains at it."""

from __future__ import annotations

import json
import re

import optuna
import pytest
from helpers import LIVE_WORKERS, THREE_VARIANTS, run_cli_many, run_in_process, url_of, write_study
from optuna.trial import TrialState, create_trial

from ablations.run.tuning import choose_lrs, tune_outcome
from ablations.studies.spec import MIN_TUNE_SEEDS, TUNE_GRID, available_studies, load_spec

VARIANTS = [{"label": "standard", "residual": "standard"}, {"label": "rezero", "residual": "rezero"}]


SEEDS = [100, 101, 102]


def spec_with(tmp_path, tune: dict, axes: dict | None = None, **keys):
    tune = {"seeds": SEEDS, "bounds": [1e-4, 1e-1]} | tune
    path = write_study(tmp_path / "tuned.yaml", variants=VARIANTS, tune=tune,
                       axes=axes or {"depth": [1, 2], "seed": [0, 1]}, **keys)
    return load_spec(str(path))


@pytest.mark.parametrize(("tune", "fault"), [
    ({"lr": [1e-3], "seeds": [0]}, "tuning seeds [0] are also reported seeds"),
    ({"lr": [], "seeds": [100]}, "'lr' must be a non-empty list"),
    ({"lr": [1e-3, 1e-3], "seeds": [100]}, "'lr' must list distinct positive numbers"),
    ({"lr": [-1e-3], "seeds": [100]}, "'lr' must list distinct positive numbers"),
    ({"lr": [1e-3], "seeds": [100, 100]}, "'seeds' must list distinct integers"),
    ({"lr": [1e-3], "seeds": [100], "metric": "test_acc"}, "metric 'test_acc' is not a validation metric"),
    ({"lr": [1e-3], "seeds": [100], "axes": {"depth": [7]}}, "axes.depth must list values of the study's axis"),
    ({"lr": [1e-3], "seeds": [100], "axes": {"seed": [1]}}, "unknown key 'seed'"),
    ({"lr": [1e-3], "seeds": [100], "steps": 3}, "unknown key 'steps'; valid keys: lr, seeds, bounds, metric, axes"),
    ({"lr": [1e-3], "seeds": [100, 101]}, f"2 tuning seed(s) [100, 101]; a budget that is evidence needs at least "
                                          f"{MIN_TUNE_SEEDS}"),
    ({"lr": [1e-3], "bounds": None}, "'bounds' is missing"),
    ({"lr": [1e-3, 4e-3], "bounds": [2e-3, 1e-2]}, "'bounds' must be [low, high], two positive numbers around the "
                                                    "'lr' grid [0.001, 0.004], got [0.002, 0.01]"),
    ({"lr": [1e-3], "bounds": [0, 1e-2]}, "'bounds' must be [low, high]"),
    ({"lr": [1e-3], "bounds": [1e-4]}, "'bounds' must be [low, high]"),
])
def test_a_bad_tune_section_is_a_one_line_error(tmp_path, tune, fault):
    with pytest.raises(ValueError, match=re.escape(fault)) as exc:
        spec_with(tmp_path, tune)
    assert "\n" not in str(exc.value)


def test_the_tuning_stage_is_a_grid_of_its_own_on_the_tuning_seeds(tmp_path):
    spec = spec_with(tmp_path, {"lr": [1e-3, 4e-3]})
    tune = spec.tune_stage()
    assert tune.study_name == "tuned-tune" and tune.stage == "tune" and tune.tune is None
    assert tune.size == 2 * 2 * 3 * 2  # variants x depths x seeds x lrs
    assert {p["seed"] for p in tune.grid()} == set(SEEDS) and {p["lr"] for p in tune.grid()} == {1e-3, 4e-3}
    # the rates added beyond the edges train on every tuning seed, for their cell only
    cell = json.dumps(["rezero", [["depth", 2]]])
    extended = spec.tune_stage({cell: [8e-3, 1.6e-2]})
    added = extended.grid()[tune.size:]
    assert extended.size == tune.size + 2 * 3
    assert added == [{"seed": s, "variant": "rezero", "depth": 2, "lr": lr} for lr in (8e-3, 1.6e-2) for s in SEEDS]
    assert tune.run_config({"variant": "rezero", "depth": 2, "seed": 100, "lr": 4e-3}).lr == 4e-3
    # one lr per variant and depth; tune.axes pins an axis: its single tuned value stands for all of its values
    assert spec.tune_key({"variant": "rezero", "depth": 2, "seed": 0}) == json.dumps(["rezero", [["depth", 2]]])
    pinned = spec_with(tmp_path, {"lr": [1e-3], "axes": {"depth": [1]}})
    assert pinned.tune_stage().size == 2 * 1 * 3 * 1
    assert pinned.tune_key({"variant": "standard", "depth": 2, "seed": 1}) == json.dumps(["standard", [["depth", 1]]])


def add(study, params: dict, value: float | None, diverged: bool = False, **attrs) -> None:
    """A COMPLETE tuning trial of ``params`` whose best_val_acc is ``value`` (``attrs``: more of its summary)."""
    dists = {k: optuna.distributions.CategoricalDistribution([v]) for k, v in params.items()}
    study.add_trial(create_trial(params=params, distributions=dists, value=value or 0.0, state=TrialState.COMPLETE,
                                 user_attrs={"best_val_acc": value, "diverged": diverged} | attrs))


def test_the_lr_with_the_highest_mean_validation_accuracy_is_chosen(tmp_path):
    """Hand-computed: per (variant, depth) the mean over the two tuning seeds; a diverged run counts as 0; a tie
    goes to the rate listed first."""
    spec = spec_with(tmp_path, {"lr": [1e-3, 4e-3]}, axes={"depth": [1], "seed": [0]})
    study = optuna.create_study()
    acc = {("standard", 1e-3): (0.80, 0.84, 0.82), ("standard", 4e-3): (0.90, 0.70, 0.80),  # 0.82 vs 0.80 -> 1e-3
           ("rezero", 1e-3): (0.60, 0.62, 0.61), ("rezero", 4e-3): (0.99, None, 0.0)}  # diverged on 101: 0.33
    for (variant, lr), values in acc.items():
        for seed, value in zip(SEEDS, values, strict=True):
            add(study, {"variant": variant, "depth": 1, "seed": seed, "lr": lr}, value, diverged=value is None)
    choice, means = choose_lrs(spec, study)
    standard, rezero = (json.dumps([v, [["depth", 1]]]) for v in ("standard", "rezero"))
    assert choice == {standard: 1e-3, rezero: 1e-3}
    assert means[standard] == pytest.approx({"0.001": 0.82, "0.004": 0.80})
    assert means[rezero] == pytest.approx({"0.001": 0.61, "0.004": 0.33})
    tie = optuna.create_study()
    for variant in ("standard", "rezero"):
        for lr in (1e-3, 4e-3):
            for seed in SEEDS:
                add(tie, {"variant": variant, "depth": 1, "seed": seed, "lr": lr}, 0.5)
    assert set(choose_lrs(spec, tie)[0].values()) == {1e-3}
    incomplete = optuna.create_study()
    add(incomplete, {"variant": "standard", "depth": 1, "seed": 100, "lr": 1e-3}, 0.5)
    with pytest.raises(ValueError, match="tuning stage incomplete: standard depth=1: no result at lr"):
        choose_lrs(spec, incomplete)
    # every rate has a result, one of them on 2 of the 3 seeds (the third still training in another worker): its
    # mean would decide alone on those two seeds (0.95 > 0.82 here), so no choice is made
    partial = optuna.create_study()
    for (variant, lr), values in acc.items():
        for seed, value in zip(SEEDS, values, strict=True):
            if (variant, lr, seed) != ("standard", 4e-3, 101):
                add(partial, {"variant": variant, "depth": 1, "seed": seed, "lr": lr}, value, diverged=value is None)
    with pytest.raises(ValueError, match=re.escape("tuning stage incomplete: standard depth=1: not every tuning seed "
                                                   "has a result at lr 0.004 (2 of 3)")):
        choose_lrs(spec, partial)


def test_a_best_rate_at_the_grid_edge_extends_the_grid_until_it_is_inside(tmp_path):
    """Extending is unavoidable here: the best rate is the grid's top (4e-3) and the bounds allow 8e-3, so the stage
    must add 8e-3 (never record the cell as "at a bound"); once 8e-3 has trained and is worse, the choice stays at
    4e-3, strictly inside the rates tried, and nothing more is added. The other cell's best is inside: no rate."""
    spec = spec_with(tmp_path, {"lr": [1e-3, 2e-3, 4e-3], "bounds": [1e-4, 3.2e-2]},
                     axes={"depth": [1], "seed": [0]})
    study = optuna.create_study()
    climbing = {1e-3: 0.80, 2e-3: 0.85, 4e-3: 0.90}
    inside = {1e-3: 0.80, 2e-3: 0.90, 4e-3: 0.85}
    for variant, values in (("standard", climbing), ("rezero", inside)):
        for lr, value in values.items():
            for seed in SEEDS:
                add(study, {"variant": variant, "depth": 1, "seed": seed, "lr": lr}, value)
    standard, rezero = (json.dumps([v, [["depth", 1]]]) for v in ("standard", "rezero"))
    outcome = tune_outcome(spec, study)
    assert outcome.extend == {standard: 8e-3} and outcome.at_bound == {}
    assert outcome.choice == {standard: 4e-3, rezero: 2e-3}
    for seed in SEEDS:
        add(study, {"variant": "standard", "depth": 1, "seed": seed, "lr": 8e-3}, 0.70)
    after = tune_outcome(spec, study, {standard: [8e-3]})
    assert after.extend == {} and after.at_bound == {} and after.choice[standard] == 4e-3
    assert after.means[standard] == pytest.approx({"0.001": 0.80, "0.002": 0.85, "0.004": 0.90, "0.008": 0.70})


def test_the_choice_waits_for_the_tuning_points_other_workers_are_training(tmp_path):
    """``await_other_workers``: while a point of the stage is RUNNING in another worker it waits (and returns once
    that trial is told), so the choice reads it; a point WAITING again (a dead worker's trial, retried) is this
    worker's to train (False at once)."""
    import threading
    import time

    from ablations.run.workers import await_other_workers
    from ablations.studies.storage import open_storage

    stage = spec_with(tmp_path, {"lr": [1e-3]}, axes={"depth": [1], "seed": [0]}).tune_stage()
    storage = open_storage(url_of(tmp_path / "await.db"))
    study = optuna.create_study(storage=storage, study_name=stage.study_name)
    points = stage.grid()
    for params in points[1:]:  # done by the workers (the points they were enqueued with)
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.5, system_attrs={"fixed_params": params}))
    study.enqueue_trial(points[0])
    elsewhere = study.ask()  # the other worker's trial of the last point
    assert elsewhere.params == {} and study.trials[-1].state == TrialState.RUNNING

    def finish() -> None:
        time.sleep(0.5)
        study.tell(elsewhere, 0.5)  # its point is the one it was enqueued with (fixed_params)

    other = threading.Thread(target=finish)
    started = time.monotonic()
    other.start()
    assert await_other_workers(stage, storage, stage.study_name, poll_s=0.05) is True
    other.join()
    assert time.monotonic() - started >= 0.5 and study.trials[-1].state == TrialState.COMPLETE
    study.enqueue_trial(points[0] | {"seed": 999})  # a retried point waiting to be taken
    assert await_other_workers(stage, storage, stage.study_name, poll_s=0.05) is False


def test_a_changed_tuning_grid_is_refused_before_anything_runs(tmp_path):
    """A study continued later reuses its stored choice; a study file whose tune section changed would mix two
    choices in one table: refused loudly, nothing trained."""
    path = write_study(tmp_path / "tuned.yaml", variants=VARIANTS,
                       tune={"lr": [1e-3, 4e-3], "seeds": SEEDS, "bounds": [1e-3, 4e-3]}, axes={"seed": [0]})
    db = tmp_path / "o.db"
    study = optuna.create_study(study_name="tuned", storage=url_of(db))
    study.set_user_attr(TUNE_GRID, {"lr": [0.01], "seeds": [100], "metric": "best_val_acc", "axes": {}})
    result = run_in_process("--study", str(path), "--storage", url_of(db), "--results-dir", "results", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "chose its learning rates with the tuning grid" in line and "--study-name NEW_NAME" in line
    assert [s.study_name for s in optuna.get_all_study_summaries(url_of(db))] == ["tuned"]
    assert not (tmp_path / "results" / "runs").exists()


def test_the_grid_extends_at_an_edge_one_rate_at_a_time_and_stops_at_a_bound(tmp_path):
    """While a cell's best mean is at the largest (smallest) rate it tried, the next rate is x2 (/2) — until that
    would leave the declared bounds, where the cell is recorded as at its bound. Hand-made results: standard's
    accuracy rises with the rate (1e-3 -> 2e-3 -> 4e-3, bound 4e-3), rezero's falls (1e-3 -> 5e-4, bound 5e-4)."""
    spec = spec_with(tmp_path, {"lr": [1e-3, 2e-3], "bounds": [5e-4, 4e-3]}, axes={"depth": [1], "seed": [0]})
    standard, rezero = (json.dumps([v, [["depth", 1]]]) for v in ("standard", "rezero"))
    study = optuna.create_study()
    accuracy = {"standard": {5e-4: 0.5, 1e-3: 0.6, 2e-3: 0.7, 4e-3: 0.8},
                "rezero": {5e-4: 0.9, 1e-3: 0.8, 2e-3: 0.7, 4e-3: 0.6}}

    def train(variant, lr):
        for seed in SEEDS:
            add(study, {"variant": variant, "depth": 1, "seed": seed, "lr": lr}, accuracy[variant][lr] + seed / 1e4,
                final_val_acc=accuracy[variant][lr] + seed / 1e4)

    for variant in ("standard", "rezero"):
        for lr in (1e-3, 2e-3):
            train(variant, lr)
    first = tune_outcome(spec, study)
    assert first.extend == {standard: 4e-3, rezero: 5e-4} and first.at_bound == {}
    extra = {standard: [4e-3], rezero: [5e-4]}
    with pytest.raises(ValueError, match="tuning stage incomplete: standard depth=1: no result at lr 0.004"):
        tune_outcome(spec, study, extra)  # the added rate has to train on every tuning seed first
    train("standard", 4e-3)
    train("rezero", 5e-4)
    done = tune_outcome(spec, study, extra)
    assert done.choice == {standard: 4e-3, rezero: 5e-4}
    assert done.extend == {} and done.at_bound == {standard: "high", rezero: "low"}  # 8e-3 and 2.5e-4 are outside
    # inside the range tried: no extension, no bound
    assert spec.tune.beyond([1e-3, 2e-3, 4e-3], 2e-3) == (None, None)
    assert spec.tune.beyond([1e-3, 2e-3], 2e-3) == (4e-3, None)
    assert spec.tune.beyond([1e-3, 2e-3], 1e-3) == (5e-4, None)


def test_the_rate_is_chosen_on_validation_even_where_test_accuracy_ranks_the_rates_the_other_way(tmp_path):
    """A tuning stage that read the test split would pick 4e-3 here (test 0.95 vs 0.70); validation picks 1e-3."""
    spec = spec_with(tmp_path, {"lr": [1e-3, 4e-3], "metric": "final_val_acc"}, axes={"depth": [1], "seed": [0]})
    study = optuna.create_study()
    for variant in ("standard", "rezero"):
        for seed in SEEDS:
            add(study, {"variant": variant, "depth": 1, "seed": seed, "lr": 1e-3}, 0.80, final_val_acc=0.80,
                test_acc=0.70, test_acc_at_best_val=0.70)
            add(study, {"variant": variant, "depth": 1, "seed": seed, "lr": 4e-3}, 0.60, final_val_acc=0.60,
                test_acc=0.95, test_acc_at_best_val=0.95)
    assert set(tune_outcome(spec, study).choice.values()) == {1e-3}


def test_a_run_below_the_floor_counts_as_0_in_the_choice(tmp_path):
    """With ``floor: {metric: final_val_acc, chance_multiple: 5}`` (10 classes: 50 %), a tuning run that ends at 45 %
    failed to train and counts as 0, like a diverged one: 4e-3's mean (0.9, 0.9, 0.45 -> 0.6) loses to 1e-3's 0.7."""
    spec = spec_with(tmp_path, {"lr": [1e-3, 4e-3], "metric": "final_val_acc"}, axes={"depth": [1], "seed": [0]},
                     floor={"metric": "final_val_acc", "chance_multiple": 5})
    study = optuna.create_study()
    for variant in ("standard", "rezero"):
        for seed, high in zip(SEEDS, (0.9, 0.9, 0.45), strict=True):
            add(study, {"variant": variant, "depth": 1, "seed": seed, "lr": 1e-3}, 0.7, final_val_acc=0.7,
                num_classes=10)
            add(study, {"variant": variant, "depth": 1, "seed": seed, "lr": 4e-3}, high, final_val_acc=high,
                num_classes=10)
    outcome = tune_outcome(spec, study)
    assert set(outcome.choice.values()) == {1e-3}
    assert outcome.means[json.dumps(["standard", [["depth", 1]]])] == pytest.approx({"0.001": 0.7, "0.004": 0.6})


@pytest.mark.parametrize(("floor", "fault"), [
    ({"metric": "test_acc"}, "floor: metric 'test_acc' is not valid; valid choices: final_val_acc, best_val_acc"),
    ({"chance_multiple": 0.5}, "chance_multiple must be a number >= 1"),
    ({"level": 2}, "unknown key 'level'; valid keys: metric, chance_multiple"),
])
def test_a_bad_floor_is_a_one_line_error(tmp_path, floor, fault):
    with pytest.raises(ValueError, match=re.escape(fault)) as exc:
        spec_with(tmp_path, {"lr": [1e-3]}, floor=floor)
    assert "\n" not in str(exc.value)


def test_every_study_file_tunes_on_3_seeds_within_declared_bounds_and_declares_a_floor():
    """Protocol v2 in every study file: the evidence budgets tune on >= 3 seeds never reported, with bounds the
    grid may extend to; the first looks (smoke, quick) may tune once on fewer, without extending."""
    for name in available_studies():
        default = load_spec(name)
        for budget in default.budgets:
            spec = load_spec(name, budget)
            if spec.tune is None:
                continue
            if budget in ("smoke", "quick"):
                assert spec.tune.bounds is None, (name, budget)
                continue
            assert len(spec.tune.seeds) >= MIN_TUNE_SEEDS and spec.tune.bounds is not None, (name, budget)
            assert spec.tune.bounds[0] <= min(spec.tune.lr) and max(spec.tune.lr) <= spec.tune.bounds[1]
            assert not set(spec.tune.seeds) & set(spec.axes.get("seed", []))
        assert default.floor is not None, name


@pytest.mark.slow
def test_a_study_extends_its_tuning_grid_until_each_best_rate_is_inside_or_at_a_bound(tmp_path):
    """End to end, tiny real trainings: whatever the runs say, every cell ends with its best rate strictly inside the
    rates it tried or at a declared bound (recorded), every added rate trained on every tuning seed, the stored
    choice equals the highest mean validation accuracy recomputed here from the trials themselves (not by the
    stage's function), and the reported runs trained at it."""
    path = write_study(tmp_path / "ext.yaml", variants=VARIANTS, axes={"seed": [0]}, tune=EXTENDING)
    db = tmp_path / "o.db"
    result = run_in_process("--study", str(path), "--storage", url_of(db), "--results-dir", "results",
                            "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    check_one_choice_from_every_tuning_run(db, "ext", ("standard", "rezero"))
    at_bound = optuna.load_study(study_name="ext", storage=url_of(db)).user_attrs["tune_at_bound"]
    assert "best learning rate at the edge of the rates tried; adding" in result.stderr or at_bound


@pytest.mark.slow  # two CLI processes side by side: imports and tiny trainings (~1 min on 2 cores)
def test_two_independent_workers_choose_once_from_every_tuning_run(tmp_path):
    """Two ``ablations.run`` processes on one storage, each ``--workers 1`` (two machines on one PostgreSQL work
    alike): the one that runs out of tuning points first waits for the other's last runs before choosing (a mean
    over fewer seeds would choose another rate, and its reported runs would train at it). Both print the same
    rates; the stored choice is the one every tuning seed says; every reported run, whoever trained it, used it."""
    # runs of about a second each, one at a time (plain): the last tuning runs of the two overlap
    path = write_study(tmp_path / "pair.yaml", variants=THREE_VARIANTS, axes={"seed": [0, 1]}, tune=EXTENDING,
                       base={"max_epochs": 4, "dataset_options": {"num_samples": 512, "img_size": 8}})
    db = tmp_path / "o.db"
    args = ("--study", str(path), "--storage", url_of(db), "--results-dir", "results", "--no-progress",
            "--workers", "1", "--threads", "1", "--engine", "plain", *LIVE_WORKERS)
    results = run_cli_many({"first": args, "second": args}, cwd=tmp_path)
    lines = []
    for result in results.values():
        assert result.returncode == 0, result.stderr
        lines += [line for line in result.stderr.splitlines() if "learning rate per variant, chosen" in line]
    assert len(lines) == 2 and lines[0] == lines[1], lines
    check_one_choice_from_every_tuning_run(db, "pair", ("standard", "rezero", "skipinit"))


#: a tuning grid of two rates inside bounds one step beyond it: cells whose best rate is at an edge extend once
EXTENDING = {"lr": [1e-3, 2e-3], "seeds": SEEDS, "bounds": [1e-3, 4e-3], "metric": "final_val_acc"}


def check_one_choice_from_every_tuning_run(db, name: str, variants) -> None:
    """The stored choice of study ``name`` is, per variant, the rate of highest mean over every tuning seed
    (recomputed here from the trials, not by the stage's function), each rate tried on every tuning seed, a best
    rate at the edge of those tried recorded at its bound, and every reported run trained at the choice."""
    from ablations.studies.spec import TUNE_AT_BOUND, TUNE_EXTRA, TUNED_LR

    study = optuna.load_study(study_name=name, storage=url_of(db))
    tune = optuna.load_study(study_name=f"{name}-tune", storage=url_of(db))
    chosen, at_bound = study.user_attrs[TUNED_LR], study.user_attrs[TUNE_AT_BOUND]
    extra = study.user_attrs[TUNE_EXTRA]
    assert extra == tune.user_attrs.get(TUNE_EXTRA, {})
    values: dict = {}
    for t in tune.get_trials(states=(TrialState.COMPLETE,)):
        if "duplicate_of" not in t.user_attrs:
            values.setdefault(t.params["variant"], {}).setdefault(t.params["lr"], []).append(
                t.user_attrs["final_val_acc"])
    for variant in variants:
        key = json.dumps([variant, []])
        means = {lr: sum(v) / len(v) for lr, v in values[variant].items()}
        assert all(len(v) == len(SEEDS) for v in values[variant].values())
        assert set(means) == {1e-3, 2e-3, *extra.get(key, [])} and all(1e-3 <= lr <= 4e-3 for lr in means)
        best = max(means.values())
        assert means[chosen[key]] == best
        if chosen[key] in (min(means), max(means)):
            assert at_bound[key] == ("low" if chosen[key] == min(means) else "high"), (variant, means)
        reported = [t for t in study.get_trials(states=(TrialState.COMPLETE,)) if t.params["variant"] == variant]
        assert reported and all(t.user_attrs["config"]["lr"] == chosen[key] for t in reported)


# --- parameter-matched controls ----------------------------------------------------------------------------------
def param_count(config) -> int:
    from data import dataset_shape
    from lit_modules import VisionTransformer

    model = VisionTransformer(config.model_config(dataset_shape(config)))  # every backbone field the run trains
    return sum(p.numel() for p in model.parameters())


PROTOCOL_STUDIES = [name for name in available_studies() if load_spec(name).tune is not None]
#: every evidence budget a study under the protocol defines; the GPU sizes build wider and deeper models (slow tier)
EVIDENCE_BUDGETS = [pytest.param(name, budget, marks=[pytest.mark.slow] if budget != "default" else [])
                    for name in PROTOCOL_STUDIES for budget in ("default", "gpu", "paper")
                    if budget in load_spec(name).budgets]


@pytest.mark.parametrize("name, budget", EVIDENCE_BUDGETS)
def test_a_variant_with_5_percent_more_parameters_has_a_matched_standard_row(name, budget):
    """The fair protocol's control: in a study under it (one with a tuning stage), at every evidence budget, every
    variant that adds >= 5% parameters over standard (same depth) has a row ``standard_params_matched_<label>``
    (standard, wider MLP) whose parameter count is within 1% of the variant's (or ``<row>_params_matched_<label>``:
    e.g. the same residual made deeper, where the extra parameters are whole blocks). A control's width is resolved
    at each point (``params_of``), so it stays matched where the GPU budgets change the depth or the width."""
    spec = load_spec(name, budget)
    labels = [v.label for v in spec.variants]
    for depth in spec.axes.get("depth", [None]):
        point = {"seed": spec.axes.get("seed", [0])[0]} | ({"depth": depth} if depth is not None else {})
        counts = {label: param_count(spec.run_config({"variant": label} | point)) for label in labels}
        for label in labels:
            if label == "standard" or "_params_matched_" in label or counts[label] < 1.05 * counts["standard"]:
                continue
            controls = [c for c in labels if "_params_matched_" in c and abs(counts[c] / counts[label] - 1) <= 0.01]
            assert controls, f"{name} ({budget}): {label} has {counts[label] / counts['standard'] - 1:+.1%} " \
                             f"parameters at depth {depth} but no row standard_params_matched_{label} within 1% of it"
