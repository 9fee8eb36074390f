"""``python -m ablations.run --until STAGE``: the study's stages up to that one, then a clean stop (exit 0) with one
line; the same command without it continues with the rest and trains nothing twice."""

from __future__ import annotations

import optuna
import pytest
from helpers import TWO_VARIANTS, assert_one_line_error, run_in_process, url_of, write_study

#: two rates on three tuning seeds, the grid its own bounds (no extension); a claim, so the study has later stages
TUNE = {"lr": [1e-3, 4e-3], "seeds": [100, 101, 102], "bounds": [1e-3, 4e-3], "metric": "final_val_acc"}
CLAIM = {"id": "c", "claim": "rezero beats", "source": "test", "variant": "rezero", "baseline": "standard",
         "direction": "higher"}


def _counts(db) -> dict[str, int]:
    """Completed trials per stored study."""
    url = url_of(db)
    return {s.study_name: len(optuna.load_study(study_name=s.study_name, storage=url).get_trials(
        states=(optuna.trial.TrialState.COMPLETE,))) for s in optuna.get_all_study_summaries(url)}


@pytest.mark.slow  # every stage of a tiny tuned study with a claim (~30 s on 2 cores)
def test_until_stops_after_its_stage_and_the_same_command_continues(tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = write_study(tmp_path / "staged.yaml", variants=TWO_VARIANTS, axes={"seed": [0, 1]}, tune=TUNE,
                        claims=[CLAIM])
    db = tmp_path / "o.db"
    args = ("--study", study, "--storage", url_of(db), "--no-progress")
    tuned = run_in_process(*args, "--until", "tune", cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stderr
    assert tuned.stderr.strip().splitlines()[-1] == (
        "stopped after the tuning stage (--until tune): the reported grid, its contending rates and a second look "
        "may follow; the same command without --until continues")
    assert _counts(db) == {"staged-tune": 12, "staged": 0}  # 2 variants x 2 rates x 3 seeds; nothing reported yet
    reported = run_in_process(*args, "--until", "report", cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    assert "stopped after the reported grid (--until report)" in reported.stderr
    assert _counts(db) == {"staged-tune": 12, "staged": 4}  # the tuning stage trained nothing again
    rest = run_in_process(*args, cwd=tmp_path)
    assert rest.returncode == 0, rest.stderr
    assert "--until" not in rest.stderr
    after = _counts(db)
    assert after["staged-tune"] == 12 and after["staged"] == 4  # the later stages only, in their own studies
    # the dry run says where --until stops
    dry = run_in_process(*args, "--until", "report", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert ("--until report: the run stops after the reported grid; its contending rates and a second look are left "
            "to the same command without --until") in dry.stdout


def test_until_a_stage_the_study_does_not_have_is_one_line(tmp_path):
    study = write_study(tmp_path / "untuned.yaml", variants=TWO_VARIANTS, axes={"seed": [0]})
    for stage in ("tune", "contend"):
        result = run_in_process("--study", study, "--storage", url_of(tmp_path / "o.db"), "--until", stage,
                                cwd=tmp_path)
        assert_one_line_error(result, f"--until {stage}: study '{study}' has no tuning stage")
        assert "valid choices for it: report" in result.stderr
    assert not (tmp_path / "o.db").exists()  # refused before anything is stored
    result = run_in_process("--study", study, "--until", "round", cwd=tmp_path)
    assert_one_line_error(result, "--until")  # argparse's own: the valid choices named
    assert "'tune', 'report', 'contend'" in result.stderr
