"""``--set FIELD=VALUE`` of ``ablations.run`` / ``ablations.report``: parsed and validated as RunConfig fields (one
line, exit 2), applied over the study's base (and the tuning stage's), and the naming rule that keeps a stored study
to one configuration: the same storage run with and without an override holds two studies."""

from __future__ import annotations

import optuna
import pytest
from helpers import STUDY_TEST_MARKS, trials_of, write_study

from ablations.report.cli import main as report_main
from ablations.run import main as run_main
from ablations.studies.overrides import apply_sets, parse_sets
from ablations.studies.spec import load_spec

pytestmark = STUDY_TEST_MARKS


def one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize(("sets", "fragments"), [
    (["foo=1"], ["--set: unknown field 'foo'; valid fields: residual,", "max_epochs", "precision"]),
    (["max_epochs=abc"], ["--set max_epochs: max_epochs must be an integer, got 'abc'"]),
    (["precision=fp9"], ["--set: unknown precision 'fp9'; valid choices: auto, 32-true"]),
    (["max_epochs=0"], ["--set: max_epochs must be a positive integer, got 0"]),
    (["max_epochs"], ["--set expects FIELD=VALUE, got 'max_epochs'"]),
    (["max_epochs=2", "max_epochs=3"], ["--set max_epochs is given twice"]),
    (["seed=3"], ["--set seed: seed is an axis of the study (values [0])"]),
    (["residual=rezero"], ["--set residual: each variant sets its residual"]),
    (["lr=0.1"], ["--set lr: the tuning stage chooses each variant's lr"]),
])
def test_bad_set_is_one_line_and_exit_2(tmp_path, capsys, sets, fragments):
    args = ["--study", "residual_variants", "--budget", "smoke", "--dry-run", "--results-dir", str(tmp_path)]
    code = run_main([*args, *(a for s in sets for a in ("--set", s))])
    assert code == 2
    line = one_error_line(capsys.readouterr().err)
    for fragment in fragments:
        assert fragment in line


def test_naming_rule_is_sorted_normalised_and_exempts_run_only_fields():
    spec = load_spec("residual_variants", "smoke")
    a = apply_sets(spec, parse_sets(["precision=32-true", "max_epochs=2"]))
    b = apply_sets(spec, parse_sets(["max_epochs=02", "precision=32-true",
                                     "threads=1", "data_dir=/somewhere"]))
    assert a.study_name == b.study_name == "residual_variants-smoke+max_epochs=2+precision=32-true"
    assert a.tune_stage().study_name == "residual_variants-smoke+max_epochs=2+precision=32-true-tune"
    assert apply_sets(spec, parse_sets(["threads=2"])).study_name == "residual_variants-smoke"
    assert (apply_sets(spec, parse_sets(["weight_decay=1e-3"])).study_name
            == apply_sets(spec, parse_sets(["weight_decay=0.001"])).study_name
            == "residual_variants-smoke+weight_decay=0.001")
    assert "+betas=0.8,0.99" in apply_sets(spec, parse_sets(["betas=[0.8, 0.99]"])).study_name
    # an option's path in the run's configuration tree is the same option, the same stored study
    assert parse_sets(["optim.weight_decay=1e-3", "trainer.max_epochs=2"]) == {"weight_decay": 1e-3, "max_epochs": 2}
    assert (apply_sets(spec, parse_sets(["optim.weight_decay=1e-3"])).study_name
            == "residual_variants-smoke+weight_decay=0.001")
    with pytest.raises(ValueError, match="--set: unknown field 'optim.depth'; valid fields: residual,"):
        parse_sets(["optim.depth=3"])
    # applied over the base: every point of the study, and of its tuning stage, trains with it
    for stage in (a, a.tune_stage()):
        configs = [stage.run_config(p) for p in stage.grid()]
        assert {(c.max_epochs, c.precision) for c in configs} == {(2, "32-true")}
    assert {spec.run_config(p).max_epochs for p in spec.grid()} == {1}  # the study file's own value


def test_dry_run_shows_the_overrides_and_the_study_name(tmp_path, capsys):
    code = run_main(["--study", "residual_variants", "--budget", "smoke", "--set", "max_epochs=2", "--set",
                     "precision=32-true", "--dry-run", "--results-dir", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert ("--set max_epochs=2, precision=32-true: over the study's base (and its tuning stage's); stored as its own "
            "study 'residual_variants-smoke+max_epochs=2+precision=32-true'") in out
    assert "precision: 32-true" in out


@pytest.mark.slow
def test_overrides_never_mix_and_the_report_finds_the_study(tmp_path, capsys):
    study = write_study(tmp_path / "tiny.yaml", base={"precision": "auto"})  # --set precision=32-true changes it
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    common = ["--study", str(study), "--storage", storage, "--results-dir", str(tmp_path / "results"),
              "--no-progress"]
    assert run_main(common) == 0
    assert run_main([*common, "--set", "max_epochs=2", "--set", "precision=32-true"]) == 0
    err = capsys.readouterr().err
    assert "its own stored study 'tiny+max_epochs=2+precision=32-true'" in err

    names = sorted(s.study_name for s in optuna.get_all_study_summaries(storage))
    assert names == ["tiny", "tiny+max_epochs=2+precision=32-true"]
    for name, epochs, precision in (("tiny", 1, "auto"), ("tiny+max_epochs=2+precision=32-true", 2, "32-true")):
        configs = [t.user_attrs["config"] for t in trials_of(tmp_path / "studies.db", name)]
        assert len(configs) == 2  # both variants, nothing else
        assert {(c["max_epochs"], c["precision"]) for c in configs} == {(epochs, precision)}
    stored = optuna.load_study(study_name="tiny+max_epochs=2+precision=32-true", storage=storage)
    assert stored.user_attrs["overrides"] == {"max_epochs": "2", "precision": "32-true"}
    assert optuna.load_study(study_name="tiny", storage=storage).user_attrs["overrides"] == {}

    # continuing a stored study under another configuration is refused, in one line
    for extra in (["--study-name", "tiny", "--set", "max_epochs=2"],
                  ["--study-name", "tiny+max_epochs=2+precision=32-true"]):
        assert run_main([*common, *extra]) == 2
        assert "one study never mixes two configurations" in one_error_line(capsys.readouterr().err)
    assert len(trials_of(tmp_path / "studies.db", "tiny")) == 2

    # the report finds the study from the same --set arguments and says which overrides it ran with
    out_dir = tmp_path / "report"
    assert report_main(["--study", str(study), "--storage", storage, "--results-dir", str(tmp_path / "results"),
                        "--set", "precision=32-true", "--set", "max_epochs=2", "--out", str(out_dir),
                        "--no-figures", "--no-tensorboard", "--no-note"]) == 0
    main_md = (out_dir / "main.md").read_text()
    assert "tiny+max_epochs=2+precision=32-true" in main_md
    assert "run with overrides of the study's base (--set): max_epochs=2, precision=32-true" in main_md
    assert report_main(["--study", str(study), "--storage", storage, "--results-dir", str(tmp_path / "results"),
                        "--out", str(tmp_path / "plain"), "--no-figures", "--no-tensorboard", "--no-note"]) == 0
    assert "overrides" not in (tmp_path / "plain" / "main.md").read_text()
    capsys.readouterr()
    assert report_main(["--study", str(study), "--storage", storage, "--set", "max_epochs=3", "--no-figures"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "study 'tiny+max_epochs=3' not found" in line and "tiny+max_epochs=2+precision=32-true" in line


@pytest.mark.slow
def test_an_in_process_study_leaves_the_callers_thread_excepthook_alone(tmp_path):
    """``ablations.run.main`` installs thread hooks for its study (a lost storage exits the worker at once): they
    must not outlive the call, or a later storage error in the caller's own threads would end its process."""
    import threading

    from helpers import url_of, write_study

    before = threading.excepthook
    study = write_study(tmp_path / "hooks.yaml")
    assert run_main(["--study", str(study), "--storage", url_of(tmp_path / "h.db"), "--results-dir",
                     str(tmp_path / "results"), "--no-progress"]) == 0
    assert threading.excepthook is before
