"""DDP on two CPU ranks (gloo), checked against what the ranks really did rather than against a patched rank.

- ``ddp_spawn`` through ``run_training`` with a probe callback (tests/ddp_probe.py) in each rank: per epoch the two
  ranks train on disjoint shards of the epoch's permutation that together cover the training set (less at most
  ``world_size - 1`` dropped images), validate on disjoint shards that cover the val set exactly, and end with the
  same weights every epoch; rank 0's logged ``val/acc`` and ``val/loss`` are those of the whole val set, recomputed
  here in one process from the checkpoints (the val set is odd-sized, so the two ranks' shards and last batches
  differ in size).
- plain ``ddp`` through the CLI, where Lightning re-runs the script for rank 1: rank 0 alone reports and logs, and
  what it reports is again the whole val set's accuracy.
- a study trial on two devices stays one Optuna trial (it runs under ``ddp_spawn`` inside the worker).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from ddp_probe import DdpProbe, fingerprints, read_probes, weights_digest
from helpers import (
    CLI_TIMEOUT_S,
    STUDY_TEST_MARKS,
    TINY_BASE,
    TWO_VARIANTS,
    assert_grid_complete_once,
    finish,
    run_cli,
    trials_of,
    write_study,
)
from pg import free_port

from ablations.config import OPTIONS, RunConfig, option_name
from ablations.report.events import read_run
from ablations.studies.spec import load_spec
from ablations.training import build_datamodule, build_model, run_training

pytestmark = STUDY_TEST_MARKS

WORLD_SIZE = 2
#: 122 synthetic images split 97 train / 25 val. Per epoch each rank trains on 48 images (6 full batches of 8; one
#: image dropped); it validates on 13 (rank 0: batches of 8 + 5) or 12 (rank 1: 8 + 4) images, so a reduction that
#: averages the ranks' own means, or counts only rank 0, gives another value than the whole val set's.
DDP_CONFIG = RunConfig(
    dataset="synthetic", dataset_options={"num_samples": 122, "img_size": 8}, embed_dim=8, num_heads=2, depth=1,
    patch_size=4, batch_size=8, lr=5e-3, warmup_epochs=0.0, max_epochs=2, threads=1, accelerator="cpu",
    devices=WORLD_SIZE, strategy="ddp_spawn",
    precision="32-true",  # the checks re-score checkpoints in fp32 to 1e-6: train in the same precision
    test_fraction=0.0,  # the two-split layout: the shard arithmetic above (the test split is sharded like val)
)


def split_fingerprints(config: RunConfig) -> tuple[list[str], list[str]]:
    """Fingerprints of every (train, val) image as the loaders of ``config`` feed it, built in this process (no
    augmentation: the synthetic dataset has none, so the transform is the same for every epoch and rank)."""
    dm = build_datamodule(config)
    s = dm.splits
    return fingerprints(dm.transform(s.train_images), s.train_labels), fingerprints(dm.transform(s.val_images),
                                                                                    s.val_labels)


def checkpoint_scores(config: RunConfig, checkpoint, split: str = "val") -> dict[str, Any]:
    """The val (or test) set scored with a checkpoint's weights in this process (not distributed: one loader over
    every batch): ``epoch`` (0-based) the checkpoint was saved at, ``acc``, ``loss`` (mean over the images),
    ``rank0_loss`` (mean over rank 0's shard alone) and ``weights`` (:func:`weights_digest` of the backbone)."""
    assert not (torch.distributed.is_available() and torch.distributed.is_initialized())
    dm = build_datamodule(config)
    model = build_model(config, dm)
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    model.load_state_dict(state["state_dict"])
    model.eval()
    logits, labels = [], []
    with torch.no_grad():
        for x, y in getattr(dm, f"{split}_dataloader")():
            logits.append(model(x).double())
            labels.append(y)
    logits, labels = torch.cat(logits), torch.cat(labels)
    assert len(labels) == getattr(dm, f"{split}_size")
    losses = F.cross_entropy(logits, labels, label_smoothing=config.label_smoothing, reduction="none")
    return {"epoch": state["epoch"], "acc": float((logits.argmax(-1) == labels).double().mean()),
            "loss": float(losses.mean()), "rank0_loss": float(losses[0::WORLD_SIZE].mean()),
            "weights": weights_digest(model.model)}


def val_scalars(run_dir, prefix: str = "val/") -> dict[str, list[float]]:
    """``{tag: [value per epoch]}`` of rank 0's ``val/*`` (or other ``prefix``) scalars, read back from the run's
    event files."""
    return {tag: [values[step] for step in sorted(values)] for tag, values in read_run(run_dir, prefix).scalars.items()}


def cli_args(config: RunConfig) -> list[str]:
    """The ``python -m ablations.train`` options that rebuild ``config`` (every field that is not the default)."""
    default, args = RunConfig().to_dict(), []
    for name, value in config.to_dict().items():
        if value == default[name]:
            continue
        if isinstance(value, dict):
            args += [a for key, v in value.items() for a in (option_name(OPTIONS[name]), f"{key}={v}")]
        else:
            args += [option_name(OPTIONS[name]), str(value)]
    return args


# --- ddp_spawn through run_training -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """One ``ddp_spawn`` run of DDP_CONFIG with a DdpProbe in each rank and checkpoints: (summary, run folder,
    the checkpoint files, the ranks' probe records). The checkpoints hold the weights of the epochs that improved
    ``val/acc`` (Lightning 2.6 refreshes last.ckpt only then), so each is scored at its own epoch."""
    root = tmp_path_factory.mktemp("ddp_spawn")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MASTER_ADDR", "127.0.0.1")  # Lightning writes MASTER_PORT into this process's environment:
        mp.setenv("MASTER_PORT", str(free_port()))  # a port of this run's own, removed again afterwards
        summary = run_training(DDP_CONFIG, log_dir=root / "runs", run_name="spawn",
                               extra_callbacks=[DdpProbe(root / "probe")], checkpoint_dir=root / "checkpoints",
                               enable_progress_bar=False, enable_model_summary=False)
    checkpoints = sorted((root / "checkpoints").glob("*.ckpt"))
    return summary, root / "runs" / "spawn", checkpoints, read_probes(root / "probe", WORLD_SIZE)


@pytest.mark.slow
@pytest.mark.timeout(CLI_TIMEOUT_S)  # generous: fails a hung run only
def test_ddp_spawn_ranks_train_disjoint_shards_covering_the_training_set_each_epoch(spawned):
    """Each rank's loader sees the real process group (rank r of 2) and is fed, every epoch, ``len(train) // 2``
    distinct training images; the two ranks' images are disjoint and together are the whole training set less the
    ``len(train) % 2`` dropped one(s); the shards change from epoch to epoch (a new permutation each epoch, not a
    fixed split). Validation: disjoint shards of sizes 13 and 12 whose union is the val set, nothing dropped. Both
    ranks end every epoch with bit-identical weights, and a checkpoint holds those of its epoch."""
    summary, _, checkpoints, probes = spawned
    train_set, val_set = split_fingerprints(DDP_CONFIG)
    assert (len(train_set), len(val_set)) == (97, 25)
    assert len(set(train_set)) == len(train_set) and len(set(val_set)) == len(val_set)  # fingerprints identify
    train_set, val_set = set(train_set), set(val_set)
    per_rank = len(train_set) // WORLD_SIZE
    assert per_rank % DDP_CONFIG.batch_size != 1  # no last batch of one image dropped on top: counts are exact

    assert [(p["rank"], p["world_size"], tuple(p["loader_view"])) for p in probes] == [
        (rank, WORLD_SIZE, (rank, WORLD_SIZE)) for rank in range(WORLD_SIZE)]
    for epoch in range(DDP_CONFIG.max_epochs):
        shards = [p["train"][epoch] for p in probes]
        for shard in shards:
            assert len(shard) == len(set(shard)) == per_rank
        union = set().union(*shards)
        assert len(union) == sum(map(len, shards))  # pairwise disjoint
        assert union <= train_set and len(train_set - union) == len(train_set) % WORLD_SIZE <= WORLD_SIZE - 1
        val_shards = [p["val"][epoch] for p in probes]
        assert [len(s) for s in val_shards] == [13, 12]
        assert set().union(*val_shards) == val_set  # 13 + 12 = 25 distinct images: disjoint, none dropped
    assert sorted(probes[0]["train"]) == list(range(DDP_CONFIG.max_epochs))
    assert set(probes[0]["train"][0]) != set(probes[0]["train"][1])  # reshuffled per epoch (set_epoch)
    assert summary["images_seen"] == DDP_CONFIG.max_epochs * per_rank  # rank 0's tracker: its own shards

    assert probes[0]["weights"] == probes[1]["weights"]  # gradients all-reduced: the ranks never drift apart
    assert len(set(probes[0]["weights"].values())) == DDP_CONFIG.max_epochs  # (and they did train)
    assert checkpoints
    for checkpoint in checkpoints:
        scored = checkpoint_scores(DDP_CONFIG, checkpoint)
        assert scored["weights"] == probes[0]["weights"][scored["epoch"]], checkpoint.name


@pytest.mark.slow  # two spawned ranks training (~18 s); the fast tier keeps the single-process paths
@pytest.mark.timeout(CLI_TIMEOUT_S)
def test_ddp_spawn_val_metrics_are_those_of_the_whole_val_set(spawned):
    """Rank 0's logged ``val/acc`` and ``val/loss`` (TensorBoard event files; the accuracy also in the returned
    summary's curve) of each checkpoint's epoch equal the accuracy and image-weighted mean loss of the whole val
    set, recomputed in this process from that checkpoint (1e-6). The val loss of rank 0's shard alone differs by
    far more, so a value that leaves rank 1 out fails; so did Lightning's ``sync_dist`` mean (25/24 too high)."""
    summary, run_dir, checkpoints, _ = spawned
    logged = val_scalars(run_dir)
    assert len(logged["val/acc"]) == len(logged["val/loss"]) == DDP_CONFIG.max_epochs
    assert summary["val_acc_curve"] == pytest.approx(logged["val/acc"], abs=1e-7)
    assert checkpoints
    for checkpoint in checkpoints:
        scored = checkpoint_scores(DDP_CONFIG, checkpoint)
        epoch = scored["epoch"]
        assert abs(scored["loss"] - scored["rank0_loss"]) > 1e-4  # the check can tell the val set from a shard
        assert logged["val/acc"][epoch] == pytest.approx(scored["acc"], abs=1e-6), checkpoint.name
        assert logged["val/loss"][epoch] == pytest.approx(scored["loss"], abs=1e-6), checkpoint.name


# --- plain ddp through the CLI ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_train_cli_ddp_on_two_cpu_ranks_prints_one_summary(tmp_path):
    """``--devices 2 --strategy ddp`` on the CPU (gloo): Lightning re-runs the CLI for rank 1; both ranks train
    their half of the data; rank 0 alone prints the --json summary and writes event files (every event file is
    the CLI process's own); its val accuracy and loss, and its test accuracy, are the whole val and test set's,
    recomputed here from last.ckpt; every process exits 0."""
    config = DDP_CONFIG.replace(max_epochs=1, strategy="ddp", test_fraction=0.2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablations.train", *cli_args(config), "--json", "--checkpoint", "--no-progress-bar",
         "--log-dir", "runs", "--run-name", "ddp"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    result = finish(proc)  # kills the process group if it hangs
    assert result.returncode == 0, result.stderr
    assert "MEMBER: 2/2" in result.stderr  # rank 1 joined the process group
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("{")]
    summary = json.loads(line)
    train_images = build_datamodule(config).train_size
    assert summary["epochs_completed"] == 1
    assert summary["images_seen"] == train_images // 2  # rank 0's shard of the epoch
    run_dir = tmp_path / "runs" / "ddp"
    assert summary["log_dir"] == "runs/ddp"
    events = list(run_dir.glob("events.out.tfevents.*"))
    assert events and {re.search(r"\.(\d+)\.\d+$", e.name)[1] for e in events} == {str(proc.pid)}

    scored = checkpoint_scores(config, run_dir / "checkpoints" / "last.ckpt")  # the only epoch: always saved
    logged = val_scalars(run_dir)
    assert scored["epoch"] == 0 and summary["final_val_acc"] == pytest.approx(scored["acc"], abs=1e-6)
    assert logged["val/acc"] == pytest.approx([scored["acc"]], abs=1e-6)
    assert logged["val/loss"] == pytest.approx([scored["loss"]], abs=1e-6)
    tested = checkpoint_scores(config, run_dir / "checkpoints" / "last.ckpt", split="test")
    assert val_scalars(run_dir, "test/")["test/acc"] == pytest.approx([tested["acc"]], abs=1e-6)
    assert summary["test_acc"] == pytest.approx(tested["acc"], abs=1e-6)


# --- a study trial on two devices ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_study_trial_on_two_devices_stays_one_optuna_trial(postgres, tmp_path):
    """Trials that ask for 2 devices with strategy ddp run under ddp_spawn (with a warning): the ranks train
    inside the worker's trial, so the study holds exactly one trial per grid point, with the ranks' summary."""
    write_study(tmp_path / "ddp.yaml", base={"accelerator": "cpu", "devices": 2, "strategy": "ddp"},
                variants=TWO_VARIANTS[:1])  # one point: with plain ddp, its two ranks would make two trials
    spec = load_spec(str(tmp_path / "ddp.yaml"))
    train_images = build_datamodule(RunConfig.from_dict(TINY_BASE)).train_size
    url = postgres.create_database("ddp")
    result = run_cli("--study", "ddp.yaml", "--storage", url, "--results-dir", "results", "--threads", "1",
                     "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "each trial runs with strategy 'ddp_spawn'" in result.stderr
    trials = trials_of(url, "ddp")
    assert len(trials) == spec.size == 1
    assert_grid_complete_once(url, spec)
    for t in trials:
        assert t.user_attrs["config"]["strategy"] == "ddp_spawn" and t.user_attrs["config"]["devices"] == 2
        assert t.user_attrs["epochs_completed"] == 1 and t.user_attrs["images_seen"] == train_images // 2
        assert t.value == pytest.approx(t.user_attrs["best_val_acc"])
        assert sorted(t.intermediate_values) == [0]  # reported by rank 0 into the storage
        assert t.intermediate_values[0] == pytest.approx(t.user_attrs["val_acc_curve"][0])
