"""Tests of the Optuna study runner ``python -m ablations.run`` (ablations/run/: cli, study, workers, plan, objective, spec, storage).

Real components throughout, no mocks: the CLI runs in a subprocess with the test's tmp folder as its working
directory, storages are SQLite files in tmp folders, trials train tiny ViTs (width 8, one block) on the synthetic
dataset. Importing torch + Lightning dominates each CLI call (seconds even on a quiet machine), so tests share
runs where they can: one tiny study (module fixture) serves the ``--study PATH``, dashboard and keep-results tests,
and the invocations that train nothing (``--list``, ``--dry-run``, bad input) run in one fixture. A check that is
not about the process (the search study, the refused invocations, most bad input) calls ``ablations.run.main`` in
this process instead (``helpers.run_in_process``).
Every CLI process starts with start_new_session (its own process group); a test that fails or times out kills the whole process group.
"""

from __future__ import annotations

import dataclasses
import shutil
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from helpers import (
    LONG_TRIAL_EPOCHS,
    STUDY_TEST_MARKS,
    TWO_VARIANTS,
    assert_grid_complete_once,
    assert_one_line_error,
    assert_resumed_from,
    check_bad_checkpoints_restart_their_trials,
    check_killed_trial_is_retried_and_resumes,
    check_two_workers_complete_each_point_once,
    kill_9_when,
    mid_run_checkpoint,
    run_cli,
    run_cli_many,
    run_dir_name,
    run_in_process,
    saved_checkpoint,
    signal_mid_trial,
    snapshot,
    trial_states,
    trials_of,
    url_of,
    write_study,
)
from optuna.trial import TrialState
from pg import free_port
from polling import get_json, serving, wait_until_answers

from ablations.run.objective import suggest
from ablations.studies.spec import BUDGETS, available_studies, load_spec
from ablations.studies.storage import open_storage, set_user_attrs

pytestmark = STUDY_TEST_MARKS

SUMMARY_ATTRS = ("best_val_acc", "final_val_acc", "diverged", "param_count", "wall_time_s", "epochs_completed")
DONE = (TrialState.COMPLETE, TrialState.PRUNED)


# --- the committed study files -------------------------------------------------------------------------------------
def test_every_committed_study_point_has_valid_residual_options():
    """Every grid point of every committed study and budget, and every combination of a search space's categorical
    choices, passes the residual's validation: no study runs an option its form ignores (the same model under two
    labels) or a value its model size does not allow."""
    import itertools

    from ablations.run.study import check_residual, validate_points

    for name in available_studies():
        for budget in load_spec(name).budgets:
            spec = load_spec(name, budget)
            validate_points(spec, {}, check_data=False)
            for label, space in spec.space.items():
                keys = [f"{label}.{option}" for option, dist in space.items() if "choices" in dist]
                for values in itertools.product(*(space[k.split(".", 1)[1]]["choices"] for k in keys)):
                    check_residual(spec.run_config({"variant": label, **dict(zip(keys, values, strict=True))}))


# --- shared runs -------------------------------------------------------------------------------------------------
#: The base of the shared tiny study: precision ``auto`` (not TINY_BASE's fixed fp32), so that one CLI study of the
#: fast tier measures this machine's modes before its trials and trains in the mode chosen.
AUTO = {"precision": "auto"}


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    """A 2-point grid from a study file given by path, run once to completion."""
    root = tmp_path_factory.mktemp("tiny")
    write_study(root / "tiny.yaml", base=AUTO)
    db = root / "optuna.db"
    result = run_cli("--study", "tiny.yaml", "--storage", url_of(db), "--results-dir", "results", "--no-progress",
                     cwd=root)
    return SimpleNamespace(root=root, db=db, name="tiny", spec=load_spec(str(root / "tiny.yaml")), result=result)


#: The quick cases that run as real CLI processes (side by side); the others call ``main`` in this process.
QUICK_SUBPROCESS = ("bad_yaml", "unreachable_storage")


@pytest.fixture(scope="module")
def quick_calls(tmp_path_factory):
    """The CLI calls that train nothing (--list, --dry-run, bad input); each case has its own SQLite path so a test
    can check that no storage was created. Two run as real CLI processes side by side (``QUICK_SUBPROCESS``), the
    rest in this process."""
    root = tmp_path_factory.mktemp("quick")
    (root / "bad_yaml.yaml").write_text("name: bad\nkind: grid\nvariants: [\n  - {label: a\n")
    write_study(root / "unknown_key.yaml", colour="blue")
    write_study(root / "unknown_variant_key.yaml", variants=[{"label": "a", "residual": "standard", "option": {}}])
    write_study(root / "unknown_base_key.yaml", base={"embed_dims": 8})
    write_study(root / "unknown_option.yaml",
                variants=[{"label": "ls", "residual": "layerscale", "options": {"bogus_opt": 1}}])
    write_study(root / "unknown_pruner_option.yaml", kind="search",
                search={"n_trials": 2, "pruner": {"type": "median", "n_startup": 1}})
    write_study(root / "tiny.yaml")

    def case(name, *args):
        return name, (*args, "--storage", url_of(root / f"{name}.db"))

    calls = dict([
        ("list", ("--list",)),
        case("dry_run", "--study", "residual_variants", "--budget", "smoke", "--dry-run"),
        case("unknown_study", "--study", "no_such_study"),
        case("missing_study_file", "--study", "missing.yaml"),
        case("bad_yaml", "--study", "bad_yaml.yaml"),
        case("unknown_key", "--study", "unknown_key.yaml"),
        case("unknown_variant_key", "--study", "unknown_variant_key.yaml"),
        case("unknown_base_key", "--study", "unknown_base_key.yaml"),
        case("unknown_option", "--study", "unknown_option.yaml"),
        case("unknown_pruner_option", "--study", "unknown_pruner_option.yaml"),
        case("unknown_budget", "--study", "tiny.yaml", "--budget", "huge"),
        case("undefined_budget", "--study", "tiny.yaml", "--budget", "quick"),
        case("measure_without_dry_run", "--study", "tiny.yaml", "--measure"),
        ("unreachable_storage", ("--study", "tiny.yaml", "--storage", "postgresql://nobody@127.0.0.1:1/none")),
        ("missing_sqlite_folder", ("--study", "tiny.yaml", "--storage", url_of(root / "no_such_dir" / "o.db"))),
    ])
    results = run_cli_many({k: v for k, v in calls.items() if k in QUICK_SUBPROCESS}, cwd=root)
    results |= {k: run_in_process(*v, cwd=root) for k, v in calls.items() if k not in QUICK_SUBPROCESS}
    return SimpleNamespace(root=root, results=results)


# --- 1. the issue's end-to-end run -------------------------------------------------------------------------------
@pytest.mark.slow
def test_smoke_study_completes_every_grid_point_once_and_rerun_adds_nothing(tmp_path):
    db = tmp_path / "o.db"
    args = ("--study", "residual_variants", "--budget", "smoke", "--storage", url_of(db), "--results-dir", "results")
    spec = load_spec("residual_variants", "smoke")

    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "Traceback" not in first.stderr
    assert ("Budget 'smoke' is a first look, underpowered by design: its numbers and verdicts are not evidence (the "
            "default budget is the study's evidence) (study 'residual_variants-smoke')") in first.stderr.splitlines()
    complete = assert_grid_complete_once(db, spec)
    trials = trials_of(db, spec.study_name)
    assert len(trials) == len(spec.grid()) == 10
    # the tuning stage ran first, on its own seeds, and each reported point trained at its variant's chosen lr
    tune = spec.tune_stage()
    tuned = assert_grid_complete_once(db, tune)
    assert {t.params["seed"] for t in tuned.values()} == {100} and {t.user_attrs["phase"] for t in tuned.values()} \
        == {"tune"}
    stored = optuna.load_study(study_name=spec.study_name, storage=url_of(db)).user_attrs
    chosen = stored["tuned_lr"]
    for t in complete.values():
        attrs = t.user_attrs
        assert attrs["phase"] == "report" and attrs["config"]["lr"] == chosen[spec.tune_key(t.params)]
        means = {float(lr): m for lr, m in stored["tune_means"][spec.tune_key(t.params)].items()}
        assert means[attrs["config"]["lr"]] == max(means.values())
        assert all(key in attrs for key in SUMMARY_ATTRS), sorted(attrs)
        assert t.value == pytest.approx(attrs["test_acc"])
        assert attrs["test_acc_at_best_val"] is not None and len(attrs["test_acc_curve"]) == 1
        assert 0.0 <= attrs["final_val_acc"] <= 1.0 and attrs["diverged"] is False
        assert attrs["param_count"] > 0 and attrs["wall_time_s"] > 0 and attrs["epochs_completed"] == 1
        log_dir = tmp_path / attrs["log_dir"]
        assert log_dir.is_dir() and list(log_dir.glob("events.out.tfevents.*"))
        name = f"{t.params['variant']}/depth={t.params['depth']}/seed={t.params['seed']}"  # what the run is
        assert attrs["run_name"] == name and attrs["log_dir"].endswith(name)
        assert not (log_dir / "checkpoints").exists()
        expected = spec.config_for(t.params)
        keys = ("residual", "depth", "seed", "embed_dim", "max_epochs", "dataset", "mlp_ratio")
        assert {k: attrs["config"][k] for k in keys} == {k: expected.get(k, attrs["config"][k]) for k in keys}
        assert attrs["resumed_from_checkpoint"] is False and "retry_of" not in attrs

    second = run_cli(*args, cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert snapshot(trials_of(db, spec.study_name)) == snapshot(trials)


# --- study files by path -----------------------------------------------------------------------------------------
def test_study_file_given_by_path_runs_as_its_own_study(tiny_study):
    assert tiny_study.result.returncode == 0, tiny_study.result.stderr
    assert "study 'tiny' (grid: 2 trials)" in tiny_study.result.stderr
    measured = tiny_study.result.stderr.find("measured the four modes here")
    if measured >= 0:  # precision auto measured this CPU first: said before it starts, as a step of its own
        assert 0 <= tiny_study.result.stderr.find("timing the four precision modes on this CPU") < measured
    assert assert_grid_complete_once(tiny_study.db, tiny_study.spec)
    study = optuna.load_study(study_name="tiny", storage=url_of(tiny_study.db))
    assert study.metric_names == ["best_val_acc"]
    assert study.user_attrs["spec_source"] == "tiny.yaml" and study.user_attrs["kind"] == "grid"
    for t in study.trials:
        assert t.user_attrs["config"]["dataset"] == "synthetic" and t.user_attrs["config"]["embed_dim"] == 8
        assert (tiny_study.root / t.user_attrs["log_dir"]).is_dir()


# --- 2. a killed worker's trial is retried and resumes -------------------------------------------------------------
@pytest.mark.slow
def test_killed_trial_is_retried_with_same_params_and_resumes_its_epochs(tmp_path):
    check_killed_trial_is_retried_and_resumes(tmp_path, tmp_path / "o.db")


# --- 3. corrupt and stale checkpoints ------------------------------------------------------------------------------
@pytest.mark.slow
def test_corrupt_or_missing_checkpoint_of_a_dead_trial_restarts_it_and_stale_checkpoints_are_not_resumed(tmp_path):
    check_bad_checkpoints_restart_their_trials(tmp_path, tmp_path / "o.db")


@pytest.mark.slow
def test_a_dead_trial_that_began_in_an_earlier_form_restarts_instead_of_resuming(tmp_path):
    """A worker died mid-trial; since then a default of the trial's design changed (its stored ``form`` differs from
    the one this version builds). Its retry does not resume the checkpoint (weights of the other form) but trains
    from scratch, says why, and records today's form. The checkpoint is a loadable stand-in: resuming it would
    fail the trial."""
    import json

    import torch

    from ablations.run.objective import form_of

    write_study(tmp_path / "formed.yaml", base={"max_epochs": 1}, variants=TWO_VARIANTS[1:2])
    spec = load_spec(str(tmp_path / "formed.yaml"))
    (point,) = spec.grid()
    today = form_of(spec.run_config(point))
    earlier = json.dumps(today | {"residual": {**today["residual"], "options": {"nope": 1}}})
    rdb = open_storage(url_of(tmp_path / "o.db"), heartbeat_s=1, grace_s=2)
    study = optuna.create_study(storage=rdb, study_name=spec.study_name, direction=spec.direction)
    study.enqueue_trial(point, skip_if_exists=True)
    dead = study.ask()
    suggest(dead, spec)
    set_user_attrs(dead, {"form": earlier})
    rdb.record_heartbeat(dead._trial_id)  # the worker was alive once, then died
    ckpt = tmp_path / "results" / "runs" / "formed" / run_dir_name(spec, TWO_VARIANTS[1]["label"]) / "checkpoints"
    ckpt.mkdir(parents=True)
    torch.save({"state_dict": {}, "epoch": 0}, ckpt / "last.ckpt")
    time.sleep(3)  # > grace

    result = run_cli("--study", "formed.yaml", "--storage", url_of(tmp_path / "o.db"), "--results-dir", "results",
                     "--heartbeat", "1", "--grace", "2", "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "trial 0 began in an earlier form of its design" in result.stderr
    assert [t.state for t in trials_of(tmp_path / "o.db", "formed")] == [TrialState.FAIL, TrialState.COMPLETE]
    retry = trials_of(tmp_path / "o.db", "formed")[1]
    assert retry.user_attrs["retry_of"] == 0 and retry.user_attrs["resume_checkpoint"] is None
    assert retry.user_attrs["resumed_from_checkpoint"] is False and retry.user_attrs["start_epoch"] == 0
    assert json.loads(retry.user_attrs["form"]) == today


def test_a_continued_study_says_which_of_its_done_trials_were_built_in_an_earlier_form(tmp_path):
    """Both points of a study are done, one of them by a trial that recorded another form than this version builds
    for the config it trained (a default changed since). Continuing the study trains nothing and says so in one
    line naming the variant; a trial that recorded no form (stored before the column) is not counted."""
    import json
    import sqlite3

    from optuna.trial import FixedTrial, create_trial

    from ablations.run.objective import form_of, jsonable

    write_study(tmp_path / "formed.yaml", base={"max_epochs": 1}, variants=TWO_VARIANTS[:2])
    spec = load_spec(str(tmp_path / "formed.yaml"))
    study = optuna.create_study(storage=url_of(tmp_path / "o.db"), study_name=spec.study_name,
                                direction=spec.direction)
    for point in spec.grid():
        config = spec.run_config(point)
        today = form_of(config)
        form = json.dumps(today | {"residual": {**today["residual"], "options": {"init_value": 0.5}}}) \
            if point["variant"] == TWO_VARIANTS[1]["label"] else json.dumps(today)
        fixed = FixedTrial(point)
        suggest(fixed, spec)
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.5, params=fixed.params,
                                     distributions=fixed.distributions, system_attrs={"fixed_params": point},
                                     user_attrs={"config": jsonable(config.to_dict()), "form": form}))
    args = ("--study", "formed.yaml", "--storage", url_of(tmp_path / "o.db"), "--results-dir", "results",
            "--no-progress")
    result = run_in_process(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "earlier form" in line]
    assert lines == [f"warning: study 'formed': 1 completed trial(s) were built in an earlier form of their design (a "
                     f"default has changed since): {TWO_VARIANTS[1]['label']} 1; they stay done and the report notes "
                     "the rows that mix forms; to train them in today's form, continue a new study from its "
                     "runs.csv with --import-runs (rows of an earlier form train again)"]
    assert len(trials_of(tmp_path / "o.db", "formed")) == 2  # nothing trained again

    with sqlite3.connect(tmp_path / "o.db") as db:  # the earlier trial as stored before the form column
        db.execute("DELETE FROM trial_user_attributes WHERE key = 'form'")
    result = run_in_process(*args, cwd=tmp_path)
    assert result.returncode == 0 and "earlier form" not in result.stderr, result.stderr


@pytest.mark.slow
def test_interrupted_run_exits_130_and_the_rerun_resumes_the_interrupted_trial(tmp_path):
    """Ctrl-C (SIGINT to the process group) during training: exit 130 with the CLI's message, the trial FAILs and
    keeps its checkpoint. A FAIL trial must not block its grid point for good (enqueue(skip_if_exists=True) counts
    it as existing, so every rerun would run nothing and exit 1): the rerun retries it and resumes its epochs."""
    max_epochs = LONG_TRIAL_EPOCHS
    write_study(tmp_path / "interrupted.yaml", variants=TWO_VARIANTS[:1], base={"max_epochs": max_epochs})
    spec = load_spec(str(tmp_path / "interrupted.yaml"))
    db = tmp_path / "o.db"
    args = ("--study", "interrupted.yaml", "--storage", url_of(db), "--results-dir", "results", "--no-progress")
    last_ckpt = tmp_path / "results" / "runs" / "interrupted" / run_dir_name(spec, "standard") / "checkpoints" / "last.ckpt"

    interrupted = signal_mid_trial(args, tmp_path, lambda: mid_run_checkpoint(last_ckpt, max_epochs), signal.SIGINT,
                                   "trial 0 wrote a checkpoint")
    assert interrupted.returncode == 130, interrupted.stderr
    assert interrupted.stderr.strip().splitlines()[-1].startswith("interrupted: completed trials are kept")
    assert [t.state for t in trials_of(db, "interrupted")] == [TrialState.FAIL]
    saved_after_interrupt = saved_checkpoint(last_ckpt)
    assert saved_after_interrupt is not None

    rerun = run_cli(*args, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert "retrying failed trial(s) 0" in rerun.stderr
    (retry,) = assert_grid_complete_once(db, spec).values()
    assert [t.state for t in trials_of(db, "interrupted")] == [TrialState.FAIL, TrialState.COMPLETE]
    assert retry.user_attrs["retry_of"] == 0
    assert_resumed_from(retry, saved_after_interrupt, max_epochs, tmp_path)
    assert not last_ckpt.parent.exists()


# --- 4. parallel workers -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_workers_complete_every_grid_point_exactly_once(tmp_path):
    check_two_workers_complete_each_point_once(tmp_path, tmp_path / "o.db")


def test_a_duplicate_grid_point_is_pruned_before_training_and_a_surplus_ask_too(tmp_path):
    """The duplicate-point check on an in-memory storage (test_workers.py proves it with real processes, in the slow
    tier): a grid enqueued twice, as two machines enqueueing it at the same instant leave it. A copy whose point
    an earlier trial is running, or a trial has completed, is pruned as ``duplicate_of`` it before anything trains
    (no run folder, no ``run_name``); the earlier of two running copies is the one that trains. A trial asked for
    once the grid is exhausted is pruned as ``surplus``."""
    from ablations.run.objective import Objective, suggest

    write_study(tmp_path / "dup.yaml")
    spec = load_spec(str(tmp_path / "dup.yaml"))
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(), study_name=spec.study_name,
                                direction=spec.direction)
    for _ in range(2):
        for params in spec.grid():
            study.enqueue_trial(params)
    objective = Objective(spec, log_root=tmp_path / "runs")
    trials = [study.ask() for _ in range(4)]  # 0, 1: the two points; 2, 3: their copies
    for trial in trials[:3]:
        suggest(trial, spec)  # taken by a worker: RUNNING with its point
    a, b = spec.grid()
    assert [t.params for t in trials[:3]] == [a, b, a]
    assert objective._duplicate_of(trials[0], a) is None  # the earlier running copy trains
    assert objective._duplicate_of(trials[2], a) == 0

    with pytest.raises(optuna.TrialPruned, match="already run by trial 0"):
        objective(trials[2])  # trial 0 (same point) is RUNNING
    study.tell(trials[2], state=TrialState.PRUNED)
    study.tell(trials[1], 0.5)
    with pytest.raises(optuna.TrialPruned, match="already run by trial 1"):
        objective(trials[3])  # trial 1 (same point) is COMPLETE
    study.tell(trials[3], state=TrialState.PRUNED)
    surplus = study.ask()  # nothing left in the queue
    with pytest.raises(optuna.TrialPruned, match="surplus"):
        objective(surplus)
    attrs = {t.number: t.user_attrs for t in study.get_trials(deepcopy=False)}
    assert attrs[2] == {"duplicate_of": 0} and attrs[3] == {"duplicate_of": 1} and attrs[4] == {"surplus": True}
    assert not (tmp_path / "runs").exists()  # nothing trained


# --- 5. search studies -------------------------------------------------------------------------------------------
def test_search_study_runs_its_trial_budget_and_prunes(tmp_path):
    """3 TPE trials under the median rule. rezero (avg pooling, lr 0.01) learns the synthetic task in one epoch;
    layerscale gets lr 1e-7 and stays near chance, so a layerscale trial after a rezero one is pruned at its first
    epoch (the seed-0 sampler draws rezero, rezero, layerscale)."""
    write_study(tmp_path / "search.yaml", kind="search", variants=[
        {"label": "layerscale", "residual": "layerscale", "overrides": {"lr": 1.0e-7}},
        {"label": "rezero", "residual": "rezero"}],
        base={"global_pool": "avg", "dataset_options": {"num_samples": 512, "img_size": 8}, "max_epochs": 2,
              "warmup_epochs": 0, "lr": 0.01},
        search={"n_trials": 3, "pruner": {"type": "median", "n_startup_trials": 1, "n_warmup_steps": 0},
                "space": {"layerscale": {"init_value": {"low": 1.0e-4, "high": 0.5, "log": True}},
                          "rezero": {"init_value": {"choices": [0.0, 0.1]}}}})
    db = tmp_path / "o.db"
    result = run_in_process("--study", "search.yaml", "--storage", url_of(db), "--results-dir", "results",
                            "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    trials = trials_of(db, "search")
    assert len(trials) == 3 and all(t.state in DONE for t in trials), [t.state for t in trials]
    assert TrialState.PRUNED in [t.state for t in trials], [(t.params, t.intermediate_values) for t in trials]
    for t in trials:
        label = t.params["variant"]
        (option,) = [k for k in t.params if k != "variant"]
        assert option == f"{label}.init_value"
        value = t.params[option]
        assert 1.0e-4 <= value <= 0.5 if label == "layerscale" else value in (0.0, 0.1)
        attrs = t.user_attrs  # pruned trials, too, keep the summary of the epochs they ran
        assert attrs["config"]["residual_options"] == {"init_value": value}
        epochs = attrs["epochs_completed"]
        assert sorted(t.intermediate_values) == list(range(epochs))
        assert epochs == 2 if t.state == TrialState.COMPLETE else 1 <= epochs < 2
        if t.state == TrialState.COMPLETE:
            assert t.value == pytest.approx(attrs["best_val_acc"])
        assert not (tmp_path / attrs["log_dir"] / "checkpoints").exists()  # pruned trials' checkpoints too


@pytest.mark.slow
def test_a_search_killed_mid_trial_retries_it_from_its_checkpoint_and_still_runs_its_trial_budget(tmp_path):
    """kill -9 of a TPE search's worker after trial 0's first checkpoint: the rerun fails the dead trial, retries
    its parameters from the checkpoint, and samples on until n_trials trials are done - the killed attempt, now
    replaced by its retry, does not use up a trial of the budget."""
    max_epochs = LONG_TRIAL_EPOCHS
    write_study(tmp_path / "search_kill.yaml", kind="search", variants=[{"label": "long", "residual": "layerscale"}],
                base={"max_epochs": max_epochs},
        search={"n_trials": 2, "pruner": {"type": "median", "n_startup_trials": 5, "n_warmup_steps": 0},
                "space": {"long": {"init_value": {"choices": [0.1, 0.2]}}}})
    db = tmp_path / "o.db"
    args = ("--study", "search_kill.yaml", "--storage", url_of(db), "--results-dir", "results", "--heartbeat", "1",
            "--grace", "2", "--no-progress")
    runs = tmp_path / "results" / "runs" / "search_kill"
    kill_9_when(args, tmp_path, lambda: _first_checkpoint(runs)
                and trial_states(db, "search_kill").get(0) == TrialState.RUNNING, "trial 0 wrote a checkpoint")
    saved = saved_checkpoint(_first_checkpoint(runs))
    killed = trials_of(db, "search_kill")[0]
    assert killed.state == TrialState.RUNNING and 1 <= len(killed.intermediate_values) < max_epochs
    time.sleep(3)  # > grace: the killed trial's heartbeat is stale now

    rerun = run_cli(*args, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    trials = trials_of(db, "search_kill")
    assert trials[0].state == TrialState.FAIL
    done = [t for t in trials if t.state in DONE]
    assert len(done) == 2 and len(trials) == 3, [(t.number, t.state) for t in trials]
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == 0]
    assert retry.state == TrialState.COMPLETE and retry.params == killed.params
    assert_resumed_from(retry, saved, max_epochs, tmp_path)


def _first_checkpoint(runs: Path) -> Path | None:
    found = sorted(runs.rglob("checkpoints/last.ckpt")) if runs.is_dir() else []  # <variant>/.../trial_NNNN/
    return found[0] if found and saved_checkpoint(found[0]) else None


# --- 6. optuna-dashboard -----------------------------------------------------------------------------------------
def test_optuna_dashboard_serves_the_study_with_its_metric_name(tiny_study, tmp_path):
    dashboard = Path(sys.executable).with_name("optuna-dashboard")
    port = free_port()
    base = f"http://127.0.0.1:{port}/api"
    with serving([dashboard, url_of(tiny_study.db), "--host", "127.0.0.1", "--port", str(port)],
                 tmp_path / "optuna-dashboard.log") as proc:  # up when it answers; its output if it exits first
        studies = wait_until_answers(f"{base}/studies", proc, what="optuna-dashboard's study list")["study_summaries"]
        (summary,) = [s for s in studies if s["study_name"] == "tiny"]
        assert summary["directions"] == ["maximize"]
        detail = get_json(f"{base}/studies/{summary['study_id']}", proc=proc)
        assert detail["objective_names"] == ["best_val_acc"]  # from study.set_metric_names
        assert [t["state"] for t in detail["trials"]] == ["Complete", "Complete"]


# --- 7. bad input ------------------------------------------------------------------------------------------------
BAD_INPUT = {
    "unknown_study": ("unknown study 'no_such_study'", *available_studies()),
    "missing_study_file": ("missing.yaml", "does not exist"),
    "bad_yaml": ("bad_yaml.yaml", "not valid YAML"),
    "unknown_key": ("unknown key 'colour'",),
    "unknown_variant_key": ("unknown key 'option'",),
    "unknown_base_key": ("unknown key 'embed_dims'",),
    "unknown_option": ("'bogus_opt'", "layerscale"),
    "unknown_pruner_option": ("unknown_pruner_option.yaml", "'n_startup'"),
    "unknown_budget": ("unknown budget 'huge'", *BUDGETS),
    "undefined_budget": ("study file 'tiny.yaml' defines no 'quick' budget; valid choices: default",),
    "measure_without_dry_run": ("--measure prices a study for --dry-run: give both",),
    "unreachable_storage": ("cannot reach storage 'postgresql://nobody@127.0.0.1:1/none'",),
    "missing_sqlite_folder": ("no_such_dir", "does not exist"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUT))
def test_bad_input_exits_2_with_one_line(quick_calls, case):
    assert_one_line_error(quick_calls.results[case], *BAD_INPUT[case])
    assert not list(quick_calls.root.rglob(f"{case}.db")) and not (quick_calls.root / "no_such_dir").exists()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_sqlite_file_transactions_take_the_write_lock_at_begin_and_memory_storage_still_works(tmp_path):
    """On a SQLite file every storage transaction starts with BEGIN IMMEDIATE: while one is open (here a read, as
    optuna's "is this trial still WAITING?" is), no other connection can begin one, so two processes cannot both
    claim the same trial. ``sqlite:///:memory:`` (one connection, nothing to share) is left as optuna makes it."""
    import sqlite3

    storage = open_storage(url_of(tmp_path / "lock.db"))
    optuna.create_study(storage=storage, study_name="lock")
    with storage.engine.connect() as conn, conn.begin():
        conn.exec_driver_sql("SELECT count(*) FROM trials").fetchall()
        other = sqlite3.connect(tmp_path / "lock.db", timeout=0, isolation_level=None)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
        other.close()
    in_memory = open_storage("sqlite:///:memory:", heartbeat_s=1)
    memory = optuna.create_study(storage=in_memory, study_name="m")
    # a trial outlasting the heartbeat: an in-memory database keeps none (its thread would find no tables there)
    memory.optimize(lambda t: time.sleep(1.5) or t.suggest_float("x", 0.0, 1.0), n_trials=2)
    assert [t.state for t in memory.trials] == [TrialState.COMPLETE] * 2
    assert in_memory.get_heartbeat_interval() is None


def test_a_trial_s_attrs_are_written_in_one_transaction_as_optuna_writes_them_one_by_one(tmp_path):
    """``set_user_attrs`` stores what ``Trial.set_user_attr`` per item stores (values, overwrites, the trial's own
    view), in one commit instead of one per attr; a finished trial refuses it as optuna refuses one attr, writing
    nothing; a storage without the one-transaction call (in memory) gets the attrs one by one."""
    import sqlalchemy

    storage = open_storage(url_of(tmp_path / "attrs.db"))
    study = optuna.create_study(storage=storage, study_name="attrs")
    attrs = {"phase": "tune", "config": {"lr": 0.004, "depth": 4}, "val_acc_curve": [0.5, 0.75, 0.875],
             "resume_checkpoint": None, "worker": "host:1"}
    one_by_one, batched = study.ask(), study.ask()
    for trial in (one_by_one, batched):
        trial.set_user_attr("worker", "earlier")  # overwritten below, as a retry's attr is
    for key, value in attrs.items():
        one_by_one.set_user_attr(key, value)
    commits = []

    def commit(connection) -> None:
        commits.append(connection)

    sqlalchemy.event.listen(storage.engine, "commit", commit)
    set_user_attrs(batched, attrs)
    sqlalchemy.event.remove(storage.engine, "commit", commit)
    assert len(commits) == 1
    stored = {t.number: t.user_attrs for t in study.get_trials()}
    assert stored[batched.number] == stored[one_by_one.number] == attrs
    assert batched.user_attrs == attrs  # the running trial's own view, as set_user_attr keeps it
    study.tell(batched, 1.0)
    with pytest.raises(RuntimeError, match="finished"):
        set_user_attrs(batched, {"phase": "report", "late": 1})
    assert study.get_trials()[batched.number].user_attrs == attrs

    memory = optuna.create_study(storage=open_storage("sqlite:///:memory:"))
    trial = memory.ask()
    set_user_attrs(trial, attrs)
    assert memory.get_trials()[0].user_attrs == attrs


def _open_when_all_are_ready(url: str, barrier, answers) -> None:
    barrier.wait()
    try:
        optuna.create_study(storage=open_storage(url), study_name="s", load_if_exists=True)
        answers.put("ok")
    except BaseException as exc:  # noqa: BLE001 - the answer is the test's
        answers.put(f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")


@pytest.mark.slow  # 60 forked processes (~15 s on 2 cores)
def test_processes_opening_one_new_sqlite_storage_at_once_all_open_it(tmp_path):
    """Workers started together on a storage that does not exist yet (two ``ablations.run`` on one results folder,
    a SLURM array) each create its tables: one that finds a table another has just made ("table ... already
    exists") or the schema version inserted opens it again. Ten rounds of six processes released at one barrier
    (before, about one round in five lost a process with "cannot reach storage ...: table studies already exists";
    on a loaded machine a process could meet a table another had just made on several attempts in a row)."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    for round_ in range(10):
        url = url_of(tmp_path / f"new{round_}.db")
        barrier, answers = context.Barrier(6), context.Queue()
        processes = [context.Process(target=_open_when_all_are_ready, args=(url, barrier, answers)) for _ in range(6)]
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=120)
        assert [answers.get(timeout=10) for _ in processes] == ["ok"] * 6, f"round {round_}"


def test_unreachable_storage_fails_fast():
    """A refused connection is one line at once (no retry loop); the time is not asserted (a loaded machine), the
    bounded connect timeout that keeps an unanswering host from hanging the CLI is."""
    with pytest.raises(ValueError, match="cannot reach storage") as info:
        open_storage("postgresql://nobody@127.0.0.1:1/none")
    assert "\n" not in str(info.value) and "Connection refused" in str(info.value)


def test_failing_invocations_keep_an_existing_study(tiny_study, tmp_path):
    """Bad invocations against a storage that holds a finished study leave its trials as they were: bad input,
    a study file whose grid changed (optuna cannot change a study's choices: one-line error, nothing written), and
    another study in the same storage that fails in a trial (its dataset folder is missing)."""
    db = tmp_path / "optuna.db"
    shutil.copy(tiny_study.db, db)
    before = snapshot(trials_of(db, "tiny"))
    attrs_before = optuna.load_study(study_name="tiny", storage=url_of(db)).user_attrs
    write_study(tmp_path / "tiny.yaml", base=AUTO)
    (tmp_path / "changed").mkdir()
    write_study(tmp_path / "changed" / "tiny.yaml", base=AUTO,
                variants=[*TWO_VARIANTS, {"label": "skip", "residual": "skipinit"}])
    (tmp_path / "bad").mkdir()
    write_study(tmp_path / "bad" / "tiny.yaml", variants=[{"label": "ls", "residual": "layerscale",
                                                           "options": {"bogus_opt": 1}}])
    write_study(tmp_path / "nodata.yaml", base={"dataset": "mnist", "dataset_options": {}}, variants=TWO_VARIANTS[:1])
    storage = ("--storage", url_of(db), "--results-dir", "results", "--no-progress")
    # in this process: the bad-input exits of a real CLI process are quick_calls' subprocess cases
    results = {key: run_in_process(*args, cwd=tmp_path) for key, args in {
        "budget": ("--study", "tiny.yaml", "--budget", "huge", *storage),
        "workers": ("--study", "tiny.yaml", "--workers", "0", *storage),
        "option": ("--study", "bad/tiny.yaml", *storage),
        "changed_grid": ("--study", "changed/tiny.yaml", *storage),
        "no_data": ("--study", "nodata.yaml", *storage),
    }.items()}
    for key in ("budget", "workers", "option"):
        assert_one_line_error(results[key])
    assert_one_line_error(results["changed_grid"], "study 'tiny' in the storage was run with variant = "
                          "['standard', 'rezero']", "--study-name")
    assert_one_line_error(results["no_data"], "error: no data folder given for mnist")
    study = optuna.load_study(study_name="tiny", storage=url_of(db))
    assert snapshot(study.get_trials(deepcopy=False)) == before and study.user_attrs == attrs_before
    # the missing data folder is caught before anything is stored: no study, no failed trial
    assert "nodata" not in optuna.study.get_all_study_names(storage=url_of(db))


# --- 8. --list and --dry-run -------------------------------------------------------------------------------------
def test_list_shows_every_study_with_its_sizes(quick_calls):
    result = quick_calls.results["list"]
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert sorted(rows) == sorted(available_studies())
    for name, row in rows.items():
        defined = load_spec(name).budgets
        assert row[1] == load_spec(name).kind
        sizes = [f"{load_spec(name, b).size}+{load_spec(name, b).tune_stage().size}" if b in defined else "—"
                 for b in BUDGETS]
        assert row[2:2 + len(BUDGETS)] == sizes
    # the quick start's count: 10 rows x 3 seeds reported, 10 rows x 3 rates x 1 tuning seed first = 60 trials
    assert rows["residual_variants"][2 + BUDGETS.index("quick")] == "30+30"
    assert lines[-1].startswith("trials: reported+tuning")


def test_dry_run_prints_points_and_estimate_and_touches_no_storage(quick_calls):
    result = quick_calls.results["dry_run"]
    assert result.returncode == 0, result.stderr
    spec = load_spec("residual_variants", "smoke")
    lines = result.stdout.splitlines()
    assert lines[0].startswith("tuning stage residual_variants-smoke-tune: 20 trials first")
    assert lines[1].startswith("study residual_variants-smoke: grid, 10 trials")
    assert lines[2] == "base (resolved): " + ", ".join(f"{k}={v}" for k, v in spec.base.items())
    assert "dataset=digits" in lines[2] and "weight_decay=0.05" in lines[2]  # the smoke budget over the protocol
    points = [line.strip() for line in lines if line.startswith("  variant=")]
    assert points == [", ".join(f"{k}={v}" for k, v in p.items()) for p in spec.grid()]
    (estimate,) = [line for line in lines if line.startswith("estimated time on this machine: ")]
    # the estimator's value: the mean of the points' estimates, x (10 reported + 20 tuning trials)
    from ablations.run.plan import duration_text, estimate_seconds

    per_trial = sum(estimate_seconds(spec.run_config(p)) for p in spec.grid()) / len(spec.grid())
    assert per_trial > 0
    assert estimate.startswith(f"estimated time on this machine: {duration_text(30 * per_trial)} "
                               f"({duration_text(per_trial)} per trial, 30 trials with the tuning stage;"), estimate
    assert not (quick_calls.root / "dry_run.db").exists() and not (quick_calls.root / "results").exists()
    assert not (quick_calls.root / "outputs").exists()


def test_dry_run_of_a_stored_study_prices_only_the_trials_left(tmp_path, capsys):
    """A dry run reads what a stored study has done (complete trials of its grid points; a point outside the grid
    does not count) and prices only the rest; a SQLite file that does not exist is not created."""
    from ablations.run import plan as run

    spec = load_spec("residual_variants", "smoke")
    missing = tmp_path / "missing.db"
    assert run.stored_done(f"sqlite:///{missing}", spec.study_name, spec) is None and not missing.exists()
    url = f"sqlite:///{tmp_path / 'stored.db'}"
    dist = optuna.distributions.CategoricalDistribution
    for name, points in ((f"{spec.study_name}-tune", spec.tune_stage().grid()[:3]),
                         (spec.study_name, spec.grid()[:4] + [{"variant": "standard", "depth": 9, "seed": 0}])):
        study = optuna.create_study(study_name=name, storage=url)
        choices = {k: dist(sorted({p[k] for p in points}, key=str)) for k in points[0]}
        for params in points:
            study.add_trial(optuna.trial.create_trial(params=params, distributions=choices, value=0.5))
    stored = run.stored_done(url, spec.study_name, spec)
    assert stored[:2] == (3, 4), stored
    run.dry_run(spec, {"threads": 1}, workers=1, stored=stored, results_dir=tmp_path)
    out = capsys.readouterr().out.splitlines()
    assert f"stored in {url}: 4 of the 10 reported trials done and 3 of the 20 tuning trials; a run continues " \
           "with the rest" in out
    (line,) = [x for x in out if x.startswith("estimated time on this machine")]
    per_trial = sum(run.estimate_seconds(spec.run_config(p, {"threads": 1})) for p in spec.grid()) / len(spec.grid())
    assert line.startswith(f"estimated time on this machine: {run.duration_text(23 * per_trial)} "
                           f"({run.duration_text(per_trial)} per trial, 23 of 30 trials left with the tuning stage;"), line


def test_dry_run_measure_prices_each_model_at_its_step_beside_a_standard_twin(tmp_path, capsys, monkeypatch):
    """--measure times each distinct non-standard model once beside its standard twin (same size and data) and
    prices its trials at the twin's estimate x that factor; standard rows (the controls too) keep 1.0 untimed."""
    from ablations.machine import timing
    from ablations.run import plan as run

    spec = load_spec("hyper_connections", "smoke")  # standard, two controls and eight multi-stream rows
    timed, factors_seen = [], []
    real_interleave, real_factors = timing.interleave, run.model_factors

    def interleave(fns, **kw):
        timed.append(sorted(fns))
        return real_interleave(fns, **kw)

    def factors(configs, threads, results_dir):
        out = real_factors(configs, threads, results_dir)
        factors_seen.append((configs, out))
        return out

    monkeypatch.setattr(timing, "interleave", interleave)
    monkeypatch.setattr(run, "model_factors", factors)
    run.dry_run(spec, {"threads": 1}, workers=2, results_dir=tmp_path, measure=True)
    out = capsys.readouterr().out.splitlines()
    ((configs, got),) = factors_seen
    assert len(timed) == sum(c.residual != "standard" for c in configs) == 8 and timed[0] == ["model", "standard"]
    assert [f for c, f in zip(configs, got, strict=True) if c.residual == "standard"] == [1.0, 1.0, 1.0]
    mhc4 = [f for c, f in zip(configs, got, strict=True) if c.residual == "mhc" and c.residual_options["n"] == 4]
    assert len(mhc4) == 1 and mhc4[0] > 1.2  # four streams, 20 Sinkhorn iterations per site: far above standard
    (line,) = [x for x in out if x.startswith("measured here (--measure:")]
    assert "mhc_n4 d2 " in line and "standard" not in line.split("): ", 1)[1].split(";")[0]
    overhead = run.TRIAL_OVERHEAD_S
    per_trial = sum(overhead + (run.estimate_seconds(run.standard_twin(c)) - overhead) * f
                    for c, f in zip(configs, got, strict=True)) / len(configs)
    (estimate,) = [x for x in out if x.startswith("estimated time on this machine")]
    total = spec.size + spec.tune_stage().size
    assert estimate.startswith(f"estimated time on this machine: {run.duration_text(total * per_trial / 2)} "
                               f"({run.duration_text(per_trial)} per trial, {total} trials with the tuning stage;"), estimate
    run.dry_run(spec, {"threads": 1}, workers=2, results_dir=tmp_path)  # without --measure: a hint, no timing
    assert len(timed) == 8 and any("add --measure to time each model here" in x for x in capsys.readouterr().out.splitlines())


def test_dry_run_of_a_stored_study_prices_what_is_left_from_its_own_trials(tmp_path, capsys):
    """Each grid point not done yet is priced at the median wall time of its (variant, depth) cell's completed
    trials (either stage; a trial the engine trained in a stack of K at its share, the stack's time / K), a cell
    without any at the FLOP estimate, and the sum divided by the workers."""
    from ablations.run import plan as run

    spec = load_spec("residual_variants", "smoke")
    url = f"sqlite:///{tmp_path / 'stored.db'}"
    dist = optuna.distributions.CategoricalDistribution
    walls = {f"{spec.study_name}-tune": [30.0, 50.0, 1600.0],  # standard (two lrs), layerscale in a stack of 4
             spec.study_name: [60.0, 100.0]}  # standard, layerscale at seed 0
    for name, points in ((f"{spec.study_name}-tune", spec.tune_stage().grid()[:3]), (spec.study_name, spec.grid()[:2])):
        study = optuna.create_study(study_name=name, storage=url)
        choices = {k: dist(sorted({p[k] for p in points}, key=str)) for k in points[0]}
        for params, wall in zip(points, walls[name], strict=True):
            stacked = {"stack_size": 4} if wall == 1600.0 else {}
            study.add_trial(optuna.trial.create_trial(params=params, distributions=choices, value=0.5,
                                                      user_attrs={"wall_time_s": wall} | stacked))
    stored = run.stored_done(url, spec.study_name, spec)
    assert stored.seconds == {("standard", 1): [30.0, 50.0, 60.0], ("layerscale", 1): [400.0, 100.0]}
    assert len(stored.left) == 30 - 5
    left = [(p["variant"], p["depth"]) for p in stored.left]
    fallback = 7.0
    expected = sum({("standard", 1): 50.0, ("layerscale", 1): 250.0}.get(c, fallback) for c in left) / 2
    line = run.measured_left(stored, 2, fallback)
    priced = sum(c[0] in ("standard", "layerscale") for c in left)
    assert priced == 1  # layerscale's second tuning lr; the 24 other points are the other eight variants'
    assert line.startswith(f"time left as measured by this study's completed trials: {run.duration_text(expected)} "
                           f"(25 trials, {priced} priced at their cell's median wall time, {25 - priced} at the "
                           "estimate above; 2 worker(s)); median per cell: layerscale d1 4.2 min, standard d1 50.0 s"), line
    run.dry_run(spec, {"threads": 1}, workers=2, stored=stored, results_dir=tmp_path)
    assert any(x.startswith("time left as measured") for x in capsys.readouterr().out.splitlines())
    # nothing measured (no wall times stored): no such line
    assert run.measured_left(stored._replace(seconds={}), 2, fallback) is None
    # --measure's per-cell estimates price the unmeasured cells instead of the one fallback
    other = next(c for c in left if c[0] not in ("standard", "layerscale"))
    line = run.measured_left(stored, 2, fallback, {other: 1000.0})
    again = expected + sum(1000.0 - fallback for c in left if c == other) / 2
    assert line.startswith(f"time left as measured by this study's completed trials: {run.duration_text(again)} "), line


def test_a_cell_not_measured_yet_is_priced_at_its_depth_s_measured_to_estimated_ratio():
    """Deep and narrow trials run slower than their FLOPs say: standard at depth 64 took 600 s against an estimate of
    200 s (3x), at depth 4 60 s against 40 s (1.5x). A row not measured yet is priced at its own estimate times the
    ratio at its depth (rezero: 220 s x 3 at depth 64, 30 s x 1.5 at depth 4); a depth with no measured cell keeps
    the estimate (100 s at depth 16); a cell with no estimate, the fallback."""
    from ablations.run import plan as run
    from ablations.run.study import Stored

    seconds = {("standard", 64): [500.0, 600.0, 700.0], ("standard", 4): [60.0]}
    left = ({"variant": "rezero", "depth": 64}, {"variant": "rezero", "depth": 4}, {"variant": "rezero", "depth": 16},
            {"variant": "standard", "depth": 64}, {"variant": "skipinit", "depth": 64})
    estimates = {("standard", 64): 200.0, ("standard", 4): 40.0, ("rezero", 64): 220.0, ("rezero", 4): 30.0,
                 ("rezero", 16): 100.0}
    line = run.measured_left(Stored(0, 4, "here", seconds, left), 2, 7.0, estimates)
    expected = (660.0 + 45.0 + 100.0 + 600.0 + 7.0) / 2
    assert line.startswith(f"time left as measured by this study's completed trials: {run.duration_text(expected)} "
                           "(5 trials, 1 priced at their cell's median wall time, 2 at their estimate x the measured "
                           "/ estimated time of the measured cells at their depth (d4 1.50x, d64 3.00x), 1 at their "
                           "own estimate, 1 at the estimate above; 2 worker(s))"), line
    # the later stages (contending rates, a second look) are priced at the estimate x the median of those ratios
    assert run.measured_factor(Stored(0, 4, "here", seconds, left), estimates) == pytest.approx((3.0 + 1.5) / 2)
    assert run.measured_factor(None, estimates) is None and run.measured_factor(Stored(0, 0, "x"), estimates) is None


def test_ngpt_rows_train_with_the_papers_recipe_unless_the_row_says_otherwise():
    """nGPT's reference trains without weight decay and without warm-up (``NGPT.paper_training``): norm_placement's
    ngpt row resolves to both, its other rows keep the study's base, and a row's own overrides win."""
    import dataclasses

    from ablations.studies.spec import Variant

    spec = load_spec("norm_placement")
    ngpt = spec.run_config({"variant": "ngpt", "depth": 4, "seed": 0})
    standard = spec.run_config({"variant": "standard", "depth": 4, "seed": 0})
    assert (ngpt.weight_decay, ngpt.warmup_epochs) == (0.0, 0.0)
    assert (standard.weight_decay, standard.warmup_epochs) == (spec.base["weight_decay"], spec.base["warmup_epochs"])
    own = dataclasses.replace(spec, variants=(Variant("ngpt_wd", "ngpt", overrides={"weight_decay": 0.1}),))
    assert own.run_config({"variant": "ngpt_wd", "depth": 4, "seed": 0}).weight_decay == 0.1


def test_without_workers_a_cpu_study_runs_one_worker_per_core(tmp_path, capsys):
    """``--workers`` not given: trials on the CPU get one worker per usable core with one thread each, at most one
    per trial of the larger stage (``--threads T``: cores // T workers); trials on a GPU get one worker. The dry run
    prices the study with that layout."""
    import torch

    from ablations.run import main
    from ablations.run.cli import cores, default_workers

    spec = load_spec("residual_variants", "smoke")  # 20 tuning trials, 10 reported
    expected = 1 if torch.cuda.is_available() else min(cores(), 20)
    assert default_workers(spec) == expected
    assert default_workers(spec, threads=2) == (1 if torch.cuda.is_available() else max(1, min(cores() // 2, 20)))
    tiny = dataclasses.replace(spec, axes={"depth": [1], "seed": [0]}, tune=None, variants=spec.variants[:1])
    assert default_workers(tiny) == 1  # one trial: one worker
    code = main(["--study", "residual_variants", "--budget", "smoke", "--dry-run", "--storage",
                 url_of(tmp_path / "none.db")])
    assert code == 0
    estimate = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("estimated time"))
    assert f"; {expected} worker(s) x {max(1, cores() // expected)} thread(s);" in estimate


def test_each_stage_of_a_tuned_study_is_named_on_its_progress_bar(tmp_path):
    """The tuning stage, the reported grid, the contending rates and a second look each say which they are (the
    progress bar's label and the stage's first line); a study without a tuning stage has one stage, unnamed."""
    from ablations.run.workers import stage_text

    tuned = load_spec("residual_variants", "quick")
    assert [stage_text(tuned, s) for s in ("tune", "report", "contend", "round")] == [
        "tuning stage", "reported grid", "contending rates", "second look"]
    plain = load_spec(str(write_study(tmp_path / "plain.yaml")))
    assert plain.tune is None and stage_text(plain, "report") == ""
