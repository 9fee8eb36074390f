"""``python -m ablations.run --import-runs FILE``: a study continued from the runs.csv of its report when its storage
is gone (another machine): the file's completed trials join the new storage as done, only the rest train, and the
report of the continued study holds the imported numbers unchanged; a file of another configuration is refused."""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections import Counter

import pytest
from helpers import run_cli_many, run_in_process, trials_of, url_of, write_study

from ablations.report.cli import main as report_main
from ablations.report.runs import curve_text, read_curve
from ablations.run.plan import duration_text

VARIANTS = [{"label": "standard", "residual": "standard"}, {"label": "rezero", "residual": "rezero"}]
TUNE = {"lr": [1e-3, 4e-3], "seeds": [100, 101, 102], "bounds": [1e-3, 4e-3]}  # bounds = the grid: no extension
NAME = "carried"
KEEP = ("phase", "variant", "seed", "lr", "best_val_acc", "final_val_acc", "test_acc", "param_count", "mode",
        "val_acc_curve")


def _rows(path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def _table(rows: list[dict]) -> dict[tuple, dict]:
    """Each row's point -> the columns that must survive an import (not trial numbers or wall times)."""
    return {(r["phase"], r["variant"], r["seed"], r["lr"]): {k: r[k] for k in KEEP} for r in rows}


def _write(path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def _report(study, db, out, cwd) -> list[dict]:
    result = run_in_process("--study", study, "--storage", url_of(db), "--out", out, "--no-figures",
                            "--no-tensorboard", "--no-note", cwd=cwd, main=report_main)
    assert result.returncode == 0, result.stderr
    return _rows(out / "runs.csv")


def _said(result) -> list[str]:
    """A run's stderr lines after the ones every run opens with (the data each point trains on)."""
    return [line for line in result.stderr.strip().splitlines() if not line.startswith("data: ")]


def _continue(study, db, runs_csv, cwd, *more: str):
    """``python -m ablations.run --study STUDY --storage DB --import-runs RUNS_CSV [MORE]`` in this process."""
    return run_in_process("--study", study, "--storage", url_of(db), *more, "--import-runs", runs_csv, cwd=cwd)


def _continue_and_train(study, db, runs_csv, cwd, count_line: str) -> list:
    """:func:`_continue` to the end, which says ``count_line`` of the import; the trials this run trained itself."""
    result = _continue(study, db, runs_csv, cwd, "--no-progress")
    assert result.returncode == 0, result.stderr
    assert count_line in result.stderr, result.stderr
    return [t for t in trials_of(db, NAME) if "worker" in t.user_attrs]


def _cut_after_two_seeds(rows: list[dict]) -> list[dict]:
    """The rows a machine that went away after the tuning stage and seeds 0 and 1 left in its last report."""
    return [r for r in rows if r["phase"] == "tune" or r["seed"] != "2"]


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """A study with a tuning stage (2 variants x 2 rates on seeds 100-102; then seeds 0-2) trained once, and its report."""
    root = tmp_path_factory.mktemp("carry")
    study = write_study(root / f"{NAME}.yaml", variants=VARIANTS, tune=TUNE, axes={"seed": [0, 1, 2]})
    result = run_in_process("--study", study, "--storage", url_of(root / "a.db"), "--no-progress", cwd=root)
    assert result.returncode == 0, result.stderr
    return root, study, _report(study, root / "a.db", root / "report_a", root)


@pytest.mark.slow
def test_a_partial_runs_csv_continues_the_study_and_only_the_rest_trains(first, tmp_path):
    root, study, rows = first
    phases = Counter(r["phase"] for r in rows)
    # one epoch on three tuning seeds leaves a rate choice unsettled: that cell's reported seeds train at the other
    # rate too (its own stage, 'carried-contend'), and a continued study carries those rows like the others
    contended = sorted({r["variant"] for r in rows if r["phase"] == "contend"})
    assert (phases["tune"], phases["report"], phases["contend"]) == (12, 6, 3 * len(contended)) and contended, phases
    assert {r["state"] for r in rows} == {"complete"}
    assert all(len(json.loads(r["val_acc_curve"])) == 1 for r in rows)  # one epoch each: the curve is carried
    partial = _cut_after_two_seeds(rows)
    _write(tmp_path / "runs.csv", partial)
    db = tmp_path / "b.db"
    result = _continue(study, db, tmp_path / "runs.csv", tmp_path, "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "12 completed tuning-stage trial(s) joined 'carried-tune' as done" in result.stderr
    assert "4 completed reported trial(s) joined 'carried' as done" in result.stderr
    assert (f"{2 * len(contended)} completed contending-rate trial(s) joined 'carried-contend' as done"
            in result.stderr), result.stderr
    tune, reported = trials_of(db, f"{NAME}-tune"), trials_of(db, NAME)
    assert all("imported_from" in t.user_attrs for t in tune)  # nothing of the tuning stage trained again
    for name, expected in ((NAME, ["rezero", "standard"]), (f"{NAME}-contend", contended)):  # only the cut seed
        trained = sorted(t.params["variant"] + f"/{t.params['seed']}" for t in trials_of(db, name)
                         if "worker" in t.user_attrs)
        assert trained == [f"{v}/2" for v in expected], name
    assert all(t.user_attrs["imported_from"] == str(tmp_path / "runs.csv") for t in reported
               if "worker" not in t.user_attrs)
    # the continued study's report: the imported rows unchanged, the retrained seed as the first machine had it
    # (the same seed trains the same numbers here), the tuning choice the same
    again = _report(study, db, tmp_path / "report_b", tmp_path)
    assert _table(again) == _table(rows)
    # rerunning with the same file adds nothing: every point is done
    result = _continue(study, db, tmp_path / "runs.csv", tmp_path, "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "0 completed reported trial(s) joined 'carried' as done; 4 already done here" in result.stderr
    assert len(trials_of(db, NAME)) == 6


@pytest.mark.slow  # three CLI processes side by side (~30 s on 2 cores)
def test_workers_importing_one_runs_csv_at_once_report_each_point_once(first, tmp_path):
    """Three workers started at once with the same command, ``--import-runs`` included (as a SLURM array would):
    each reads the storage before the others' rows are in, so each adds the file's rows (about one worker in two,
    measured). A point's result is its first completed trial: the report equals the file's rows, one per point,
    and the tuning stage's choice is the file's (its means over the repeated rows unchanged)."""
    root, study, rows = first
    db = tmp_path / "c.db"
    args = ("--study", str(study), "--storage", url_of(db), "--results-dir", "results", "--no-progress",
            "--workers", "1", "--threads", "1", "--import-runs", str(root / "report_a" / "runs.csv"))
    for result in run_cli_many({k: args for k in "abc"}, cwd=tmp_path).values():
        assert result.returncode == 0, result.stderr
    tune, reported = trials_of(db, f"{NAME}-tune"), trials_of(db, NAME)
    assert all("imported_from" in t.user_attrs for t in tune + reported)  # nothing trained
    again = _report(study, db, tmp_path / "report_c", tmp_path)
    assert len(again) == len(rows) and _table(again) == _table(rows)


def test_a_completed_point_s_later_copies_are_not_results(tmp_path):
    """Two COMPLETE trials of one grid point (what simultaneous imports leave): the first is the result, the later
    one is skipped by the report and by the tuning stage's choice, whatever its value; two search trials that
    drew the same parameters are both results."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from ablations.report.load import result_trials
    from ablations.studies.storage import repeated_results

    study = optuna.create_study(storage=url_of(tmp_path / "r.db"), study_name="r")
    point = {"variant": "standard", "seed": 0}
    for value in (0.9, 0.1):  # the later copy's value must not count
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=value, system_attrs={"fixed_params": point},
                                     user_attrs={"best_val_acc": value}))
    other = {"variant": "rezero", "seed": 0}
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.5, system_attrs={"fixed_params": other}))
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    for _ in range(2):
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.5, params={"x": 0.5}, distributions=dist))
    trials = study.get_trials()
    assert repeated_results(trials) == {1}
    results, pending, skipped = result_trials(study)
    assert [t.number for t in results] == [0, 2, 3, 4] and (pending, skipped) == (0, 1)


@pytest.mark.parametrize(("phase", "column", "value", "fault"), [
    ("tune", "param_count", "999", "999 parameters, this study's model"),
    ("tune", "residual", "layerscale", "residual layerscale {}, the study file now"),
    ("report", "param_count", "999", "999 parameters, this study's model"),
    ("tune", "epochs_completed", "5", "5 epochs, this study 1"),  # another budget or --set max_epochs
    ("tune", "num_classes", "100", "100 classes, this study's dataset 4"),
])
@pytest.mark.slow
def test_a_row_of_another_configuration_is_refused_and_nothing_is_added(first, tmp_path, phase, column, value,
                                                                          fault):
    """A row that is not this study's point (another budget, --set or study version) stops the import of its
    stage before anything of it is stored; a bad reported row comes after the tuning stage's rows were checked
    and stored (they are this study's): the reported stage stays empty."""
    root, study, rows = first
    changed = [dict(r) for r in rows]
    target = next(r for r in changed if r["phase"] == phase and r["variant"] == "rezero")
    target[column] = value
    _write(tmp_path / "runs.csv", changed)
    db = tmp_path / "c.db"
    result = _continue(study, db, tmp_path / "runs.csv", tmp_path, "--no-progress")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = _said(result)
    assert len(lines) == 1 if phase == "tune" else "12 completed tuning-stage trial(s) joined" in lines[0]
    assert lines[-1].startswith("error: --import-runs: ") and fault in lines[-1]
    assert f"none of its {phase} rows were imported" in lines[-1]
    assert len(trials_of(db, f"{NAME}-tune")) == (12 if phase == "report" else 0)
    assert trials_of(db, NAME) == []
    assert not (tmp_path / "results" / "runs" / (f"{NAME}-tune" if phase == "tune" else NAME)).exists()


@pytest.mark.slow
def test_a_reported_row_at_another_rate_than_the_tuning_chose_trains_again(first, tmp_path):
    """A reported row that differs only in its learning rate (the tuning stage of this study chose another rate for
    its cell, e.g. after more tuning seeds) is no result of this study: it is left out with a count, and its point
    trains again; the other rows are imported."""
    root, study, rows = first
    changed = [dict(r) for r in rows]
    target = next(r for r in changed if r["phase"] == "report" and r["variant"] == "rezero" and r["seed"] == "1")
    target["lr"] = "0.00025"
    _write(tmp_path / "runs.csv", changed)
    trained = _continue_and_train(study, tmp_path / "g.db", tmp_path / "runs.csv", tmp_path,
                                  "5 completed reported trial(s) joined 'carried' as done; 1 trained at another "
                                  "learning rate than this study's tuning stage chose (they train again)")
    assert [(t.params["variant"], t.params["seed"]) for t in trained] == [("rezero", 1)]


@pytest.mark.slow
def test_a_missing_runs_file_or_a_search_study_is_one_line(first, tmp_path):
    root, study, _ = first
    result = run_in_process("--study", study, "--import-runs", tmp_path / "nope.csv", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: --import-runs: runs file '{tmp_path / 'nope.csv'}' does not exist"
    (tmp_path / "junk.csv").write_text("a,b\n1,2\n")
    result = _continue(study, tmp_path / "d.db", tmp_path / "junk.csv", tmp_path)
    assert result.returncode == 2
    (line,) = _said(result)
    assert line.startswith("error: --import-runs: runs file") and "lacks column(s)" in line


def test_a_curve_round_trips_through_its_runs_csv_cell_gaps_included():
    assert curve_text({1: 0.5, 3: 0.75}) == "[0.5, null, 0.75]"
    assert read_curve("[0.5, null, 0.75]") == {1: 0.5, 3: 0.75}
    assert curve_text({}) is None and read_curve("") == {}
    with pytest.raises(ValueError):
        read_curve('["a"]')


@pytest.mark.slow
def test_a_dry_run_prices_what_the_runs_file_leaves(first, tmp_path):
    """On a new storage, ``--dry-run --import-runs`` counts what the file completed and prices the points it leaves
    at its own trials' median wall time per cell (a stacked trial's share of its stack, runs.csv's ``stack_size``);
    nothing is stored."""
    root, study, rows = first
    partial = [dict(r) for r in _cut_after_two_seeds(rows)]  # copies: the fixture's rows stay as they are
    for r in partial:  # rezero's rows trained two to a stack (the engine): each costs half its stack's wall time
        r["stack_size"] = "2" if r["variant"] == "rezero" else ""
    _write(tmp_path / "runs.csv", partial)
    db = tmp_path / "e.db"
    result = _continue(study, db, tmp_path / "runs.csv", tmp_path, "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert f"stored in runs file {tmp_path / 'runs.csv'} (--import-runs): 4 of the 6 reported trials done and 12 of " \
           "the 12 tuning trials; a run continues with the rest" in out
    walls = {}
    for r in partial:
        if r["phase"] not in ("tune", "report"):  # the contending rates' stage is not priced here
            continue
        walls.setdefault(r["variant"], []).append(float(r["wall_time_s"]) / (2 if r["variant"] == "rezero" else 1))
    median = {v: statistics.median(w) for v, w in walls.items()}  # six tuning and two reported runs each
    (line,) = [x for x in out if x.startswith("time left as measured")]
    assert line.startswith(f"time left as measured by this study's completed trials: "
                           f"{duration_text(median['standard'] + median['rezero'])} (2 trials, 2 priced at their cell's "
                           "median wall time, 0 at the estimate above; 1 worker(s))"), line
    assert not db.exists()


@pytest.mark.slow
def test_a_dry_run_on_a_storage_counts_what_the_runs_file_adds_to_it(first, tmp_path):
    """A storage that holds part of the study (the tuning stage and seed 0) and a runs file that holds more (seeds 0
    and 1): the dry run counts the storage's points and the file's rows for the points the storage lacks, and prices
    only what neither has (seed 2), as the run that imports the file would train it."""
    root, study, rows = first
    db = tmp_path / "h.db"
    seed0 = write_study(tmp_path / f"{NAME}.yaml", variants=VARIANTS, tune=TUNE, axes={"seed": [0]})
    result = _continue(seed0, db, root / "report_a" / "runs.csv", tmp_path, "--no-progress")  # nothing trains
    assert result.returncode == 0, result.stderr
    assert "2 completed reported trial(s) joined 'carried' as done; 4 not points of this study" in result.stderr
    _write(tmp_path / "runs.csv", _cut_after_two_seeds(rows))
    result = _continue(study, db, tmp_path / "runs.csv", tmp_path, "--dry-run")
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert f"stored in {url_of(db)} and runs file {tmp_path / 'runs.csv'} (--import-runs): 4 of the 6 reported " \
           "trials done and 12 of the 12 tuning trials; a run continues with the rest" in out, out
    (line,) = [x for x in out if x.startswith("time left as measured")]
    assert "(2 trials, 2 priced at their cell's median wall time" in line, line
    assert len(trials_of(db, NAME)) == 2  # the dry run stored nothing
    # a reported row at another rate than the storage's tuning stage chose trains again: it is not counted
    moved = [dict(r) for r in _cut_after_two_seeds(rows)]  # copies: the fixture's rows stay as they are
    next(r for r in moved if r["phase"] != "tune" and r["seed"] == "1")["lr"] = "0.00025"
    _write(tmp_path / "moved.csv", moved)
    result = _continue(study, db, tmp_path / "moved.csv", tmp_path, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"stored in {url_of(db)} and runs file {tmp_path / 'moved.csv'} (--import-runs): 3 of the 6 reported " \
           "trials done and 12 of the 12 tuning trials; a run continues with the rest" in result.stdout.splitlines()


@pytest.mark.slow
def test_a_study_stopped_in_its_tuning_stage_reports_its_runs_csv_and_continues_from_it(first, tmp_path):
    """A machine that goes away during the tuning stage: the report writes runs.csv and the tuning table (no
    reported trial yet, so no other table), and --import-runs continues from there, training only the rest."""
    root, study, rows = first
    _write(tmp_path / "cut.csv", [r for r in rows if r["phase"] == "tune"][:3])
    result = run_in_process("--study", study, "--runs", tmp_path / "cut.csv", "--out", tmp_path / "report",
                            cwd=tmp_path, main=report_main)
    assert result.returncode == 0, result.stderr
    assert "no completed trial in its report phase yet (3 tuning trials): wrote runs.csv and the tuning table only" \
        in result.stdout
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == [
        "runs.csv", "tuning.csv", "tuning.md", "tuning.pdf", "tuning.png", "tuning.tex"]
    assert _table(_rows(tmp_path / "report" / "runs.csv")) == _table(_rows(tmp_path / "cut.csv"))
    db = tmp_path / "f.db"
    result = _continue(study, db, tmp_path / "report" / "runs.csv", tmp_path, "--no-progress")
    assert result.returncode == 0, result.stderr
    assert "3 completed tuning-stage trial(s) joined 'carried-tune' as done" in result.stderr
    trained = [t for t in [*trials_of(db, f"{NAME}-tune"), *trials_of(db, NAME)] if "worker" in t.user_attrs]
    assert len(trained) == (12 - 3) + 6
    assert _table(_report(study, db, tmp_path / "report_f", tmp_path)) == _table(rows)


@pytest.mark.slow
def test_another_studys_file_or_an_old_runs_csv_is_refused_with_one_line(first, tmp_path):
    root, study, rows = first
    other = [dict(r, variant="layerscale") for r in rows]  # no point of this study
    _write(tmp_path / "other.csv", other)
    old = [{k: r[k] for k in ("number", "run_name", "state", "variant", "row", "depth", "seed", "acc", "diverged",
                               "ok")} for r in rows]  # the shorter file of earlier reports
    _write(tmp_path / "old.csv", old)
    for name, fault in (("other.csv", "no completed row of"), ("old.csv", "was written by an earlier report")):
        db = tmp_path / f"{name}.db"
        result = _continue(study, db, tmp_path / name, tmp_path, "--no-progress")
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        line = result.stderr.strip().splitlines()[-1]
        assert line.startswith("error: --import-runs: ") and fault in line, line
        assert trials_of(db, f"{NAME}-tune") == []


@pytest.mark.slow
def test_rows_without_per_image_results_train_again_with_retrain_without_per_image(first, tmp_path):
    """A runs.csv of a version that stored no per-image test results: with ``--retrain-without-per-image`` its
    reported rows that trained are left out and train again (the tuning stage's rows are kept), the dry run counts
    them as left, and the continued report has every run's per-image results — the retrained ones exactly those the
    first machine stored for the same seeds."""
    root, study, rows = first
    assert all(r["test_correct"] for r in rows if r["phase"] == "report")
    older = [dict(r, test_correct="") if r["phase"] == "report" and r["seed"] != "0" else r for r in rows]
    _write(tmp_path / "older.csv", older)
    db = tmp_path / "g.db"
    result = _continue(study, db, tmp_path / "older.csv", tmp_path, "--dry-run", "--retrain-without-per-image")
    assert result.returncode == 0, result.stderr
    assert "2 of the 6 reported trials done and 12 of the 12 tuning trials" in result.stdout
    result = _continue(study, db, tmp_path / "older.csv", tmp_path, "--no-progress", "--retrain-without-per-image")
    assert result.returncode == 0, result.stderr
    assert ("2 completed reported trial(s) joined 'carried' as done; 4 without per-image test results (they train "
            "again: --retrain-without-per-image)") in result.stderr
    assert all("imported_from" in t.user_attrs for t in trials_of(db, f"{NAME}-tune"))
    trained = sorted(f"{t.params['variant']}/{t.params['seed']}" for t in trials_of(db, NAME) if "worker" in t.user_attrs)
    assert trained == ["rezero/1", "rezero/2", "standard/1", "standard/2"]
    again = _report(study, db, tmp_path / "report_g", tmp_path)
    assert _table(again) == _table(rows)
    first_correct = {(r["variant"], r["seed"]): r["test_correct"] for r in rows if r["phase"] == "report"}
    assert {(r["variant"], r["seed"]): r["test_correct"] for r in again if r["phase"] == "report"} == first_correct
    # the same command again: the retrained points are done here, nothing trains or is counted as left
    result = _continue(study, db, tmp_path / "older.csv", tmp_path, "--no-progress", "--retrain-without-per-image")
    assert result.returncode == 0, result.stderr
    assert "0 completed reported trial(s) joined 'carried' as done; 6 already done here\n" in result.stderr
    assert len(trials_of(db, NAME)) == 6


@pytest.mark.parametrize("flag", [["--retrain-without-per-image"], ["--retrain-mode", "32-true + fused attention"]])
def test_retrain_flags_need_a_runs_file(tmp_path, flag):
    study = write_study(tmp_path / "alone.yaml", variants=VARIANTS, axes={"seed": [0]})
    result = run_in_process("--study", study, *flag, cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == f"error: {flag[0]} chooses which rows of --import-runs FILE train again: give both"


@pytest.mark.slow
def test_rows_of_another_mode_train_again_with_retrain_mode(first, tmp_path):
    """A study continued on a machine where precision auto chose another mode: with ``--retrain-mode MODE`` the
    reported rows that trained in MODE are left out and train again here, in this run's mode, so the report has
    every reported run in one mode; a MODE no row trained in is one line naming the file's modes."""
    root, study, rows = first
    here = rows[-1]["mode"]
    other = "bf16-mixed + fused attention" if here != "bf16-mixed + fused attention" else "32-true + fused attention"
    mixed = [dict(r, mode=other) if r["phase"] == "report" and r["seed"] == "1" else r for r in rows]
    _write(tmp_path / "mixed.csv", mixed)
    db = tmp_path / "h.db"
    result = _continue(study, db, tmp_path / "mixed.csv", tmp_path, "--no-progress", "--retrain-mode", other)
    assert result.returncode == 0, result.stderr
    assert (f"4 completed reported trial(s) joined 'carried' as done; 2 trained in mode {other} (they train again: "
            "--retrain-mode)") in result.stderr
    trained = sorted(f"{t.params['variant']}/{t.params['seed']}" for t in trials_of(db, NAME) if "worker" in t.user_attrs)
    assert trained == ["rezero/1", "standard/1"]
    again = _report(study, db, tmp_path / "report_h", tmp_path)
    assert {r["mode"] for r in again if r["phase"] == "report"} == {here}
    assert _table(again) == _table(rows)
    result = _continue(study, tmp_path / "i.db", tmp_path / "mixed.csv", tmp_path, "--retrain-mode", "fp8 + magic")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: --retrain-mode: no reported row of '{tmp_path / 'mixed.csv'}' trained in mode 'fp8 + magic'; its "
        f"modes: " + ", ".join(f"'{m}'" for m in sorted({here, other})))
    assert not (tmp_path / "i.db").exists()


@pytest.mark.slow
def test_a_row_of_an_earlier_form_trains_again_and_a_report_says_when_forms_mix(first, tmp_path):
    """Each row records the form its model was built in (every part's options, defaults filled in). A row whose
    form is not the one this version builds for its point (a default changed since it trained) is left out with a
    count and its point trains again; the dry run counts it as left; a row without a recorded form imports as
    before; a report over rows of two forms of one variant says so."""
    root, study, rows = first
    forms = {r["variant"]: json.loads(r["form"]) for r in rows}
    assert forms["rezero"]["residual"] == {"kind": "rezero", "options": {"init_value": 0.0, "norm": False}}
    assert forms["standard"] == {"attention": {"kind": "self", "options": {}}, "norm": {"kind": "layernorm",
                                 "options": {}}, "parametrization": {"kind": "standard", "options": {"init": "timm"}},
                                 "residual": {"kind": "standard", "options": {}}}
    changed = [dict(r) for r in rows]
    reported = [r for r in changed if r["phase"] == "report"]
    earlier = next(r for r in reported if r["variant"] == "rezero" and r["seed"] == "1")
    earlier["form"] = json.dumps(forms["rezero"] | {"residual": {"kind": "rezero",  # ReZero's alpha from 1: not ReZero
                                                                 "options": {"init_value": 1.0, "norm": False}}})
    next(r for r in reported if r["variant"] == "standard" and r["seed"] == "2")["form"] = ""  # not recorded
    _write(tmp_path / "runs.csv", changed)
    result = _continue(study, tmp_path / "dry.db", tmp_path / "runs.csv", tmp_path, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"stored in runs file {tmp_path / 'runs.csv'} (--import-runs): 5 of the 6 reported trials done and 12 " \
           "of the 12 tuning trials; a run continues with the rest" in result.stdout.splitlines()
    mixed = run_in_process("--study", study, "--runs", tmp_path / "runs.csv", "--out", tmp_path / "mixed",
                           "--no-figures", "--no-tensorboard", "--no-note", cwd=tmp_path, main=report_main)
    assert mixed.returncode == 0, mixed.stderr
    assert "rows whose runs were built in more than one form (a default changed between them): rezero: 2 forms" \
           in mixed.stdout + mixed.stderr
    db = tmp_path / "f.db"
    trained = _continue_and_train(study, db, tmp_path / "runs.csv", tmp_path,
                                  "5 completed reported trial(s) joined 'carried' as done; 1 built in an earlier "
                                  "form of their design, a default has changed since (they train again)")
    assert [(t.params["variant"], t.params["seed"]) for t in trained] == [("rezero", 1)]
    assert json.loads(trained[0].user_attrs["form"]) == forms["rezero"]  # trained in today's form
    again = _report(study, db, tmp_path / "report_f", tmp_path)  # the continued study: one form per variant again
    assert {r["form"] for r in again if r["variant"] == "rezero"} == {json.dumps(forms["rezero"], sort_keys=True,
                                                                                  separators=(",", ":"))}
    # the same file under another --set is another study, not an earlier form: one line, nothing imported
    result = _continue(study, tmp_path / "s.db", tmp_path / "runs.csv", tmp_path, "--no-progress", "--set",
                       "norm_layer=dyt")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    (line,) = [x for x in result.stderr.strip().splitlines() if x.startswith("error:")]
    assert "norm_layer layernorm, this study dyt" in line and "none of its tune rows were imported" in line, line


def test_an_option_added_since_a_run_recorded_its_form_counts_at_the_value_it_had(monkeypatch, tmp_path):
    """A run recorded its form before its class gained an option (here ReZero's ``norm``, taken out of a recorded
    form). Undeclared, the missing option is a difference: the run is of an earlier form for the import, the
    runner's warning and the report alike. Declared in the class's ``added_options`` at the value that builds what
    the run built (``norm=False``, today's default), the run is of today's form; declared at another value (the new
    option's default changed the design), it is of an earlier form again."""
    import optuna
    from optuna.trial import FixedTrial, TrialState, create_trial

    from ablations import report
    from ablations.report.load import assemble
    from ablations.run.imported import _earlier_form
    from ablations.run.objective import form_of, jsonable, suggest
    from ablations.run.study import earlier_forms
    from ablations.studies.spec import load_spec
    from lit_modules import RESIDUALS

    spec = load_spec("residual_variants", "smoke")
    point = next(p for p in spec.grid() if p["variant"] == "rezero")
    config = spec.run_config(point)
    today = form_of(config)
    assert today["residual"]["options"]["norm"] is False
    before = json.loads(json.dumps(today))
    del before["residual"]["options"]["norm"]
    run = report.Run(number=0, state="complete", variant="rezero", depth=point["depth"], seed=point["seed"], row="",
                     acc=0.9, diverged=False, config={"residual": "rezero", "residual_options": {}},
                     summary={"form": json.dumps(before), "best_val_acc": 0.9})
    now = report.Run(number=1, state="complete", variant="rezero", depth=point["depth"], seed=point["seed"] + 1,
                     row="", acc=0.9, diverged=False, config=run.config,
                     summary={"form": json.dumps(today), "best_val_acc": 0.9})
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}", study_name="s", direction="maximize")
    fixed = FixedTrial(point)
    suggest(fixed, spec)
    study.add_trial(create_trial(state=TrialState.COMPLETE, value=0.9, params=fixed.params,
                                 distributions=fixed.distributions, system_attrs={"fixed_params": point},
                                 user_attrs={"config": jsonable(config.to_dict()), "form": json.dumps(before)}))

    def seen() -> tuple[bool, dict, dict]:
        return (_earlier_form(run, config), earlier_forms(study),
                assemble("s", spec, [run, now]).mixed_forms())

    assert RESIDUALS["rezero"].added_options == {}
    assert seen() == (True, {"rezero": 1}, {"rezero": 2})  # undeclared: a difference
    monkeypatch.setattr(RESIDUALS["rezero"], "added_options", {"norm": False})
    assert seen() == (False, {}, {})  # the value it had is today's default: today's form
    monkeypatch.setattr(RESIDUALS["rezero"], "added_options", {"norm": True})
    assert seen() == (True, {"rezero": 1}, {"rezero": 2})  # the new option's default changed the design
