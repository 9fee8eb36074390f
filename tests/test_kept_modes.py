"""A study trains in one mode (``ablations.run.kept_modes``): precision ``auto`` keeps the mode the study's runs so
far trained in, so a study continued on a machine whose own choice differs does not pair runs of two modes."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from helpers import run_in_process, trials_of, url_of, write_study
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from ablations.machine import modes
from ablations.report.cli import main as report_main
from ablations.run.kept_modes import completed, kept_modes, recorded_modes, trial_cell

MODEL = {"embed_dim": 64, "img_size": 28, "patch_size": 7}  # 16 patches + the class token: cell (cpu, 64, 17)


def trial(number: int, precision: str | None = "32-true", fused: bool = True, *, state=TrialState.COMPLETE,
          model: dict | None = None, cuda: bool = False, phase: str = "report"):
    attrs = {"model": model or MODEL, "phase": phase} | ({"device": "cuda"} if cuda else {})
    if precision is not None:
        attrs |= {"precision": precision, "fused_attn": fused}
    made = create_trial(state=state, value=0.9 if state == TrialState.COMPLETE else None, params={"lr": 1e-3},
                        distributions={"lr": FloatDistribution(1e-4, 1e-2)}, user_attrs=attrs)
    made.number = number
    return made


def test_the_most_common_mode_of_completed_runs_is_kept_per_cell_and_device():
    trials = [trial(0, fused=False), trial(1), trial(2, fused=False), trial(3, state=TrialState.FAIL),
              trial(4, state=TrialState.RUNNING), trial(5, precision=None), trial(9, "auto"),  # recorded no mode
              trial(6, "bf16-mixed", model={"embed_dim": 192, "img_size": 32, "patch_size": 4}),
              trial(7, "bf16-mixed", cuda=True), trial(8, "bf16-mixed", cuda=True)]
    assert recorded_modes(completed(trials)) == {("cpu", 64, 17): {("32-true", False): 2, ("32-true", True): 1},
                                      ("cpu", 192, 65): {("bf16-mixed", True): 1},
                                      ("cuda", 64, 17): {("bf16-mixed", True): 2}}
    kept = kept_modes(completed(trials))
    assert {c: (m.precision, m.fused_attn) for c, m in kept.items()} == {
        ("cpu", 64, 17): ("32-true", False), ("cpu", 192, 65): ("bf16-mixed", True),
        ("cuda", 64, 17): ("bf16-mixed", True)}
    assert kept[("cpu", 64, 17)].source == "kept: the mode of 2 of this study's reported runs at this size (1 in other modes)"
    assert kept[("cpu", 192, 65)].source == "kept: the mode of 1 of this study's reported runs at this size"


def test_a_tie_keeps_the_mode_trained_first_and_excluded_modes_are_never_kept():
    trials = [trial(3, fused=False), trial(1), trial(2, fused=False), trial(0)]  # in trial order: fused first
    assert kept_modes(completed(trials))[("cpu", 64, 17)].fused_attn is True
    kept = kept_modes(completed(trials), exclude=["32-true + fused attention"])
    assert kept[("cpu", 64, 17)].fused_attn is False
    cuda = [trial(0, "bf16-mixed", cuda=True)]
    assert kept_modes(completed(cuda), exclude=["bf16-mixed + fused attention"])  # the CPU's name is not the GPU's mode
    assert not kept_modes(completed(cuda), exclude=["bf16-mixed + fused attention on cuda"])


def test_the_reported_runs_mode_comes_before_the_tuning_stage_s_even_where_it_has_fewer_runs():
    tuning = [trial(n, "bf16-mixed", phase="tune") for n in range(3)] + [trial(3, phase="tune")]
    kept = kept_modes(completed(tuning))  # the reported stage has not started: the tuning stage's mode
    assert (kept[("cpu", 64, 17)].precision, kept[("cpu", 64, 17)].source) == (
        "bf16-mixed", "kept: the mode of 3 of this study's tuning runs at this size (1 in other modes)")
    kept = kept_modes(completed([*tuning, trial(4, fused=False)]))
    assert (kept[("cpu", 64, 17)].precision, kept[("cpu", 64, 17)].fused_attn) == ("32-true", False)
    assert kept[("cpu", 64, 17)].source == "kept: the mode of 1 of this study's reported runs at this size"


def test_a_trial_without_a_model_has_no_cell_and_a_recorded_device_comes_before_the_config_s():
    assert trial_cell({"precision": "32-true"}) is None
    assert trial_cell({"model": MODEL, "config": {"accelerator": "gpu"}}) == ("cuda", 64, 17)  # an older run
    assert trial_cell({"model": MODEL, "device": "cpu", "config": {"accelerator": "gpu"}}) == ("cpu", 64, 17)


@pytest.mark.parametrize(("mode", "expected"), [
    ("bf16-mixed + fused attention on cuda", ("bf16-mixed", True, "cuda")),
    ("32-true + explicit attention", ("32-true", False, "cpu"))])
def test_an_imported_row_trained_where_its_mode_says_whatever_the_continuing_run_s_accelerator(mode, expected):
    """runs.csv has no device column: an imported row's device is its mode's (`` on cuda`` or not), so a study
    continued on a GPU does not count a CPU's rows as its own, nor a CPU the GPU's, and the report reads the mode
    back as it was."""
    from ablations.report.load import Run, run_mode
    from ablations.run.imported import _user_attrs
    from ablations.studies.spec import load_spec

    spec = load_spec("residual_variants", "smoke")
    config = spec.run_config(spec.grid()[0], {"accelerator": "cuda" if expected[2] == "cpu" else "cpu"})
    run = Run(number=0, state="complete", variant="standard", depth=1, seed=0, row="standard", mode=mode,
              summary={"test_acc": 0.5})
    attrs = _user_attrs(run, config, "report", Path("runs.csv"))
    assert (attrs["precision"], attrs["fused_attn"], attrs["device"]) == expected
    assert trial_cell(attrs)[0] == expected[2]
    assert run_mode(Run(number=0, state="complete", variant="standard", depth=1, seed=0, row="standard",
                        summary=attrs, config=attrs["config"])) == mode


# --- end to end: a study continued on a machine whose own choice is the other attention kernel ---------------------
TINY = {"precision": "auto"}  # width 8, 8x8 images in 4x4 patches: cell (cpu, 8, 5)
CELL_TIMES = {"explicit": {"32-true/explicit": 1.0}, "fused": {"32-true/fused": 1.0}}


def machine_picks(results: Path, kernel: str) -> None:
    """This machine's modes table (its signature at one thread) says 32-true with the ``kernel`` attention is the
    fastest for the tiny model: what ``auto`` picks here."""
    times = dict.fromkeys(modes.MODE_KEYS, 2.0) | CELL_TIMES[kernel]
    table = {"device": "cpu", "machine": modes.cpu_signature(1), "cells": [{"embed_dim": 8, "tokens": 5,
                                                                            "times_s": times}]}
    (results / "device").mkdir(parents=True, exist_ok=True)
    (results / "device" / "modes-cpu.json").write_text(json.dumps(table))


def _rows(path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


@pytest.mark.slow
def test_a_study_continued_where_auto_picks_another_kernel_keeps_its_runs_mode(tmp_path, monkeypatch):
    import ablations.run.kept_modes

    monkeypatch.setattr(ablations.run.kept_modes, "REFRESH_S", 0.0)  # read before every trial (the tiny runs take 1 s)
    study = write_study(tmp_path / "kept.yaml", base=TINY, axes={"seed": [0, 1]})
    first, second = tmp_path / "first", tmp_path / "second"
    machine_picks(first, "explicit")
    result = run_in_process("--study", study, "--storage", url_of(tmp_path / "a.db"), "--results-dir", first,
                            "--threads", "1", "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert {(t.user_attrs["precision"], t.user_attrs["fused_attn"]) for t in trials_of(tmp_path / "a.db", "kept")} \
        == {("32-true", False)}
    out = tmp_path / "report"
    result = run_in_process("--study", study, "--storage", url_of(tmp_path / "a.db"), "--out", out, "--no-figures",
                            "--no-tensorboard", "--no-note", cwd=tmp_path, main=report_main)
    assert result.returncode == 0, result.stderr
    rows = _rows(out / "runs.csv")
    partial = tmp_path / "partial.csv"
    with open(partial, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(r for r in rows if r["seed"] == "0")

    # another machine, whose own choice is the fused kernel, continues from the first's seed-0 rows; its dry run
    # (from the file, or from the first machine's storage) says so first
    machine_picks(second, "fused")
    line = ("precision auto, width 8, 5 tokens: trains in 32-true + explicit attention, the mode of 2 of this "
            "study's reported runs at this size; this machine alone would pick 32-true + fused attention")
    for source in (["--import-runs", partial, "--storage", url_of(tmp_path / "new.db")],
                   ["--storage", url_of(tmp_path / "a.db")]):
        result = run_in_process("--study", study, "--results-dir", second, "--threads", "1", "--dry-run", *source,
                                cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert line.replace("2 of", "4 of" if "--import-runs" not in source else "2 of") in result.stdout
    assert not (tmp_path / "new.db").exists()
    result = run_in_process("--study", study, "--storage", url_of(tmp_path / "b.db"), "--results-dir", second,
                            "--threads", "1", "--no-progress", "--import-runs", partial, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert line in result.stderr
    trained = [t for t in trials_of(tmp_path / "b.db", "kept") if "worker" in t.user_attrs]
    assert sorted(t.params["seed"] for t in trained) == [1, 1]
    assert {(t.user_attrs["precision"], t.user_attrs["fused_attn"]) for t in trained} == {("32-true", False)}
    assert all(t.user_attrs["config"]["precision"] == "auto" for t in trained)  # the study's config, as it says
    # read again before each trial: the second counts the first (other workers' and machines' runs count alike)
    assert [t.user_attrs["mode_source"] for t in sorted(trained, key=lambda t: t.number)] == [
        f"kept: the mode of {n} of this study's reported runs at this size" for n in (2, 3)]
    # the same seed in the same mode trains the same numbers as the first machine did
    first_acc = {(r["variant"], r["seed"]): r["test_acc"] for r in rows}
    out = tmp_path / "report_b"
    result = run_in_process("--study", study, "--storage", url_of(tmp_path / "b.db"), "--out", out, "--no-figures",
                            "--no-tensorboard", "--no-note", cwd=tmp_path, main=report_main)
    assert result.returncode == 0, result.stderr
    again = _rows(out / "runs.csv")
    assert {r["mode"] for r in again} == {"32-true + explicit attention"}
    assert {(r["variant"], r["seed"]): r["test_acc"] for r in again} == first_acc

    # --retrain-mode names the mode that must go: the rows train again in this machine's own mode, all of them
    result = run_in_process("--study", study, "--storage", url_of(tmp_path / "c.db"), "--results-dir", second,
                            "--threads", "1", "--no-progress", "--import-runs", partial, "--retrain-mode",
                            "32-true + explicit attention", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "precision auto, width 8" not in result.stderr
    assert {(t.user_attrs["precision"], t.user_attrs["fused_attn"]) for t in trials_of(tmp_path / "c.db", "kept")} \
        == {("32-true", True)}



def test_a_dry_run_on_a_cpu_not_measured_yet_says_the_run_will_measure(tmp_path, monkeypatch):
    """Where no table matches this CPU the dry run measures nothing: the line says the run would measure, not that
    it would pick the fp32 rule, and says the kept mode even where it equals the rule's."""
    from ablations.run.kept_modes import kept_lines
    from ablations.studies.spec import load_spec

    elsewhere = tmp_path / "packaged.json"
    elsewhere.write_text(json.dumps({"device": "cpu", "machine": {"cpu": "another", "cpu_flags": [], "threads": 1,
                                                                  "torch": "0.0"}, "cells": [{"embed_dim": 16, "tokens": 5, "times_s": dict.fromkeys(modes.MODE_KEYS, 1.0)}]}))
    monkeypatch.setattr(modes, "PACKAGED", {"cpu": elsewhere})
    spec = load_spec("residual_variants", "smoke")  # width 16, 5 tokens
    config = spec.run_config(spec.grid()[0], {"threads": 1})
    for fused in (True, False):
        kept = kept_modes(completed([trial(0, fused=fused, model={"embed_dim": 16, "img_size": 8, "patch_size": 4})]))
        assert kept_lines(kept, [config], tmp_path, 1) == [
            f"precision auto, width 16, 5 tokens: trains in 32-true + {'fused' if fused else 'explicit'} attention, "
            "the mode of 1 of this study's reported runs at this size; this machine alone would measure its modes "
            "first (no table for this CPU yet) (--import-runs with --retrain-mode MODE trains a mode's reported "
            "rows again in this machine's mode)"]


def test_the_report_lists_kept_modes_once_however_many_runs_counted_before_them():
    """Each kept run's ``mode_source`` names how many runs came before it; the HTML report's facts say it once."""
    from ablations.report.html import run_facts
    from ablations.report.load import Run, StudyData

    sources = ["measured: modes-cpu.json, cell width 64, 17 tokens"] + [
        f"kept: the mode of {n} of this study's reported runs at this size" for n in (1, 2, 3)]
    runs = [Run(number=i, state="complete", variant="standard", depth=4, seed=i, row="standard", acc=0.9,
                summary={"mode_source": s, "precision": "32-true", "fused_attn": False}) for i, s in enumerate(sources)]
    data = StudyData(name="s", kind="grid", runs=runs, rows=["standard"], row_variant={"standard": "standard"},
                     row_extras={"standard": ()}, depths=[4])
    facts = dict(run_facts(data))
    assert facts["how precision auto chose"] == ("measured: modes-cpu.json, cell width 64, 17 tokens; kept: the mode "
                                                 "the study's runs before them trained in (3 runs)")
