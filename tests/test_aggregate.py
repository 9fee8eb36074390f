"""Curves across seeds (ablations/report/aggregate.py), read back with TensorBoard's own event reader: the aggregate
runs' means, intervals and paired differences equal hand-computed ones on fixture curves, the Custom Scalars layout
puts every variant of a depth on one margin chart, the HParams rows carry the cell means beside the per-seed rows,
and the report writes them from a runs.csv alone."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import pytest
from helpers import write_study
from tensorboard.backend.event_processing.event_accumulator import SCALARS, TENSORS, EventAccumulator

from ablations import report
from ablations.report import aggregate as agg
from ablations.report.load import Run, assemble
from ablations.report.stats import main_cells, paired
from ablations.studies.spec import load_spec
from ablations.training import HP_SUMMARY_KEYS

T_975_2 = 4.302652729911275  # t_{0.975, 2}: the 95% interval's factor at three seeds (tables of Student's t)
SEEDS = (0, 1, 2)
# val/acc per (variant, depth, seed), epochs 1..3
VAL = {("standard", 2): [[0.50, 0.60, 0.70], [0.40, 0.55, 0.65], [0.45, 0.62, 0.72]],
       ("rezero", 2): [[0.52, 0.65, 0.74], [0.44, 0.58, 0.70], [0.47, 0.66, 0.73]],
       ("standard", 4): [[0.30, 0.50, 0.60], [0.35, 0.52, 0.66], [0.32, 0.51, 0.63]],
       ("rezero", 4): [[0.31, 0.55, 0.61], [0.30, 0.49, 0.69], [0.36, 0.57, 0.70]]}


def _study(tmp_path: Path):
    path = write_study(tmp_path / "aggtiny.yaml", axes={"depth": [2, 4], "seed": list(SEEDS)},
                       claims=[{"id": "rezero_better", "claim": "ReZero improves accuracy", "variant": "rezero",
                                "baseline": "standard", "direction": "higher", "source": "a fixture"}])
    spec = load_spec(str(path))
    runs, number = [], 0
    for (variant, depth), curves in VAL.items():
        for seed, curve in zip(SEEDS, curves, strict=True):
            summary = {key: 0.0 for key in HP_SUMMARY_KEYS} | {
                "test_acc": curve[-1] - 0.01, "final_val_acc": curve[-1], "diverged": False,
                "test_acc_curve": [v - 0.01 for v in curve], "wall_time_s": 10.0 + seed}
            runs.append(Run(number=number, state="complete", variant=variant, depth=depth, seed=seed, row="",
                            acc=curve[-1] - 0.01, summary=summary, curve=dict(enumerate(curve, start=1)),
                            config={"lr": 0.004 if variant == "rezero" else 0.002, "num_classes": 10}))
            number += 1
    return spec, assemble(spec.study_name, spec, runs)


def _hand_band(values):
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T_975_2 * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def test_band_is_the_t_interval_of_the_mean():
    b = agg.band([0.8, 0.9, 0.85])
    assert b.n == 3 and b.mean == pytest.approx(0.85)
    assert b.upper - b.mean == pytest.approx(T_975_2 * 0.05 / math.sqrt(3))  # sd 0.05
    assert (b.lower, b.upper) == pytest.approx((0.7257931, 0.9742069), abs=1e-7)
    one = agg.band([0.7, float("nan"), None])
    assert one == agg.Band(0.7, 0.7, 0.7, 1)  # one value: no interval, the band is the mean
    assert agg.band([None, float("inf")]) is None


def _read(run_dir: Path) -> EventAccumulator:
    acc = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0, TENSORS: 0})
    acc.Reload()
    return acc


def _series(acc: EventAccumulator, tag: str) -> dict[int, float]:
    return {e.step: e.value for e in acc.Scalars(tag)}


def test_aggregate_runs_hold_the_means_intervals_and_paired_differences(tmp_path):
    spec, data = _study(tmp_path)
    root = tmp_path / "runs" / spec.study_name
    agg.write_study(data, spec, root)
    for (variant, depth), curves in VAL.items():
        acc = _read(root / "agg" / variant / f"depth={depth}")
        head = f"2_val/acc/depth={depth}"  # the run is the variant: every variant's run of a depth has these tags
        means, lowers, uppers = (_series(acc, f"{head}/{k}") for k in ("mean", "lower", "upper"))
        assert sorted(means) == [1, 2, 3]  # step = epoch
        for epoch in (1, 2, 3):
            mean, low, high = _hand_band([c[epoch - 1] for c in curves])
            assert means[epoch] == pytest.approx(mean, abs=1e-6)
            assert (lowers[epoch], uppers[epoch]) == pytest.approx((low, high), abs=1e-6)
        assert _series(acc, f"{head}/n") == {1: 3.0, 2: 3.0, 3: 3.0}
        test = _series(acc, f"test/acc/depth={depth}/mean")  # from the run summary's test_acc_curve
        assert test[3] == pytest.approx(sum(c[-1] for c in curves) / 3 - 0.01, abs=1e-6)
        if variant == "standard":
            assert not any(t.startswith("0_paired/") for t in acc.Tags()["scalars"])
            continue
        base = VAL["standard", depth]
        delta = {k: _series(acc, f"0_paired/val/acc/depth={depth}/{k}") for k in ("delta", "lower", "upper")}
        for epoch in (1, 2, 3):  # in percentage points, as the report's tables
            diffs = [c[epoch - 1] - b[epoch - 1] for c, b in zip(curves, base, strict=True)]
            mean, low, high = _hand_band(diffs)
            ref = paired(diffs)  # the paired t interval of the report's tables, per epoch
            assert delta["delta"][epoch] == pytest.approx(100 * mean, abs=1e-4) == pytest.approx(100 * ref.delta,
                                                                                               abs=1e-4)
            assert (delta["lower"][epoch], delta["upper"][epoch]) == pytest.approx((100 * low, 100 * high), abs=1e-4)
            assert (low, high) == pytest.approx((ref.ci_low, ref.ci_high))


def test_layout_puts_every_variant_of_a_depth_on_one_margin_chart_without_missing_tags(tmp_path):
    """One series per chart, whose tags every variant's run of that depth holds: TensorBoard draws it once per run
    (variant), and no selected run lacks part of a chart's tags (its "Missing Tags" warning: a run lacking some but
    not all three of a chart's tags)."""
    from tensorboard.plugins.custom_scalar import layout_pb2, metadata

    spec, data = _study(tmp_path)
    root = tmp_path / "runs" / spec.study_name
    agg.write_study(data, spec, root)
    acc = _read(root / "agg")
    [event] = acc.Tensors(metadata.CONFIG_SUMMARY_TAG)
    layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
    titles = [c.title for c in layout.category]
    assert titles[0].startswith("Δ val/acc vs standard (pp), paired by seed")  # the paired differences first
    val = next(c for c in layout.category if c.title.startswith("val/acc: mean and 95% CI"))
    assert [ch.title for ch in val.chart] == ["val/acc, depth=2", "val/acc, depth=4"]
    runs = {(v.label, d): set(_read(root / "agg" / v.label / f"depth={d}").Tags()["scalars"])
            for v in spec.variants for d in (2, 4)}
    for chart, depth in zip(val.chart, (2, 4), strict=True):
        (series,) = chart.margin.series
        assert (series.value, series.lower, series.upper) == tuple(f"2_val/acc/depth={depth}/{k}"
                                                                  for k in ("mean", "lower", "upper"))
    for category in layout.category:  # no run holds part of a chart's tags: each holds all three or none
        for chart in category.chart:
            (series,) = chart.margin.series
            wanted = {series.value, series.lower, series.upper}
            holding = {run for run, tags in runs.items() if wanted <= tags}
            assert all(not (wanted & tags) or wanted <= tags for tags in runs.values()), chart.title
            depth = int(chart.title.rsplit("depth=", 1)[1])
            expected = {("rezero", depth)} if category.title.startswith("Δ") else {("standard", depth), ("rezero", depth)}
            assert holding == expected, chart.title
    paired_chart = layout.category[0].chart[0]
    assert [s.value for s in paired_chart.margin.series] == ["0_paired/val/acc/depth=2/delta"]
    texts = {t.rsplit("/", 1)[0] for t in acc.Tags()["tensors"]} | set(acc.Tags()["tensors"])
    assert "aggregate/claims" in texts or "aggregate/claims/text_summary" in texts
    claims = next(e for t in acc.Tags()["tensors"] if t.startswith("aggregate/claims") for e in acc.Tensors(t))
    assert b"rezero_better" in claims.tensor_proto.string_val[0]


def test_hparams_rows_per_variant_beside_the_seeds(tmp_path):
    from tensorboard.plugins.hparams import metadata as hp_metadata
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    spec, data = _study(tmp_path)
    root = tmp_path / "runs" / spec.study_name
    agg.write_study(data, spec, root)
    cells = {(c.row, c.depth): c for c in main_cells(data)}
    for (variant, depth), curves in VAL.items():
        acc = _read(root / "agg" / variant / f"depth={depth}")
        content = acc.PluginTagToContent("hparams")[hp_metadata.SESSION_START_INFO_TAG]
        start = HParamsPluginData.FromString(content).session_start_info
        assert {k: v.WhichOneof("kind") for k, v in start.hparams.items()} == {"variant": "string_value",
                                                                               "depth": "number_value",
                                                                               "lr": "number_value"}
        assert start.hparams["lr"].number_value == pytest.approx(0.004 if variant == "rezero" else 0.002)
        assert start.hparams["variant"].string_value == variant and start.hparams["depth"].number_value == depth
        assert _series(acc, "3_summary/test_acc")[3] == pytest.approx(cells[variant, depth].mean, abs=1e-6)
        mean, low, high = _hand_band([c[-1] - 0.01 for c in curves])
        assert _series(acc, "3_summary/ci_low")[3] == pytest.approx(low, abs=1e-6)
        assert _series(acc, "3_summary/ci_high")[3] == pytest.approx(high, abs=1e-6)
        assert _series(acc, "3_summary/n_seeds")[3] == 3
        assert _series(acc, "3_summary/lr")[3] == pytest.approx(0.004 if variant == "rezero" else 0.002)
    # the study's HParams experiment lists the same metrics for every run: the summary's, then the aggregates'
    root_acc = _read(root)
    experiment = HParamsPluginData.FromString(
        root_acc.PluginTagToContent("hparams")[hp_metadata.EXPERIMENT_TAG]).experiment
    from ablations.dashboard import display_tag

    assert [m.name.tag for m in experiment.metric_infos] == [display_tag(m) for m in agg.STUDY_METRICS]
    # the same experiment in the agg run: `tensorboard --logdir <study>/agg` opens on the study's axes and the rate
    # each row trained at, marked as differing (TensorBoard reads either when both are in its log folder)
    inside = HParamsPluginData.FromString(
        _read(root / "agg").PluginTagToContent("hparams")[hp_metadata.EXPERIMENT_TAG]).experiment
    assert inside == experiment
    columns = {h.name: h.differs for h in experiment.hparam_infos}
    assert columns == {"variant": True, "depth": True, "seed": True, "lr": True}


def test_event_curves_map_steps_to_epochs(tmp_path):
    """Lightning's epoch metrics sit at the optimizer step (the run's ``epoch`` scalar maps them back); the
    diagnostics at the 0-based epoch index; both come back per 1-based epoch."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tmp_path))
    for step, tag, value in [(2, "epoch", 0), (2, "2_val/acc", 0.5), (5, "epoch", 1), (5, "2_val/acc", 0.6),
                             (8, "epoch", 2), (8, "2_val/acc", 0.7), (8, "1_train/loss", 1.5),
                             (0, "4_diag.ratio/ratio_mean/attn/00", 0.1), (2, "4_diag.ratio/ratio_mean/attn/00", 0.3),
                             (9, "3_summary/test_acc", 0.9)]:
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
        writer.add_event(event_pb2.Event(step=step, wall_time=1.0, summary=summary))
    writer.close()
    curves = agg.event_curves(tmp_path)
    assert curves == {"val/acc": {1: 0.5, 2: pytest.approx(0.6), 3: pytest.approx(0.7)},
                      "train/loss": {3: 1.5}, "diag/ratio_mean/attn/00": {1: pytest.approx(0.1), 3: pytest.approx(0.3)}}


def test_report_from_runs_csv_alone_writes_the_aggregates(tmp_path):
    """An imported study (only its runs.csv): ``--runs`` writes the aggregate runs from the curves in the file."""
    spec, data = _study(tmp_path)
    from ablations.report import runs as runs_csv

    csv_path = runs_csv.write(data, tmp_path / "in" / "runs.csv")
    results = tmp_path / "results"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = report.main(["--study", str(tmp_path / "aggtiny.yaml"), "--runs", str(csv_path), "--results-dir",
                            str(results), "--no-figures"])
    assert code == 0, err.getvalue()
    acc = _read(results / "runs" / spec.study_name / "agg" / "rezero" / "depth=2")
    means = _series(acc, "2_val/acc/depth=2/mean")
    assert means[2] == pytest.approx(sum(c[1] for c in VAL["rezero", 2]) / 3, abs=1e-6)
    assert "test/acc/depth=2/mean" not in acc.Tags()["scalars"]  # runs.csv carries the val curve only
    assert str(results / "runs" / spec.study_name / "agg") in out.getvalue()


def test_the_runners_hook_reads_the_storage_and_never_fails_the_study(tmp_path, capsys):
    """``refresh`` (called by each worker after every trial) aggregates the completed report trials of the storage;
    the tuning stage is left alone, and a results folder it cannot write is one line on stderr, not an error."""
    import optuna
    from optuna.distributions import CategoricalDistribution, IntDistribution

    spec, data = _study(tmp_path)
    study = optuna.create_study(study_name=spec.study_name, direction="maximize")
    dists = {"variant": CategoricalDistribution(["standard", "rezero"]), "depth": IntDistribution(2, 4),
             "seed": IntDistribution(0, 2)}
    for run in data.runs:
        attrs = {"phase": "report", "config": run.config, "val_acc_curve": [run.curve[e] for e in (1, 2, 3)],
                 "test_acc": run.acc, "best_val_acc": run.acc, "diverged": False}
        study.add_trial(optuna.trial.create_trial(
            params={"variant": run.variant, "depth": run.depth, "seed": run.seed}, distributions=dists,
            value=run.acc, user_attrs=attrs))
    agg.refresh(study, spec, tmp_path / "results")
    acc = _read(tmp_path / "results" / "runs" / spec.study_name / "agg" / "rezero" / "depth=4")
    assert _series(acc, "2_val/acc/depth=4/mean")[3] == pytest.approx(
        sum(c[2] for c in VAL["rezero", 4]) / 3, abs=1e-6)
    assert _series(acc, "3_summary/test_acc")[3] == pytest.approx(sum(c[2] - 0.01 for c in VAL["rezero", 4]) / 3,
                                                                  abs=1e-6)
    import dataclasses

    agg.refresh(study, dataclasses.replace(spec, stage="tune"), tmp_path / "tuned")
    assert not (tmp_path / "tuned").exists()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the results folder should be")
    agg.refresh(study, spec, blocked)
    err = capsys.readouterr().err
    assert err.startswith("aggregate TensorBoard runs not updated: ") and err.count("\n") == 1
