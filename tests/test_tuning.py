"""The tuning stage of a study (``tune:``): each variant's learning rate chosen on tuning seeds that are never
reported, by mean validation accuracy, stored with the study; the reported grid trains at it."""

from __future__ import annotations

import json
import re

import optuna
import pytest
from helpers import run_in_process, url_of, write_study
from optuna.trial import TrialState, create_trial

from ablations.run.spec import available_studies, load_spec
from ablations.run.study import TUNE_GRID, choose_lrs

VARIANTS = [{"label": "standard", "residual": "standard"}, {"label": "rezero", "residual": "rezero"}]


def spec_with(tmp_path, tune: dict, axes: dict | None = None):
    path = write_study(tmp_path / "tuned.yaml", variants=VARIANTS, tune=tune,
                       axes=axes or {"depth": [1, 2], "seed": [0, 1]})
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
    ({"lr": [1e-3], "seeds": [100], "steps": 3}, "unknown key 'steps'; valid keys: lr, seeds, metric, axes"),
])
def test_a_bad_tune_section_is_a_one_line_error(tmp_path, tune, fault):
    with pytest.raises(ValueError, match=re.escape(fault)) as exc:
        spec_with(tmp_path, tune)
    assert "\n" not in str(exc.value)


def test_the_tuning_stage_is_a_grid_of_its_own_on_the_tuning_seeds(tmp_path):
    spec = spec_with(tmp_path, {"lr": [1e-3, 4e-3], "seeds": [100, 101]})
    tune = spec.tune_stage()
    assert tune.study_name == "tuned-tune" and tune.stage == "tune" and tune.tune is None
    assert tune.size == 2 * 2 * 2 * 2  # variants x depths x seeds x lrs
    assert {p["seed"] for p in tune.grid()} == {100, 101} and {p["lr"] for p in tune.grid()} == {1e-3, 4e-3}
    assert tune.run_config({"variant": "rezero", "depth": 2, "seed": 100, "lr": 4e-3}).lr == 4e-3
    # one lr per variant and depth; tune.axes pins an axis: its single tuned value stands for all of its values
    assert spec.tune_key({"variant": "rezero", "depth": 2, "seed": 0}) == json.dumps(["rezero", [["depth", 2]]])
    pinned = spec_with(tmp_path, {"lr": [1e-3], "seeds": [100], "axes": {"depth": [1]}})
    assert pinned.tune_stage().size == 2 * 1 * 1 * 1
    assert pinned.tune_key({"variant": "standard", "depth": 2, "seed": 1}) == json.dumps(["standard", [["depth", 1]]])


def add(study, params: dict, value: float | None, diverged: bool = False) -> None:
    """A COMPLETE tuning trial of ``params`` whose best_val_acc is ``value``."""
    dists = {k: optuna.distributions.CategoricalDistribution([v]) for k, v in params.items()}
    study.add_trial(create_trial(params=params, distributions=dists, value=value or 0.0, state=TrialState.COMPLETE,
                                 user_attrs={"best_val_acc": value, "diverged": diverged}))


def test_the_lr_with_the_highest_mean_validation_accuracy_is_chosen(tmp_path):
    """Hand-computed: per (variant, depth) the mean over the two tuning seeds; a diverged run counts as 0; a tie
    goes to the rate listed first."""
    spec = spec_with(tmp_path, {"lr": [1e-3, 4e-3], "seeds": [100, 101]}, axes={"depth": [1], "seed": [0]})
    study = optuna.create_study()
    acc = {("standard", 1e-3): (0.80, 0.84), ("standard", 4e-3): (0.90, 0.70),  # means 0.82 vs 0.80 -> 1e-3
           ("rezero", 1e-3): (0.60, 0.62), ("rezero", 4e-3): (0.99, None)}  # 4e-3 diverged on seed 101: 0.495
    for (variant, lr), values in acc.items():
        for seed, value in zip((100, 101), values, strict=True):
            add(study, {"variant": variant, "depth": 1, "seed": seed, "lr": lr}, value, diverged=value is None)
    choice, means = choose_lrs(spec, study)
    standard, rezero = (json.dumps([v, [["depth", 1]]]) for v in ("standard", "rezero"))
    assert choice == {standard: 1e-3, rezero: 1e-3}
    assert means[standard] == pytest.approx({"0.001": 0.82, "0.004": 0.80})
    assert means[rezero] == pytest.approx({"0.001": 0.61, "0.004": 0.495})
    tie = optuna.create_study()
    for variant in ("standard", "rezero"):
        for lr in (1e-3, 4e-3):
            for seed in (100, 101):
                add(tie, {"variant": variant, "depth": 1, "seed": seed, "lr": lr}, 0.5)
    assert set(choose_lrs(spec, tie)[0].values()) == {1e-3}
    incomplete = optuna.create_study()
    add(incomplete, {"variant": "standard", "depth": 1, "seed": 100, "lr": 1e-3}, 0.5)
    with pytest.raises(ValueError, match="tuning stage incomplete: standard depth=1: no result at lr"):
        choose_lrs(spec, incomplete)


def test_a_changed_tuning_grid_is_refused_before_anything_runs(tmp_path):
    """A study continued later reuses its stored choice; a study file whose tune section changed would mix two
    choices in one table: refused loudly, nothing trained."""
    path = write_study(tmp_path / "tuned.yaml", variants=VARIANTS, tune={"lr": [1e-3, 4e-3], "seeds": [100]},
                       axes={"seed": [0]})
    db = tmp_path / "o.db"
    study = optuna.create_study(study_name="tuned", storage=url_of(db))
    study.set_user_attr(TUNE_GRID, {"lr": [0.01], "seeds": [100], "metric": "best_val_acc", "axes": {}})
    result = run_in_process("--study", str(path), "--storage", url_of(db), "--results-dir", "results", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "chose its learning rates with the tuning grid" in line and "--study-name NEW_NAME" in line
    assert [s.study_name for s in optuna.get_all_study_summaries(url_of(db))] == ["tuned"]
    assert not (tmp_path / "results" / "runs").exists()


# --- parameter-matched controls ----------------------------------------------------------------------------------
def param_count(config) -> int:
    from data import dataset_shape
    from lit_modules import VisionTransformer

    model = VisionTransformer(config.model_config(dataset_shape(config)))  # every backbone field the run trains
    return sum(p.numel() for p in model.parameters())


PROTOCOL_STUDIES = [name for name in available_studies() if load_spec(name).tune is not None]


@pytest.mark.parametrize("name", PROTOCOL_STUDIES)
def test_a_variant_with_5_percent_more_parameters_has_a_matched_standard_row(name):
    """The fair protocol's control: in a study under it (one with a tuning stage), every variant that adds >= 5%
    parameters over standard (same depth) has a row ``standard_params_matched_<label>`` (standard, wider MLP)
    whose parameter count is within 1% of the variant's (or ``<row>_params_matched_<label>``: e.g. the same
    residual made deeper, where the extra parameters are whole blocks)."""
    spec = load_spec(name)
    labels = [v.label for v in spec.variants]
    for depth in spec.axes.get("depth", [None]):
        point = {"seed": spec.axes.get("seed", [0])[0]} | ({"depth": depth} if depth is not None else {})
        counts = {label: param_count(spec.run_config({"variant": label} | point)) for label in labels}
        for label in labels:
            if label == "standard" or "_params_matched_" in label or counts[label] < 1.05 * counts["standard"]:
                continue
            controls = [c for c in labels if "_params_matched_" in c and abs(counts[c] / counts[label] - 1) <= 0.01]
            assert controls, f"{name}: {label} has {counts[label] / counts['standard'] - 1:+.1%} parameters at " \
                             f"depth {depth} but no row standard_params_matched_{label} within 1% of it"
