"""End-to-end training on tiny models: determinism, divergence, the TensorBoard hp/* schema, resume, and the CLI.

Every run is a 1-block, 16-wide ViT on a small ``synthetic`` dataset for 1-3 epochs with one thread.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from polling import HANG_LIMIT_S
from tensorboard.backend.event_processing.event_accumulator import SCALARS, TENSORS, EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from ablations.config import RunConfig
from ablations.dashboard import display_tag, internal_tag
from ablations.machine import allocator
from ablations.training import HP_METRICS, hp_metric_values, run_training
from lit_modules.convergence import TIMING_KEYS

ROOT = Path(__file__).resolve().parents[1]
TINY = RunConfig(
    dataset="synthetic", dataset_options={"num_samples": 192, "img_size": 8, "in_chans": 1, "num_classes": 6},
    depth=1, embed_dim=16, num_heads=2, batch_size=32, max_epochs=2, warmup_epochs=0.5, lr=3e-3, threads=1,
)
EPOCH_METRICS = ("train/loss", "train/acc", "train/acc_top5", "val/loss", "val/acc", "val/acc_top5", "lr")


def run(config: RunConfig, log_dir: Path, name: str, **kwargs) -> dict:
    return run_training(config, log_dir=log_dir, run_name=name, enable_progress_bar=False, **kwargs)


def comparable(summary: dict) -> dict:
    """Without the wall-clock measurements (they differ between identical runs, more so on a loaded machine)."""
    # mode_source says where precision auto's choice came from: "(measured now)" for the run that measured its cell,
    # the cache for the runs after it; the mode itself (precision, fused_attn) is compared
    return {k: v for k, v in summary.items() if k not in (*TIMING_KEYS, "run_name", "log_dir", "mode_source")}


def events(run_dir: str | Path) -> EventAccumulator:
    ea = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0, TENSORS: 0})
    ea.Reload()
    return ea


@pytest.fixture(scope="module")
def twin_runs(tmp_path_factory) -> tuple[dict, dict]:
    root = tmp_path_factory.mktemp("runs")
    return run(TINY, root, "first"), run(TINY, root, "second")


class NaNInjector(pl.Callback):
    """Poisons the classifier head at (epoch, batch): every later loss is NaN."""

    def __init__(self, epoch: int, batch: int) -> None:
        self.epoch, self.batch = epoch, batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            with torch.no_grad():
                pl_module.model.head.weight.fill_(math.nan)


class StopAfterFirstEpoch(pl.Callback):
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        trainer.should_stop = True


# --- determinism and the summary -------------------------------------------------------------------------------
def test_same_seed_gives_identical_summaries(twin_runs):
    first, second = twin_runs
    assert comparable(first) == comparable(second)
    assert first["epochs_completed"] == 2 and first["diverged"] is False
    assert len(first["val_acc_curve"]) == 2 and first["best_val_acc"] == max(first["val_acc_curve"])
    assert first["param_count"] > 0 and first["images_seen"] > 0 and first["wall_time_s"] > 0
    assert first["train_images_per_s"] > 0 and first["time_per_epoch_s"] > 0
    for key in ("epochs_to_90pct_of_best", "steps_to_95pct_of_best", "epochs_to_acc_0.5", "val_acc_auc"):
        assert key in first


def test_different_seed_changes_the_run(twin_runs, tmp_path):
    other = run(TINY.replace(seed=1, max_epochs=1), tmp_path, "seed1")
    assert other["train_loss_curve"][0] != twin_runs[0]["train_loss_curve"][0]


# --- TensorBoard -----------------------------------------------------------------------------------------------
def test_hp_metrics_registered_and_all_logged(twin_runs):
    summary = twin_runs[0]
    ea = events(summary["log_dir"])
    scalars = {internal_tag(t) for t in ea.Tags()["scalars"]}  # written under TensorBoard's grouped tags
    for tag in (*HP_METRICS, *EPOCH_METRICS):
        assert tag in scalars, tag
    for tag in EPOCH_METRICS:
        assert len(ea.Scalars(display_tag(tag))) == 2, tag  # once per epoch
    expected = hp_metric_values(summary)
    for tag in HP_METRICS:  # once, at the end: no placeholder that could be read after the final value
        (final,) = ea.Scalars(display_tag(tag))
        assert final.step > 0
        assert final.value == pytest.approx(expected[tag], rel=1e-6, nan_ok=True), tag
    assert expected["hp/best_val_acc"] == pytest.approx(summary["best_val_acc"])

    plugin = ea.PluginTagToContent("hparams")
    experiment = HParamsPluginData.FromString(plugin["_hparams_/experiment"]).experiment
    assert [m.name.tag for m in experiment.metric_infos] == [display_tag(m) for m in HP_METRICS]
    assert [m.display_name for m in experiment.metric_infos] == [m.removeprefix("hp/") for m in HP_METRICS]
    start = HParamsPluginData.FromString(plugin["_hparams_/session_start_info"]).session_start_info
    assert start.hparams["residual"].string_value == "standard"
    assert start.hparams["depth"].number_value == 1
    assert start.hparams["dataset.num_samples"].number_value == 192

    text = ea.Tensors("summary/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert text.startswith("| metric | value |") and "best_val_acc" in text


# --- epoch training metrics ------------------------------------------------------------------------------------
class BatchRecorder(pl.Callback):
    """Records each batch's logits (the weights the step will use) and labels, and the module's epoch training
    metrics as a plain callback sees them in ``on_train_epoch_end`` (where ConvergenceTracker reads them)."""

    def __init__(self) -> None:
        self.batches, self.seen = [], []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        x, y = batch
        with torch.no_grad():
            logits = pl_module(x)
        smoothing = pl_module.hparams.label_smoothing
        self.batches.append((logits, y, torch.nn.functional.cross_entropy(logits, y, label_smoothing=smoothing)))

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.seen.append({k: float(trainer.callback_metrics[k]) for k in ("train/loss", "train/acc")
                          if k in trainer.callback_metrics})


@pytest.mark.parametrize("rows, max_steps", [(1 << 30, -1), (1, -1), (40, 7)])
def test_epoch_train_metrics_are_image_weighted_means_of_the_steps(monkeypatch, rows, max_steps):
    """train/loss = Σ n_b·loss_b / Σ n_b and train/acc = correct / images over the epoch's batches (the last one
    smaller), whether the metrics consume the buffered batches at the epoch's end, after every batch (rows=1), or
    in an epoch cut short by max_steps; a callback's on_train_epoch_end already sees them."""
    from ablations.training import build_datamodule, build_model
    from lit_modules.classifier import ViTClassifier

    monkeypatch.setattr(ViTClassifier, "TRAIN_METRIC_ROWS", rows)
    config = TINY.replace(dataset_options=TINY.dataset_options | {"num_samples": 200}, batch_size=32, max_epochs=2)
    dm = build_datamodule(config)
    module, recorder = build_model(config, dm), BatchRecorder()
    pl.seed_everything(0)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=2, max_steps=max_steps, logger=False, callbacks=[recorder],
                         enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                         limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=dm)
    per_epoch = len(dm.train_dataloader())
    assert len(dm.train_dataloader().images) % 32 > 1  # a short last batch: weights matter
    epochs = [recorder.batches[i:i + per_epoch] for i in range(0, len(recorder.batches), per_epoch)]
    assert len(recorder.seen) == len(epochs) == 2 and len(epochs[-1]) == (per_epoch if max_steps < 0 else 7 - per_epoch)
    for batches, seen in zip(epochs, recorder.seen, strict=True):
        n = sum(len(y) for _, y, _ in batches)
        want_loss = sum(len(y) * loss.item() for _, y, loss in batches) / n
        want_acc = sum((logits.argmax(1) == y).sum().item() for logits, y, _ in batches) / n
        assert seen["train/loss"] == pytest.approx(want_loss, rel=1e-5)
        assert seen["train/acc"] == pytest.approx(want_acc, abs=1e-6)


# --- divergence ------------------------------------------------------------------------------------------------
def test_divergence_mid_run_stops_cleanly(tmp_path):
    summary = run(TINY.replace(max_epochs=3), tmp_path, "nan", extra_callbacks=[NaNInjector(epoch=1, batch=1)])
    assert summary["diverged"] is True
    assert summary["epochs_completed"] == 1 and len(summary["val_acc_curve"]) == 1  # stopped inside epoch 2
    assert summary["best_val_acc"] == summary["val_acc_curve"][0]
    assert summary["val_acc_auc"] == pytest.approx(summary["val_acc_curve"][0] / 3)  # missing epochs count 0
    assert math.isfinite(summary["final_train_loss"])
    ea = events(summary["log_dir"])
    assert ea.Scalars(display_tag("hp/diverged"))[-1].value == 1.0
    assert ea.Scalars(display_tag("hp/epochs_completed"))[-1].value == 1.0


def test_divergence_at_first_step_still_returns_a_summary(tmp_path):
    summary = run(TINY, tmp_path, "nan0", extra_callbacks=[NaNInjector(epoch=0, batch=0)])
    assert summary["diverged"] is True and summary["epochs_completed"] == 0
    assert summary["best_val_acc"] is None and summary["epochs_to_95pct_of_best"] is None
    assert summary["val_acc_auc"] == 0.0
    ea = events(summary["log_dir"])
    assert math.isnan(ea.Scalars(display_tag("hp/best_val_acc"))[-1].value)  # None is logged as NaN
    assert ea.Scalars(display_tag("hp/diverged"))[-1].value == 1.0


# --- diagnostics ---------------------------------------------------------------------------------------------
def test_diagnostics_callback_is_wired_in(tmp_path):
    config = TINY.replace(residual="layerscale", max_epochs=1, diagnostics_every=1, diagnostics_batch_size=8)
    summary = run(config, tmp_path, "diag")
    tags = events(summary["log_dir"]).Tags()["scalars"]
    assert any(internal_tag(tag).startswith("diag/stream_rms/") for tag in tags), tags
    assert any(tag.startswith("4_diag.ratio/stream_rms/") for tag in tags), tags  # TensorBoard's group
    assert summary["diverged"] is False


@pytest.mark.parametrize("best", ["bf16-mixed/explicit", "32-true/fused", "bf16-mixed/fused", "32-true/explicit"])
def test_precision_auto_trains_in_the_measured_fastest_mode_with_diagnostics_working(tmp_path, monkeypatch, best):
    """``precision: auto`` (the default) asks ``ablations.machine.modes`` for the device's fastest mode: here a measured
    table whose winner for the nearest cell is ``best``; the run trains in it (read back from the trained model)
    and its diagnostics still produce finite values (they run their own explicit-attention forward)."""
    from ablations.machine import modes

    times = {key: 1.0 for key in modes.MODE_KEYS}
    times[best] = 0.5
    table = {"device": "cpu", "machine": modes.cpu_signature(TINY.threads),  # measured "here", at the run's threads
             "cells": [{"embed_dim": 16, "tokens": 5, "times_s": times},
                                        {"embed_dim": 512, "tokens": 65, "times_s": {k: 1.0 for k in times}}]}
    table_path = tmp_path / "modes-cpu.json"
    table_path.write_text(json.dumps(table))
    monkeypatch.setattr(modes, "PACKAGED", {"cpu": table_path})
    monkeypatch.setattr(modes, "measured_path", lambda device_type, results_dir=None: tmp_path / "absent.json")
    monkeypatch.setattr(modes, "cache_path", lambda signature, results_dir=None: tmp_path / "no-cache.json")
    seen = {}

    class Spy(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen["precision"] = trainer.precision
            seen["fused"] = {m.fused_attn for m in pl_module.model.modules() if hasattr(m, "fused_attn")}

    config = TINY.replace(residual="layerscale", max_epochs=1, diagnostics_every=1, diagnostics_batch_size=8)
    assert config.precision == "auto" and config.fused_attn is None
    summary = run(config, tmp_path, "auto", extra_callbacks=[Spy()])
    precision, kernel = best.split("/")
    assert (summary["precision"], summary["fused_attn"]) == (precision, kernel == "fused")
    assert seen == {"precision": precision, "fused": {kernel == "fused"}}
    assert str(table_path) in summary["mode_source"] and "width 16, 5 tokens" in summary["mode_source"]
    assert math.isfinite(summary["final_train_loss"])
    scalars = events(summary["log_dir"])
    ratios = [t for t in scalars.Tags()["scalars"] if internal_tag(t).startswith("diag/")]
    assert ratios and all(math.isfinite(scalars.Scalars(t)[-1].value) for t in ratios)
    # an explicit kernel is kept: the table only chooses the precision then
    fixed = run(config.replace(fused_attn=True), tmp_path, "auto_fused")
    assert (fixed["precision"], fixed["fused_attn"]) == (precision, True)


def test_the_run_records_what_the_malloc_setting_did(tmp_path, monkeypatch):
    """A CPU run applies ``ablations.machine.allocator.set_malloc`` and records its answer as the ``malloc`` fact."""
    calls = []
    monkeypatch.setattr(allocator, "set_malloc", lambda: calls.append(1) or "keep (a stand-in)")
    summary = run(TINY.replace(max_epochs=1, diagnostics_every=0), tmp_path, "malloc")
    assert calls == [1] and summary["malloc"] == "keep (a stand-in)"


# --- resume ----------------------------------------------------------------------------------------------------
def test_resume_from_last_checkpoint_keeps_the_curve(twin_runs, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    part = run(TINY, tmp_path, "resumed", checkpoint_dir=ckpt_dir, extra_callbacks=[StopAfterFirstEpoch()])
    assert part["epochs_completed"] == 1 and (ckpt_dir / "last.ckpt").is_file()
    assert [p.name for p in ckpt_dir.iterdir() if p.name != "last.ckpt"] == [
        f"epoch000-acc{part['best_val_acc']:.4f}.ckpt"]  # no "val/acc" sub-folder
    assert part["val_acc_curve"] == twin_runs[0]["val_acc_curve"][:1]
    saved = _tracker_state(ckpt_dir / "last.ckpt")  # overwritten by the resumed run: read it now
    assert 0 < saved["elapsed"] <= part["wall_time_s"]  # saved during the first fit, before it ended
    full = run(TINY, tmp_path, "resumed", checkpoint_dir=ckpt_dir, ckpt_path=ckpt_dir / "last.ckpt")
    assert full["epochs_completed"] == 2 and full["val_acc_curve"][0] == part["val_acc_curve"][0]
    assert full["images_seen"] == twin_runs[0]["images_seen"]
    # the wall time carries on from the checkpoint: what it saved plus this fit, whatever either took (a loaded
    # machine may run the second fit faster than the first, so the two totals are not compared with each other)
    assert full["resumed_from_checkpoint"] is True and full["wall_time_this_process_s"] > 0
    assert full["wall_time_s"] == pytest.approx(saved["elapsed"] + full["wall_time_this_process_s"], rel=1e-9)


def test_last_checkpoint_is_the_latest_epoch_even_when_val_acc_stops_improving(tmp_path):
    """At a learning rate too small to change any prediction, val accuracy is the same every epoch: the best-epoch
    checkpoint stays at epoch 0, but last.ckpt, which a resume continues from, must hold the latest epoch (with
    Lightning's save_last on the monitored checkpoint it stayed at epoch 0, and a resumed trial trained again)."""
    ckpt_dir = tmp_path / "ckpt"
    summary = run(TINY.replace(max_epochs=3, lr=1e-12, warmup_epochs=0.0), tmp_path, "flat", checkpoint_dir=ckpt_dir)
    curve = summary["val_acc_curve"]
    assert len(curve) == 3 and len(set(curve)) == 1  # no epoch improved on the first
    last = torch.load(ckpt_dir / "last.ckpt", map_location="cpu", weights_only=False)
    steps_per_epoch = summary["steps_this_process"] // 3
    assert (last["epoch"], last["global_step"]) == (2, 3 * steps_per_epoch)
    (best,) = [p for p in ckpt_dir.iterdir() if p.name != "last.ckpt"]
    assert best.name.startswith("epoch000-")


def _tracker_state(path: Path) -> dict:
    """The ConvergenceTracker's records in a Lightning checkpoint (its ``state_dict``)."""
    callbacks = torch.load(path, map_location="cpu", weights_only=False)["callbacks"]
    (state,) = [v for k, v in callbacks.items() if k.startswith("ConvergenceTracker")]
    return state


# --- the CLI ---------------------------------------------------------------------------------------------------
def cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ablations.train", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=HANG_LIMIT_S)  # stops a hung run only


def test_cli_json_summary_is_all_of_stdout(tmp_path):
    """``--json``: stdout is the summary alone (so ``--json > run.json`` is a JSON file), with the progress bar and
    model summary on (the default) going to stderr."""
    out = cli("--dataset", "synthetic", "--dataset-option", "num_samples=256", "--dataset-option", "img_size=8",
              "--dataset-option", "in_chans=1", "--depth", "1", "--embed-dim", "16", "--num-heads", "2",
              "--batch-size", "32", "--max-epochs", "2", "--warmup-epochs", "0.5", "--lr", "3e-3", "--threads", "1",
              "--json", "--log-dir", str(tmp_path), "--run-name", "cli")
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout)
    assert "Trainable params" in out.stderr and "Epoch 1" in out.stderr  # the model summary and the progress bar
    assert summary["best_val_acc"] > 0.25 + 0.1  # 4 balanced classes: chance is 0.25
    assert summary["run_name"] == "cli" and Path(summary["log_dir"]) == tmp_path / "cli"
    # what it trained on: this CPU's model name, the flags torch uses here and torch's version
    from ablations.machine.modes import cpu_facts, machine_text

    assert summary["machine"] == machine_text("cpu") and summary["machine"].startswith(cpu_facts()[0] + " (")
    assert summary["machine"].endswith(f", torch {torch.__version__.split('+')[0]}")
    assert "Traceback" not in out.stderr


BAD_INPUT = [
    (["--residual", "foo"], "error: unknown residual 'foo'; valid choices: standard, layerscale, rezero"),
    (["--dataset", "foo"], "error: unknown dataset 'foo'; valid choices: digits, mnist5k"),
    (["--depth", "0"], "error: depth must be a positive integer, got 0"),
    (["--residual", "laurel", "--init-value", "0.1"],
     "error: --init-value does not apply to residual 'laurel'; variants that accept it: layerscale"),
    (["--residual-option", "init_value"], "error: --residual-option expects KEY=VALUE"),
    (["--depth", "two"], "error: argument --depth: depth must be an integer, got 'two'"),
]
# Caught only once the model / data are built (after importing torch): run in-process, where torch is loaded.
BAD_INPUT_AT_BUILD = [
    (["--residual-option", "bogus=1"], "error: option 'bogus' is not valid for residual 'standard'"),
    (["--residual", "layerscale", "--init-value", "big"], "error: init_value='big' is not valid for layerscale"),
    (["--dataset", "cifar10"], "error: no data folder given for cifar10"),
    (["--dataset", "cifar10", "--data-dir", "/nonexistent"], "error: data folder '/nonexistent' for cifar10"),
    (["--dataset", "synthetic", "--dataset-option", "colour=1"], "error: invalid dataset option for 'synthetic'"),
]


def assert_one_line_error(stderr: str, message: str) -> None:
    assert stderr.startswith(message), stderr
    assert stderr.count("\n") == 1 and "Traceback" not in stderr and "usage:" not in stderr


@pytest.mark.parametrize(("argv", "message"), BAD_INPUT)
def test_cli_bad_input_exits_2_with_one_line(argv, message, tmp_path):
    out = cli(*argv, "--log-dir", str(tmp_path))
    assert out.returncode == 2
    assert_one_line_error(out.stderr, message)
    assert not any(tmp_path.iterdir())  # nothing was logged


@pytest.mark.parametrize(("argv", "message"), BAD_INPUT_AT_BUILD)
def test_cli_bad_model_or_data_exits_2_with_one_line(argv, message, tmp_path, capsys):
    from ablations.train import main

    with pytest.raises(SystemExit) as info:
        main([*argv, "--log-dir", str(tmp_path), "--no-progress-bar"])
    assert info.value.code == 2
    assert_one_line_error(capsys.readouterr().err, message)
    assert not any(tmp_path.iterdir())


def test_cli_help_lists_every_option():
    from ablations.config import OPTIONS, option_name

    out = cli("--help")
    assert out.returncode == 0
    for leaf in OPTIONS.values():
        assert option_name(leaf) in out.stdout
    assert "--init-value" in out.stdout and "--json" in out.stdout
