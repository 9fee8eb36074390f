"""The committed study files and their shared protocol (``extends:``, :mod:`ablations.studies.spec`).

``data/resolved_studies.json`` holds every committed study resolved under every budget (``dataclasses.asdict`` of
its ``StudySpec`` without ``source`` and ``description``; null for a budget the study does not define), written by
the loader before the studies shared a base file. A study file's edit that changes what a study trains changes
this file too, on purpose: ``python tests/test_study_files.py --write`` rewrites it from the current files.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ablations.studies.spec import BUDGETS, STUDY_DIR, available_studies, load_spec, resolved

FROZEN = Path(__file__).parent / "data" / "resolved_studies.json"
PROTOCOL = STUDY_DIR / "protocol" / "mnist5k.yaml"
REPO = Path(__file__).resolve().parents[1]


def resolved_specs() -> dict:
    """{study: {budget: asdict of its StudySpec without source and description, or None}} of every committed study."""
    out: dict = {}
    for name in available_studies():
        out[name] = {}
        for budget in BUDGETS:
            try:
                spec = dataclasses.asdict(load_spec(name, budget))
            except ValueError:
                out[name][budget] = None
                continue
            out[name][budget] = {k: v for k, v in spec.items() if k not in ("source", "description")}
    return out


def test_every_study_resolves_to_its_frozen_configuration_under_every_budget():
    frozen = json.loads(FROZEN.read_text())
    now = json.loads(json.dumps(resolved_specs()))  # tuples as lists, as frozen
    assert set(frozen) <= set(now)
    for name, budgets in frozen.items():
        for budget, spec in budgets.items():
            if spec is None:
                with pytest.raises(ValueError, match=f"defines no '{budget}' budget"):
                    load_spec(name, budget)
                continue
            assert now[name][budget] == spec, (name, budget)
            assert list(now[name][budget]["axes"]) == list(spec["axes"]), (name, budget)  # the grid's order


def test_every_study_extends_the_protocol_and_restates_none_of_it():
    """The mnist5k protocol is declared once: each committed study names it (or extends a study that does, as
    deep_premise extends deep_regime), and no study sets a value to what the protocol already gives it (in its
    base, its tuning, or its smoke and paper budgets' base, axes and tuning)."""
    protocol = yaml.safe_load(PROTOCOL.read_text())
    assert protocol["base"]["dataset"] == "mnist5k"
    studies = available_studies()
    for name, path in studies.items():
        raw = yaml.safe_load(path.read_text())
        parent = raw["extends"].removesuffix(".yaml")
        if parent in studies:  # a study of another study's points: that study extends the protocol
            assert yaml.safe_load(studies[parent].read_text())["extends"] == "protocol/mnist5k.yaml", name
        else:
            assert raw["extends"] == "protocol/mnist5k.yaml", name
        assert not {"kind", "metric", "direction"} & set(raw), name

        def restated(study: dict, base: dict, where: str) -> list[str]:
            return [f"{where}.{k}" for k, v in (study or {}).items() if k in (base or {}) and base[k] == v]

        repeats = restated(raw.get("base"), protocol["base"], "base") + restated(raw.get("tune"), protocol["tune"], "tune")
        for budget, settings in protocol["budgets"].items():
            mine = (raw.get("budgets") or {}).get(budget) or {}
            for key in ("base", "axes", "tune"):
                repeats += restated(mine.get(key), settings.get(key), f"budgets.{budget}.{key}")
        assert not repeats, (name, repeats)
        assert "dataset: mnist5k" not in path.read_text(), name


def test_every_study_point_builds_a_model_of_its_dataset_s_geometry():
    """Every point (tuning stage included) of every committed study and budget gives a backbone the dataset's images
    fit (e.g. a patch size that divides the image side), checked before any data is loaded."""
    from data import dataset_shape

    for name in available_studies():
        for budget in load_spec(name).budgets:
            spec = load_spec(name, budget)
            for stage in [spec, *([spec.tune_stage()] if spec.tune else [])]:
                for point in stage.grid():
                    config = stage.run_config(point)
                    try:
                        config.model_config(dataset_shape(config)).check()
                    except ValueError as exc:
                        pytest.fail(f"{name} ({budget}) {point}: {exc}")


def test_base_files_are_not_studies():
    studies = available_studies()
    assert "mnist5k" not in studies and all(p.parent == STUDY_DIR for p in studies.values())
    with pytest.raises(ValueError, match="unknown study 'mnist5k'"):
        load_spec("mnist5k")


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


BASE_FILE = """\
kind: grid
metric: best_val_acc
base: {dataset: synthetic, embed_dim: 8, num_heads: 2, lr: 0.002, weight_decay: 0.1, max_epochs: 3}
tune: {lr: [0.001, 0.002], seeds: [100, 101, 102], bounds: [0.0005, 0.008], metric: final_val_acc}
variants: [{label: standard, residual: standard}]
budgets:
  smoke:
    base: {max_epochs: 1, depth: 1}
    axes: {seed: [0]}
    tune: {lr: [0.004], seeds: [100]}
  paper: {base: {embed_dim: 16}}
"""


def test_a_study_is_laid_over_its_base_file_key_by_key(tmp_path):
    _write(tmp_path / "shared" / "base.yaml", BASE_FILE)
    path = _write(tmp_path / "mine.yaml", """\
name: mine
extends: shared/base.yaml
base: {embed_dim: 4, diagnostics_every: 2}
tune: {lr: [0.003]}
variants: [{label: a, residual: standard}, {label: b, residual: rezero}]
axes: {depth: [1, 2], seed: [0, 1]}
budgets:
  smoke: {base: {depth: 2}, axes: {depth: [1]}}
  paper: {base: {recipe: paper}}
""")
    spec = load_spec(str(path))
    # base: updated key by key; variants (a list) replaced; tune: updated, its lr list replaced
    assert spec.base == {"dataset": "synthetic", "embed_dim": 4, "num_heads": 2, "lr": 0.002, "weight_decay": 0.1,
                         "max_epochs": 3, "diagnostics_every": 2}
    assert [v.label for v in spec.variants] == ["a", "b"] and spec.kind == "grid" and spec.metric == "best_val_acc"
    assert spec.tune.lr == (0.003,) and spec.tune.seeds == (100, 101, 102) and spec.tune.metric == "final_val_acc"
    assert spec.budgets == ("smoke", "default", "paper")
    # a budget updates the base file's budget of that name: its base and axes key by key, its tune kept
    smoke = load_spec(str(path), "smoke")
    assert smoke.base == spec.base | {"max_epochs": 1, "depth": 2}
    assert smoke.axes == {"depth": [1], "seed": [0]} and list(smoke.axes) == ["depth", "seed"]
    assert smoke.tune.lr == (0.004,) and smoke.size == 2
    # a base that sets a recipe drops the recipe fields (lr, weight_decay) of the base it updates
    paper = load_spec(str(path), "paper")
    assert paper.base == {"dataset": "synthetic", "embed_dim": 16, "num_heads": 2, "max_epochs": 3,
                          "diagnostics_every": 2, "recipe": "paper"}


def test_a_base_may_name_settings_by_their_paths_in_the_run_configuration(tmp_path):
    """``optim: {lr: ...}``, ``optim.lr`` and ``lr`` are one setting: a study's nested base is laid over its base
    file's flat one by the options' flat names, and the trial trains with it (``config.optim.lr``)."""
    _write(tmp_path / "shared" / "base.yaml", BASE_FILE)
    path = _write(tmp_path / "mine.yaml", """\
name: mine
extends: shared/base.yaml
base: {optim: {lr: 0.003}, model.embed_dim: 4, data: {batch_size: 16}}
variants: [{label: a, residual: standard, overrides: {optim.weight_decay: 0.2}}]
axes: {model.depth: [1], seed: [0]}
budgets:
  smoke: {base: {trainer: {max_epochs: 1}}}
""")
    spec = load_spec(str(path))
    assert spec.base == {"dataset": "synthetic", "embed_dim": 4, "num_heads": 2, "lr": 0.003, "weight_decay": 0.1,
                         "max_epochs": 3, "batch_size": 16}
    assert spec.axes == {"depth": [1], "seed": [0]} and spec.variants[0].overrides == {"weight_decay": 0.2}
    config = spec.run_config(spec.grid()[0])
    assert (config.optim.lr, config.optim.weight_decay, config.model.depth, config.data.batch_size) == (0.003, 0.2, 1, 16)
    assert load_spec(str(path), "smoke").base["max_epochs"] == 1
    _write(path, path.read_text().replace("optim: {lr: 0.003}", "optim: {depth: 3}"))
    with pytest.raises(ValueError, match=r"base: unknown key 'optim.depth'; valid keys: residual"):
        load_spec(str(path))


def test_a_budget_may_append_rows_to_the_study_s_variants(tmp_path):
    """``add_variants`` appends a budget's own rows (e.g. the control a larger size needs) after the study's, which
    the budget then keeps as they are; anything but a list is a one-line error."""
    _write(tmp_path / "shared" / "base.yaml", BASE_FILE)
    path = _write(tmp_path / "mine.yaml", """\
name: mine
extends: shared/base.yaml
variants: [{label: a, residual: standard}, {label: b, residual: rezero}]
axes: {seed: [0]}
budgets:
  paper: {add_variants: [{label: c, residual: skipinit}]}
""")
    assert [v.label for v in load_spec(str(path)).variants] == ["a", "b"]
    paper = load_spec(str(path), "paper")
    assert [(v.label, v.residual) for v in paper.variants] == [("a", "standard"), ("b", "rezero"), ("c", "skipinit")]
    _write(path, path.read_text().replace("[{label: c, residual: skipinit}]", "{label: c, residual: skipinit}"))
    with pytest.raises(ValueError) as caught:
        load_spec(str(path), "paper")
    assert "\n" not in str(caught.value) and "add_variants is a list of variants to append, got dict" in str(caught.value)


def test_a_base_file_may_extend_another(tmp_path):
    _write(tmp_path / "p" / "root.yaml", BASE_FILE)
    _write(tmp_path / "p" / "wide.yaml", "extends: root.yaml\nbase: {embed_dim: 32}\n")
    path = _write(tmp_path / "s.yaml", "name: s\nextends: p/wide.yaml\naxes: {seed: [0]}\n")
    spec = load_spec(str(path))
    assert spec.base["embed_dim"] == 32 and spec.base["num_heads"] == 2 and spec.size == 1


@pytest.mark.parametrize(("files", "message"), [
    ({"s.yaml": "name: s\nextends: nowhere.yaml\n"}, "extends 'nowhere.yaml', but '{root}/nowhere.yaml' does not exist"),
    ({"s.yaml": "name: s\nextends: [a, b]\n"}, "'extends' must be the path of a base file"),
    ({"s.yaml": "name: s\nextends: b.yaml\n", "b.yaml": "extends: s.yaml\n"}, "a circle of base files"),
    ({"s.yaml": "name: s\nextends: s.yaml\n"}, "a circle of base files"),
    ({"s.yaml": "name: s\nextends: b.yaml\n", "b.yaml": "colour: blue\n"},
     "base file '{root}/b.yaml' (extended by '{root}/s.yaml'): unknown key 'colour'; valid keys: extends, name"),
    ({"s.yaml": "name: s\nextends: b.yaml\n", "b.yaml": "- a list\n"}, "must hold a mapping"),
])
def test_bad_extends_is_a_one_line_error(tmp_path, files, message):
    for name, text in files.items():
        _write(tmp_path / name, text)
    with pytest.raises(ValueError) as caught:
        load_spec(str(tmp_path / "s.yaml"))
    text = str(caught.value)
    assert "\n" not in text and message.format(root=tmp_path.resolve() if "but" in message else tmp_path) in text


def test_the_report_writes_the_resolved_study(tmp_path):
    """The report's study.yaml is the study as it trained: the protocol's settings resolved into it."""
    runs = Path(__file__).parent / "data" / "earlier_format" / "modern_residuals_runs.csv"
    proc = subprocess.run([sys.executable, "-m", "ablations.report", "--study", "modern_residuals", "--runs", str(runs),
                           "--out", str(tmp_path), "--no-figures"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = yaml.safe_load((tmp_path / "study.yaml").read_text())
    assert written == resolved(load_spec("modern_residuals"))
    assert written["source"] == "ablations/studies/modern_residuals.yaml"
    assert written["base"]["dataset"] == "mnist5k" and written["base"]["patch_size"] == 7  # from the protocol
    assert written["tune"]["lr"] == [0.001, 0.002, 0.004, 0.008] and written["metric"] == "test_acc"
    assert str(tmp_path / "study.yaml") in proc.stdout


if __name__ == "__main__":  # python tests/test_study_files.py --write: freeze the studies as they resolve now
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_study_files.py --write  (rewrites tests/data/resolved_studies.json)")
    FROZEN.write_text(json.dumps(resolved_specs(), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {FROZEN}")


def test_a_row_with_its_own_tune_axes_tunes_there_only_and_uses_that_rate_at_every_depth(tmp_path):
    """deep_regime's CompleteP tunes at depth 4 only (``tune_axes``): its tuning points are depth 4 alone (the other rows
    tune at every depth), and its depth-64 points take the depth-4 cell's rate; a value outside the study's axis is
    refused in one line naming the axis and its values."""
    spec = load_spec("deep_regime")
    tune = spec.tune_stage()
    depths = {}
    for point in tune.grid():
        depths.setdefault(point["variant"], set()).add(point["depth"])
    assert depths["completep"] == {4}
    assert depths["standard"] == {4, 16, 64}
    assert len(tune.grid()) == (len(depths) - 1) * 3 * 4 * 3 + 4 * 3  # rows x depths x rates x seeds
    assert spec.tune_key({"variant": "completep", "depth": 64, "seed": 0}) == \
        spec.tune_key({"variant": "completep", "depth": 4, "seed": 0})
    assert spec.tune_key({"variant": "standard", "depth": 64, "seed": 0}) != \
        spec.tune_key({"variant": "standard", "depth": 4, "seed": 0})
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "bad", "extends": str(PROTOCOL), "axes": {"depth": [2, 4], "seed": [0]},
                                   "variants": [{"label": "standard", "residual": "standard",
                                                 "tune_axes": {"depth": [8]}}]}))
    with pytest.raises(ValueError, match=r"tune_axes.depth \[8\] must list values of one of the study's axes: "
                                         r"depth \[2, 4\]"):
        load_spec(str(bad))


OWN_DATA = """\
name: mine
extends: protocol/mnist5k.yaml
base: {dataset: imagefolder, data_dir: /data/my_images}
variants: [{label: standard, residual: standard}, {label: rezero, residual: rezero}]
axes: {depth: [4], seed: [0, 1, 2, 3, 4]}
"""


def test_a_study_of_its_own_data_keeps_it_under_the_protocol_s_small_budgets(tmp_path):
    """A study file outside the repository finds the shared protocol by ``protocol/mnist5k.yaml``; the protocol's
    smoke and quick budgets shrink it (epochs, seeds, width, rates) and never swap its images for digits or its
    patch size for the protocol's; a budget of the study file itself may still change its data."""
    path = _write(tmp_path / "elsewhere" / "mine.yaml", OWN_DATA)
    default, smoke, quick = (load_spec(str(path), b) for b in ("default", "smoke", "quick"))
    for spec in (default, smoke, quick):
        assert (spec.base["dataset"], spec.base["data_dir"]) == ("imagefolder", "/data/my_images")
        assert "patch_size" not in spec.base and "dataset_options" not in spec.base  # the images' own geometry
    assert (default.base["max_epochs"], smoke.base["max_epochs"], quick.base["max_epochs"]) == (30, 1, 10)
    assert smoke.base["embed_dim"] == 16 and default.base["embed_dim"] == 64
    assert (default.size, smoke.size, quick.size) == (10, 2, 6)
    assert (smoke.tune.seeds, quick.tune.seeds, quick.tune.lr) == ((100,), (100,), (0.002, 0.004, 0.008))
    assert quick.first_look() and smoke.first_look()
    # the committed studies, which name no dataset, still take the protocol's data and its smoke budget's digits
    assert load_spec("residual_variants", "smoke").base["dataset"] == "digits"
    assert load_spec("frontier", "quick").base["dataset"] == "mnist5k"
    # the study's own budget may change its data
    _write(path, OWN_DATA + "budgets: {smoke: {base: {dataset: digits}}}\n")
    assert load_spec(str(path), "smoke").base["dataset"] == "digits"


def test_extends_that_finds_nothing_names_both_places_and_the_protocol(tmp_path):
    path = _write(tmp_path / "mine.yaml", OWN_DATA.replace("protocol/mnist5k.yaml",
                                                          "ablations/studies/protocol/mnist5k.yaml"))
    with pytest.raises(ValueError) as caught:
        load_spec(str(path))
    text = str(caught.value)
    assert "\n" not in text and f"'{tmp_path.resolve()}/ablations/studies/protocol/mnist5k.yaml' does not exist" in text
    assert f"relative to the study file or to {STUDY_DIR}" in text and "'extends: protocol/mnist5k.yaml'" in text


@pytest.mark.parametrize(("classes", "threshold"), [(10, 0.5), (100, 0.05), (2, 0.75), (4, 0.625), (5, 0.6)])
def test_the_protocol_s_floor_stays_below_certainty_for_few_classes(classes, threshold):
    """5x chance of 10 classes is 50%; of 2 classes it would be 250% (every run failed): the floor is at most halfway
    from chance to 100%."""
    floor = load_spec("residual_variants").floor
    assert floor.chance_multiple == 5 and floor.threshold(classes) == pytest.approx(threshold)
    assert floor.failed(threshold - 0.01, classes) and not floor.failed(threshold, classes)


def test_deep_premise_trains_deep_regime_s_pre_ln_and_post_ln_points_so_its_runs_join_it():
    """deep_premise measures the premise first: its every point (tuning stage and reported grid) is a point of
    deep_regime with the same run configuration, so deep_regime continues from its runs.csv and trains the other
    rows only; its claims compare pre-LN with post-LN at each depth and pre-LN at 64 blocks with pre-LN at 4."""
    premise, regime = load_spec("deep_premise"), load_spec("deep_regime")
    for mine, theirs in ((premise.tune_stage(), regime.tune_stage()), (premise, regime)):
        points = mine.grid()
        assert {p["variant"] for p in points} == {"standard", "post_ln"}
        assert {p["depth"] for p in points} == {4, 16, 64}
        keys = [sorted(p.items()) for p in theirs.grid()]
        for point in points:
            assert sorted(point.items()) in keys, point
            assert mine.run_config(point) == theirs.run_config(point), point
    assert len(premise.tune_stage().grid()) == 2 * 3 * 4 * 3 and len(premise.grid()) == 2 * 3 * 10
    falls = {c.id: c for c in premise.claims}["pre_ln_falls_with_depth"]
    assert (falls.variant, falls.depth, falls.baseline, falls.baseline_depth, falls.direction) == \
        ("standard", 64, "standard", 4, "lower")
