"""What the dashboards show (ablations/dashboard.py): TensorBoard tag groups and run names, the study-wide HParams
table, numeric Optuna axes, the extra loggers; and, end to end, what `tensorboard` and `optuna-dashboard` serve
over HTTP for a real study (read through their HTTP APIs, waiting on readiness, never on a timer)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from helpers import EXAMPLE_SEARCH, STUDY_TEST_MARKS, run_cli, url_of, write_study
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from pg import free_port
from polling import HANG_LIMIT_S, get_json, serving, study_experiment_loaded, wait_until_answers

from ablations.dashboard import (
    display_tag,
    internal_tag,
    run_name,
    study_columns,
    study_constants,
    write_study_hparams,
)
from ablations.report.aggregate import STUDY_METRICS
from ablations.run.objective import categorical_axes, suggest, suggest_axis
from ablations.studies.spec import load_spec
from ablations.training import HP_METRICS

pytestmark = STUDY_TEST_MARKS


# --- tag groups -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("internal", "shown"), [
    ("train/loss", "1_train/loss"),
    ("val/acc", "2_val/acc"),
    ("hp/best_val_acc", "3_summary/best_val_acc"),
    ("diag/ratio_mean/attn/03", "4_diag.ratio/ratio_mean/attn/03"),
    ("diag/skip_scale/mlp/00", "4_diag.ratio/skip_scale/mlp/00"),
    ("diag/stream_rms/02", "4_diag.ratio/stream_rms/02"),
    ("diag/attn_sim_adj/01", "5_diag.similarity/attn_sim_adj/01"),
    ("diag/similar_blocks", "5_diag.similarity/similar_blocks"),
    ("diag/attn_sim_full", "5_diag.similarity/attn_sim_full"),
    ("diag/grad_norm/00", "6_diag.gradients/grad_norm/00"),
    ("diag/param/attn/00/gamma_mean", "7_diag.params/param/attn/00/gamma_mean"),
    ("diag/dca_weights", "8_diag.mixing/dca_weights"),
    ("diag/something_new/00", "9_diag.other/something_new/00"),
    ("lr", "lr"), ("epoch", "epoch"), ("custom/x", "custom/x"),
])
def test_tags_are_grouped_for_reading_and_map_back(internal, shown):
    assert display_tag(internal) == shown
    assert internal_tag(shown) == internal
    assert internal_tag(internal) == internal  # a run written before the grouping reads the same


def test_tensorboard_opens_train_and_val_first():
    """TensorBoard's time series sorts the groups (the tag up to its first '/') with digits first and opens the
    first two: those must be train and val, then the summary, then the diagnostics."""
    tags = ["diag/ratio_mean/attn/00", "diag/attn_sim_adj/00", "diag/grad_norm/00", "diag/param/attn/00/alpha",
            "hp/best_val_acc", "train/loss", "val/acc", "lr", "epoch"]
    groups = list(dict.fromkeys(display_tag(t).split("/", 1)[0] for t in sorted(tags, key=display_tag)))
    assert groups[:3] == ["1_train", "2_val", "3_summary"]
    assert groups[3:7] == ["4_diag.ratio", "5_diag.similarity", "6_diag.gradients", "7_diag.params"]


# --- run names ------------------------------------------------------------------------------------------------------
def test_run_name_says_variant_depth_seed_and_other_axes():
    spec = load_spec(EXAMPLE_SEARCH)
    params = {"variant": "layerscale", "depth": 12, "seed": 2}
    config = spec.run_config({"variant": "layerscale"} | {k: v for k, v in params.items() if k in spec.axes})
    assert run_name(params, config, spec.axes).startswith(f"layerscale/depth={config.depth}/seed={config.seed}")

    class Config:
        depth, seed = 6, 1

    assert run_name({"variant": "a b", "lr": 0.001}, Config, ["lr", "depth"]) == "a_b/depth=6/seed=1/lr=0.001"
    assert run_name({"variant": "x"}, Config, [], trial=12) == "x/depth=6/seed=1/trial_0012"


# --- numeric Optuna axes --------------------------------------------------------------------------------------------
def _ask(values, *, grid: bool, enqueue=None, categorical=False):
    study = optuna.create_study()
    if enqueue is not None:
        study.enqueue_trial({"axis": enqueue})
    trial = study.ask()
    value = suggest_axis(trial, "axis", values, grid=grid, categorical=categorical)
    return value, trial.distributions["axis"]


def test_grid_axes_are_numeric_and_enqueued_values_come_back():
    value, dist = _ask([2, 12, 6], grid=True, enqueue=6)
    assert value == 6 and isinstance(value, int) and dist == IntDistribution(2, 12)
    value, dist = _ask([1e-6, 1e-3, 0.1], grid=True, enqueue=1e-3)
    assert value == 1e-3 and dist == FloatDistribution(1e-6, 0.1, log=True)  # spans 10^5: log scale
    value, dist = _ask([0.0, 0.5], grid=True, enqueue=0.5)
    assert value == 0.5 and dist == FloatDistribution(0.0, 0.5)  # includes 0: linear
    for labels in (["a", "b"], [True, False], [1, "auto"]):
        value, dist = _ask(labels, grid=True, enqueue=labels[1])
        assert value == labels[1] and isinstance(dist, CategoricalDistribution)
    value, dist = _ask([2, 6, 12], grid=True, enqueue=12, categorical=True)  # a study stored as categorical
    assert value == 12 and isinstance(dist, CategoricalDistribution)


def test_search_axes_never_sample_values_outside_the_list():
    for _ in range(5):
        value, dist = _ask([4, 8, 12], grid=False)
        assert value in (4, 8, 12) and dist == IntDistribution(4, 12, step=4)
    value, dist = _ask([2, 6, 12], grid=False)  # uneven: a range would sample 3, 4, 5, ...
    assert value in (2, 6, 12) and isinstance(dist, CategoricalDistribution)


def test_a_study_stored_with_categorical_axes_keeps_them(tmp_path):
    write_study(tmp_path / "old.yaml", axes={"depth": [1, 2], "seed": [0]})
    spec = load_spec(str(tmp_path / "old.yaml"))
    study = optuna.create_study()
    old = study.ask()
    old.suggest_categorical("depth", [1, 2])  # how studies were stored before the axes became numeric
    study.tell(old, 0.5)
    assert categorical_axes(study, spec) == {"depth"}
    trial = study.ask()
    params = suggest(trial, spec, categorical_axes(study, spec))  # does not raise: same kind as stored
    assert isinstance(trial.distributions["depth"], CategoricalDistribution) and params["depth"] in (1, 2)
    assert isinstance(trial.distributions["seed"], IntDistribution)


# --- HParams --------------------------------------------------------------------------------------------------------
def test_study_hparams_list_what_varies_then_the_metrics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    spec = load_spec(EXAMPLE_SEARCH)
    columns = study_columns(spec)
    assert list(columns)[0] == "variant" and list(columns)[1:1 + len(spec.axes)] == list(spec.axes)
    searched = [f"{label}.{o}" for label, opts in spec.space.items() for o in opts]
    assert searched and list(columns)[1 + len(spec.axes):] == searched
    constants = study_constants(spec)
    assert constants["embed_dim"] == spec.base.get("embed_dim", 64) and "residual" not in constants

    write_study_hparams(tmp_path, spec, HP_METRICS)
    write_study_hparams(tmp_path, spec, HP_METRICS)  # rewriting replaces the study's event file
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
    ea = EventAccumulator(str(tmp_path), size_guidance={TENSORS: 0})
    ea.Reload()
    experiment = HParamsPluginData.FromString(ea.PluginTagToContent("hparams")["_hparams_/experiment"]).experiment
    infos = {i.name: i for i in experiment.hparam_infos}
    assert list(infos) == list(columns)
    assert "batch_size" not in infos and "lr" not in infos  # constants are not columns
    assert all(infos[name].differs == (len(values) > 1) for name, values in columns.items())
    assert [m.name.tag for m in experiment.metric_infos] == [display_tag(m) for m in HP_METRICS]
    assert experiment.metric_infos[0].display_name == "test_acc"  # the primary metric first
    text = ea.Tensors("study/constants/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "| embed_dim |" in text and "| residual |" not in text


def test_processes_of_one_study_writing_its_hparams_at_once_never_fail(tmp_path):
    """Independent processes of one study each write its HParams file when they start: one writer never removes
    or reads another's half-made file (three writers side by side, ten writes each, every write returns its file)."""
    import threading

    spec = load_spec(EXAMPLE_SEARCH)
    errors, written = [], []

    def write() -> None:
        for _ in range(10):
            try:
                written.append(write_study_hparams(tmp_path, spec, HP_METRICS))
            except Exception as exc:  # noqa: BLE001 - collected: the test names every failure
                errors.append(repr(exc))

    threads = [threading.Thread(target=write) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(written) == 30
    assert all(path.parent == tmp_path and path.name.endswith(".study") for path in written)
    write_study_hparams(tmp_path, spec, HP_METRICS)  # one writer alone leaves exactly one file, and no staging folder
    assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1
    assert [p.name for p in tmp_path.parent.iterdir() if p.name.startswith(f".{tmp_path.name}-")] == []


# --- end to end: the dashboards' own HTTP APIs on a real study ------------------------------------------------------
def _tags_loaded(tags: object, names: set[str]) -> bool:
    """TensorBoard lists a run as soon as it finds its folder and loads its events later: ready when every run's
    summary tags (the last ones a run writes) are loaded."""
    last = {display_tag(m) for m in HP_METRICS}
    return isinstance(tags, dict) and all(last <= set(tags.get(name, {})) for name in names)


@pytest.mark.slow
def test_tensorboard_and_optuna_dashboard_show_names_columns_and_numeric_axes(tmp_path, monkeypatch):
    write_study(tmp_path / "dash.yaml", axes={"depth": [2, 1], "seed": [0]},
                base={"diagnostics_every": 1, "max_epochs": 2})
    spec = load_spec(str(tmp_path / "dash.yaml"))
    db = tmp_path / "o.db"
    monkeypatch.setenv("WANDB_MODE", "offline")  # W&B never goes online in a test
    result = run_cli("--study", "dash.yaml", "--storage", url_of(db), "--results-dir", "results", "--no-progress",
                     "--logger", "csv", "--logger", "mlflow", "--logger", "wandb", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    runs_dir = tmp_path / "results" / "runs" / "dash"
    names = {f"{v.label}/depth={d}/seed=0" for v in spec.variants for d in (1, 2)}

    # TensorBoard: run names, HParams columns, grouped tags (each read once TensorBoard has loaded it)
    port = free_port()
    with serving([sys.executable, "-m", "tensorboard.main", "--logdir", runs_dir, "--port", str(port),
                  "--host", "127.0.0.1", "--reload_interval", "1"], tmp_path / "tensorboard.log") as tb:
        base = f"http://127.0.0.1:{port}"
        runs = wait_until_answers(f"{base}/data/runs", tb, ready=lambda r: names | {".", "agg"} <= set(r),
                                  what="TensorBoard's run list")
        aggregates = {f"agg/{v.label}/depth={d}" for v in spec.variants for d in (1, 2)}
        # ".": the study's HParams configuration and constants; "agg": the seed aggregates' layout and claims
        assert set(runs) == names | {".", "agg"} | aggregates
        experiment = wait_until_answers(f"{base}/data/plugin/hparams/experiment", tb, body={"experimentName": ""},
                                        ready=study_experiment_loaded, what="TensorBoard's HParams experiment")
        columns = [h["name"] for h in experiment["hparamInfos"]]
        assert set(columns) == {"variant", "depth", "seed", "lr"}  # lr: the rate each aggregate row trained at
        assert set(columns[:2]) == {"variant", "depth"}  # what varies comes first (seed and lr have one value here)
        metrics = [m["name"]["tag"] for m in experiment["metricInfos"]]
        assert metrics == [display_tag(m) for m in STUDY_METRICS]  # the summary's, then the aggregates' columns
        assert experiment["metricInfos"][0]["displayName"] == "test_acc"  # the primary metric first
        tags = wait_until_answers(f"{base}/data/plugin/scalars/tags", tb, ready=lambda t: _tags_loaded(t, names),
                                  what="TensorBoard's scalar tags of every run")
        some_run = sorted(names)[0]
        groups = sorted({t.split("/", 1)[0] for t in tags[some_run]})
        assert groups[:3] == ["1_train", "2_val", "3_summary"] and "4_diag.ratio" in groups
        assert not any(t.startswith("diag/") for t in tags[some_run])

    # optuna-dashboard: numeric depth and seed, categorical variant, the run name in each trial's attributes
    port = free_port()
    with serving([Path(sys.executable).parent / "optuna-dashboard", url_of(db), "--port", str(port),
                  "--host", "127.0.0.1"], tmp_path / "optuna-dashboard.log") as dash:
        base = f"http://127.0.0.1:{port}"
        studies = wait_until_answers(f"{base}/api/studies", dash, ready=lambda r: r.get("study_summaries"),
                                     what="optuna-dashboard's study list")
        study_id = next(s["study_id"] for s in studies["study_summaries"] if s["study_name"] == spec.study_name)
        detail = get_json(f"{base}/api/studies/{study_id}?after=0", proc=dash)  # read from the storage per request
        space = {p["name"]: p["distribution"] for p in detail["union_search_space"]}
        assert space["depth"] == {"type": "IntDistribution", "low": 1, "high": 2, "step": 1, "log": False}
        assert space["seed"]["type"] == "IntDistribution"
        assert space["variant"]["type"] == "CategoricalDistribution"
        for trial in detail["trials"]:
            attrs = {a["key"]: a["value"] for a in trial["user_attrs"]}
            params = {p["name"]: p["param_external_value"] for p in trial["params"]}
            assert attrs["run_name"] == f"{params['variant']}/depth={params['depth']}/seed={params['seed']}"

    # the extra loggers, read back: CSV per run, MLflow's SQLite store
    import pandas as pd

    for name in names:
        frame = pd.read_csv(runs_dir / name / "csv" / "metrics.csv")
        assert frame["val/acc"].notna().sum() == 2 and frame["hp/best_val_acc"].notna().sum() == 1
    import mlflow  # the dev extra installs it (pyproject.toml: vit-residual-ablations[mlflow])

    from ablations.dashboard import mlflow_uri

    client = mlflow.tracking.MlflowClient(mlflow_uri(runs_dir / "mlflow.db"))
    experiment = client.get_experiment_by_name(spec.study_name)
    mlruns = client.search_runs([experiment.experiment_id])
    assert {r.info.run_name for r in mlruns} == names
    for r in mlruns:
        assert len(client.get_metric_history(r.info.run_id, "val/acc")) == 2
        assert r.data.params["config/seed"] == "0" and r.info.status == "FINISHED"
        assert 0 <= r.data.metrics["hp/best_val_acc"] <= 1
    # W&B, offline: one run per trial (each finished before the next began), named as the TensorBoard run and
    # grouped by its cell; its record file holds the epochs' and the summary's metrics
    records = sorted((runs_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(records) == len(names)
    found = set()
    for path in records:
        data = path.read_bytes()
        (name,) = [n for n in names if n.encode() in data]
        found.add(name)
        assert name.rsplit("/seed=", 1)[0].encode() in data.replace(name.encode(), b"")  # the group, beside the name
        assert b"val/acc" in data and b"hp/best_val_acc" in data
    assert found == names


def test_wandb_groups_a_row_s_seeds_and_never_stops_to_ask_for_a_login(tmp_path, monkeypatch):
    """``--logger wandb``: a study's run is named as its TensorBoard run and grouped by its cell (W&B then draws a
    row's seeds as one line with their spread); without WANDB_MODE, an API key or a ``wandb login`` it runs
    offline (``wandb sync`` uploads later) instead of prompting; WANDB_MODE wins."""
    pytest.importorskip("wandb")
    from ablations.dashboard import wandb_group, wandb_logger, wandb_mode

    assert wandb_group("layerscale/depth=4/seed=3") == "layerscale/depth=4"
    assert wandb_group("highway/depth=8/seed=0/drop_path_rate=0.1") == "highway/depth=8/drop_path_rate=0.1"
    assert wandb_group("standard_d4_w64_digits_s0_20260101-120000") is None  # a single run: no group
    for name in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: not logged in
    monkeypatch.setenv("NETRC", str(tmp_path / ".netrc"))
    assert wandb_mode() == "offline"
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password 0123456789abcdef\n")
    (tmp_path / ".netrc").chmod(0o600)
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() == "disabled"
    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = wandb_logger("rezero/depth=4/seed=1", "my study", tmp_path / "runs")
    init = logger._wandb_init  # what wandb.init will get (nothing is started until the first metric)
    assert (init["name"], init["group"], init["project"], init["mode"]) == ("rezero/depth=4/seed=1", "rezero/depth=4",
                                                                           "my_study", "offline")
    assert init["dir"] == str(tmp_path / "runs") and logger._experiment is None


def test_train_cli_rejects_an_unknown_logger(tmp_path):
    result = subprocess.run([sys.executable, "-m", "ablations.train", "--logger", "aim", "--log-dir",
                             str(tmp_path)], capture_output=True, text=True, timeout=HANG_LIMIT_S)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == ("error: unknown logger 'aim'; valid choices: csv, mlflow, wandb (TensorBoard is "
                                     "always on)")
    assert not any(Path(tmp_path).iterdir())

