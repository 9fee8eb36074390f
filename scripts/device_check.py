"""The GPU check: the CUDA tests, the benchmark's GPU figures and a 2-epoch paper-size training run, in <= 8 minutes.

    python scripts/device_check.py --device cuda                       # on a GPU; no CIFAR-10: synthetic data
    python scripts/device_check.py --device cuda --data-dir /data      # /data/cifar-10-batches-py: the real data path
    python scripts/device_check.py --device cpu --short                # seconds on a CPU (tests/test_device_check.py)

Three stages, each a subprocess under its own timeout, each recorded even when it fails (a failed stage does not
stop the others):

  cuda_tests  ``python -m pytest -m cuda -q --continue-on-collection-errors``: the tests marked ``cuda`` (skipped
              without a GPU: on ``--device cpu`` a skip is expected, on ``--device cuda`` it is a failure);
  bench       ``python -m ablations.bench --device D --quick --sections timm,variants,mfu,data,overhead --variants
              standard,<the DCA labels> --out <out>/bench`` (``--short``: ``--tiny``): our train step vs timm's,
              DCA vs standard per step (the DCA paper measures 1.31-1.54x), MFU, the data path's images/s, and
              section 11: the depth-aggregation and multi-stream designs (AttnRes, HC, DCA, mHC, DenseFormer) vs standard
              at depth 6, batch 32;
  train       the first grid point of ``residual_variants`` at its ``paper`` budget for 2 epochs
              (``ablations.training.run_training``): images/s, wall time, time per epoch. The paper budget reads
              CIFAR-10 from ``--data-dir``; without it the run uses ``synthetic`` data of CIFAR-10's shape
              (50,000 32x32 images, 10 classes) and the report says so. ``--short``: a tiny model on 128 synthetic
              images for 1 epoch in fp32. A run killed at its limit still reports the images/s it had reached.

Budget on one GPU (the limits are ceilings; stages run one after the other): cuda_tests 60 s (collecting the suite
takes most of it), bench 240 s (four sections at --quick sizes plus torch/timm start-up), train 150 s (start-up,
loading CIFAR-10 or generating its synthetic twin, 2 epochs): 450 s, plus ~15 s for this script's own start-up,
under the 8 minutes (480 s). A stage over its limit is killed (its process group) and marked ``timeout``.

Writes, under ``--out`` (default ``results/device/<device>``): ``device_check.json``, ``device_check.md`` (a short
table), ``bench/bench.json`` and ``bench/bench.md`` (the benchmark's own report), ``logs/<stage>.log`` (each stage's
output), ``train/`` (the run's TensorBoard folder) and ``train_summary.json``. The JSON is rewritten after every
stage, so a killed check keeps what ran::

    {"format": 1, "device": "cuda", "short": false, "date": <ISO time>, "wall_s": <s>, "passed": <bool>,
     "budget_s": {"cuda_tests": 60, "bench": 240, "train": 150, "total": 450},
     "machine": {"gpu", "gpu_class", "gpu_count", "gpu_memory_gib", "compute_capability", "driver", "torch",
                 "cuda", "cudnn", "python", "cpu_count"},
     "stages": {"cuda_tests": {"status", "seconds", "timeout_s", "returncode", "command", "log", "error",
                               "figures": {"passed", "skipped", "failed", "errors"}},
                "bench": {..., "figures": {"ours_vs_timm", "step_time_vs_standard": {<label>: <ratio>}, "mfu",
                                           "step_flops_per_s", "peak_flops_per_s", "data_images_per_s": {...},
                                           "overhead_vs_standard": {<design>: {"ratio", "limit"}},
                                           "goals_met": "<met>/<all>", "section_errors": {}}},
                "train": {..., "figures": {"train_images_per_s", "wall_time_s", "time_per_epoch_s",
                                           "best_val_acc", "final_val_acc", "diverged", "epochs_completed",
                                           "param_count", "precision", "forward_flops_per_image",
                                           "dataset_note", "config": {RunConfig.to_dict()}}}}}

(a schema; the first real one, an H200's, is results/device/cuda/device_check.json).

``status`` is ``passed``, ``failed`` or ``timeout`` (a timed-out train stage has ``figures.progress``: epoch,
images, seconds, images/s so far). The train stage's ``precision`` is what the run trained at (``auto``
resolved). The bench stage passes when every section ran (its goals are reported, not required: ``goals_met``).
``python -m ablations.run --dry-run --gpu CLASS`` reads the train stage's images/s (and the bench's MFU) back from
here for its GPU-hours estimate (``ablations.pricing.gpu_hours``).

Exit status: 0 every stage passed; 1 a stage failed or timed out; 2 bad input (one line: an unknown option,
``--device cuda`` without a CUDA device).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

# Imported where they are used, not here: Lightning and torch. Each takes from a tenth of a second to seconds to
# import, and the command-line tools start without them.

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file (python scripts/device_check.py): the repository's packages
    sys.path.insert(0, str(ROOT))

from ablations import layout  # noqa: E402
from ablations.bench.device_figures import (  # noqa: E402
    BENCH_SECTIONS,
    TRAIN_FIGURES,
    StageResult,
    read_bench,
    read_cuda_tests,
    read_train,
)
from ablations.cli import OneLineParser, markdown_table  # noqa: E402

FORMAT = 1
DEVICES = ("cuda", "cpu")
STAGES = ("cuda_tests", "bench", "train")
#: Seconds each stage may run on one GPU (see the budget in the module docstring): 450 s of the 480 s allowed.
TIMEOUTS_S = {"cuda_tests": 60, "bench": 240, "train": 150}
#: With --short (a shared CPU, tiny sizes): ceilings for a loaded machine, not a budget.
SHORT_TIMEOUTS_S = {"cuda_tests": 180, "bench": 180, "train": 180}
STUDY, BUDGET = "residual_variants", "paper"
TRAIN_EPOCHS = 2
#: Without --data-dir: synthetic images of CIFAR-10's shape and size (data/synthetic.py's options).
CIFAR_LIKE_SYNTHETIC = {"img_size": 32, "num_samples": 50000, "num_classes": 10}
#: --short: a model and data small enough for seconds on a CPU, in plain fp32 (not the study's precision, which
#: may be 'auto': the short check tests this script's path, not the choice of mode).
SHORT_OVERRIDES = {"max_epochs": 1, "depth": 1, "embed_dim": 16, "num_heads": 2, "batch_size": 32, "patch_size": 4,
                   "dataset": "synthetic", "dataset_options": {"img_size": 16, "num_samples": 128, "num_classes": 10},
                   "diagnostics_every": 0, "precision": "32-true"}
KILL_GRACE_S = 5  # after SIGTERM at a timeout, before SIGKILL



# --- commands -------------------------------------------------------------------------------------------------------
def pytest_command(python: str = sys.executable) -> list[str]:
    """The CUDA tests: every test marked ``cuda``; a collection error elsewhere is counted, not fatal."""
    return [python, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
            "tests"]


def dca_labels() -> list[str]:
    """The benchmark labels (``ablations.costs.all_configs()``) of DCA proper: its default, k-DCA, the GRN forms;
    not the seed notes' per-token mix, which is built as LAuReL-RW."""
    from ablations.costs import all_configs

    return [label for label, residual, options, _ in all_configs()
            if residual == "dca" and options.get("form", "dca") != "seed"]


def bench_command(device: str, short: bool, out: Path, python: str = sys.executable,
                  variants: list[str] | None = None) -> list[str]:
    """The benchmark's GPU figures: sections timm, variants (standard and the DCA labels), mfu, data."""
    labels = ["standard", *(dca_labels() if variants is None else variants)]
    if any("," in label for label in labels):
        raise ValueError(f"a benchmark label contains a comma, which --variants cannot pass: {labels}")
    return [python, "-m", "ablations.bench", "--device", device, "--tiny" if short else "--quick",
            "--sections", ",".join(BENCH_SECTIONS), "--variants", ",".join(labels), "--out", str(out)]


def train_command(device: str, short: bool, data_dir: str | None, out: Path, python: str = sys.executable) -> list[str]:
    """This script in its training-stage role (:func:`train_stage`), in a process of its own."""
    command = [python, str(Path(__file__).resolve()), "--train-stage", "--device", device, "--out", str(out)]
    return command + (["--short"] if short else []) + (["--data-dir", data_dir] if data_dir else [])


def training_config(device: str, short: bool, data_dir: str | None) -> tuple[Any, str]:
    """The RunConfig of the train stage and a note on its data: the paper budget's first grid point, 2 epochs."""
    from ablations.studies.spec import load_spec

    spec = load_spec(STUDY, BUDGET)
    point = spec.grid()[0]
    overrides: dict[str, Any] = {"max_epochs": TRAIN_EPOCHS, "accelerator": "gpu" if device == "cuda" else "cpu",
                                 "devices": 1}
    if short:
        overrides |= SHORT_OVERRIDES
        note = f"--short: synthetic {SHORT_OVERRIDES['dataset_options']}, a tiny model"
    elif data_dir:
        overrides["data_dir"] = data_dir
        note = f"{spec.base.get('dataset')} from {data_dir}"
    else:
        overrides |= {"dataset": "synthetic", "dataset_options": dict(CIFAR_LIKE_SYNTHETIC)}
        note = (f"synthetic data of CIFAR-10's shape {CIFAR_LIKE_SYNTHETIC} instead of the paper budget's "
                f"{spec.base.get('dataset')} (no --data-dir): the data path is not CIFAR-10's")
    point_text = ", ".join(f"{k}={v}" for k, v in point.items())
    return spec.run_config(point, overrides), f"{STUDY} {BUDGET} budget, {point_text}; {note}"


# --- running a stage ------------------------------------------------------------------------------------------------
def run_command(command: list[str], timeout_s: float, log_path: Path) -> tuple[int | None, float]:
    """Run ``command`` in the repository root in its own process group, its output to ``log_path``; kill the group
    at ``timeout_s``. Returns (exit status, or None on a timeout; seconds)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log_path.open("w") as log:
        log.write(f"$ {shlex.join(command)}\n")
        log.flush()
        proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _stop_group(proc)
            returncode = None
        except BaseException:  # Ctrl-C: take the stage down with this script
            _stop_group(proc)
            raise
    return returncode, time.perf_counter() - start


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the stage's process group, SIGKILL after :data:`KILL_GRACE_S`."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


def last_line(log_path: Path) -> str:
    """The last non-empty line of a log (the error a failed stage printed last), at most 300 characters."""
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def run_stage(name: str, command: list[str], timeout_s: float, out: Path) -> StageResult:
    """Run one stage's command and record it (its figures are read afterwards by the stage's reader)."""
    log = out / "logs" / f"{name}.log"
    returncode, seconds = run_command(command, timeout_s, log)
    result = StageResult(status="passed" if returncode == 0 else "timeout" if returncode is None else "failed",
                         seconds=round(seconds, 1), timeout_s=timeout_s, returncode=returncode,
                         command=shlex.join(command), log=str(log.relative_to(out)))
    if returncode is None:
        result.error = f"killed at its {timeout_s:g} s limit; last output: {last_line(log)}"
    elif returncode != 0:
        result.error = f"exit status {returncode}: {last_line(log)}"
    return result



# --- the training stage's own process -------------------------------------------------------------------------------
def train_stage(device: str, short: bool, data_dir: str | None, out: Path) -> int:
    """Train the stage's config and write ``<out>/train_summary.json`` (figures, forward FLOPs, config). The
    process of the train stage (``--train-stage``): the parent kills it at the stage's limit."""
    from ablations.pricing.gpu_hours import forward_flops, resolve_precision
    from ablations.training import run_training

    config, note = training_config(device, short, data_dir)
    print(f"train stage: {note}\nconfig: {json.dumps(config.to_dict(), default=str)}", flush=True)
    summary = run_training(config, log_dir=out / "train", run_name="device_check", enable_progress_bar=False,
                           enable_model_summary=False, extra_callbacks=[progress_callback(out / "train_progress.json")])
    figures = {key: summary.get(key) for key in TRAIN_FIGURES}
    figures |= {"precision": resolve_precision(config, config.accelerator),  # what it trained at: 'auto' resolved
                "forward_flops_per_image": forward_flops(config), "dataset_note": note,
                "config": json.loads(json.dumps(config.to_dict(), default=str))}
    (out / "train_summary.json").write_text(json.dumps(figures, indent=1) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "config"}), flush=True)
    return 0


def progress_callback(path: Path, every_s: float = 5.0):
    """A Lightning callback that rewrites ``path`` every ``every_s`` seconds of training with the epoch, the training
    images seen and the images/s so far (timed from the end of the first batch, so start-up is left out): what a
    run killed at its limit had reached."""
    import lightning.pytorch as pl

    class Progress(pl.Callback):
        def __init__(self) -> None:
            self.start: float | None = None  # end of the first batch
            self.written = 0.0
            self.images = 0  # training images after the first batch

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            now = time.perf_counter()
            if self.start is None:
                self.start = self.written = now
                return
            self.images += len(batch[0])
            if now - self.written >= every_s:
                self.written = now
                elapsed = now - self.start
                path.write_text(json.dumps({"epoch": trainer.current_epoch + 1, "batches": trainer.global_step,
                                            "images": self.images, "elapsed_s": round(elapsed, 2),
                                            "images_per_s": self.images / elapsed}) + "\n")

    return Progress()


# --- the whole check ------------------------------------------------------------------------------------------------
def machine_facts() -> dict:
    """GPU name and memory, torch/CUDA/cuDNN versions, Python, CPU count (torch imported here)."""
    import torch

    from ablations.pricing.gpu_hours import gpu_class_of

    facts: dict[str, Any] = {"gpu": None, "gpu_class": None, "gpu_count": 0, "torch": torch.__version__,
                             "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                             "python": platform.python_version(), "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts |= {"gpu": props.name, "gpu_class": gpu_class_of(props.name), "gpu_count": torch.cuda.device_count(),
                  "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                  "compute_capability": f"{props.major}.{props.minor}", "driver": _driver_version()}
    return facts


def _driver_version() -> str | None:
    """The NVIDIA driver version from ``nvidia-smi`` (None where it cannot be asked)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def check(device: str, short: bool = False, data_dir: str | None = None, out: Path | None = None) -> dict:
    """Run the three stages and write ``device_check.json`` / ``.md`` under ``out`` (default
    ``results/device/<device>``); returns the report (``report["passed"]``: every stage passed)."""
    out = (out or layout.device_dir() / device).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("train_summary.json", "train_progress.json"):  # an earlier run's would pass for this run's
        (out / stale).unlink(missing_ok=True)
    timeouts = SHORT_TIMEOUTS_S if short else TIMEOUTS_S
    start = time.perf_counter()
    report: dict[str, Any] = {
        "format": FORMAT, "device": device, "short": short,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "wall_s": 0.0, "passed": False,
        "budget_s": dict(timeouts) | {"total": sum(timeouts.values())}, "machine": machine_facts(), "stages": {}}
    bench_out = out / "bench"
    commands = {"cuda_tests": pytest_command(), "bench": bench_command(device, short, bench_out),
                "train": train_command(device, short, data_dir, out)}
    for i, name in enumerate(STAGES, 1):
        print(f"[{i}/{len(STAGES)}] {name} (limit {timeouts[name]} s): {shlex.join(commands[name][1:])}",
              file=sys.stderr, flush=True)
        result = run_stage(name, commands[name], timeouts[name], out)
        try:
            if name == "cuda_tests":
                read_cuda_tests(result, out, device)
            elif name == "bench":
                read_bench(result, bench_out)
            else:
                read_train(result, out)
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a report of an unexpected form
            result.status, result.error = "failed", f"cannot read the stage's results: {exc!r}"
        report["stages"][name] = asdict(result)
        print(f"      {result.status} in {result.seconds:.0f} s" + (f": {result.error}" if result.error else ""),
              file=sys.stderr, flush=True)
        report["wall_s"] = round(time.perf_counter() - start, 1)
        report["passed"] = all(s["status"] == "passed" for s in report["stages"].values()) and i == len(STAGES)
        write_report(report, out)
    return report


def write_report(report: dict, out: Path) -> None:
    (out / "device_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "device_check.md").write_text(render(report))


def render(report: dict) -> str:
    """``device_check.md``: the machine, then one row per stage with its key figures."""
    m = report["machine"]
    gpu = f"{m['gpu']} ({m.get('gpu_memory_gib')} GiB, class {m['gpu_class']})" if m["gpu"] else "none"
    lines = [f"# Device check ({report['device']}{', --short' if report['short'] else ''})", "",
             f"{report['date']}; GPU {gpu}; torch {m['torch']}, CUDA {m['cuda']}, cuDNN {m['cudnn']}, Python "
             f"{m['python']}, {m['cpu_count']} CPUs. Wall time {report['wall_s']:.0f} s of a "
             f"{report['budget_s']['total']} s budget. Generated by `python scripts/device_check.py`; raw figures in "
             "device_check.json.", ""]
    rows = []
    for name, stage in report["stages"].items():
        status = stage["status"] if stage["status"] == "passed" else f"**{stage['status']}**"
        figures = _figure_text(name, stage["figures"])
        if stage["error"]:
            figures += ("; " if figures else "") + f"error: {stage['error']}"
        rows.append([name, status, f"{stage['seconds']:.0f} ({stage['timeout_s']:g})", figures.replace("|", "/")])
    table = markdown_table(["stage", "status", "seconds (limit)", "key figures"], rows, "llrl")
    return "\n".join([*lines, table]) + "\n"


def _figure_text(name: str, f: dict) -> str:
    if not f:
        return ""
    if name == "cuda_tests":
        return f"{f['passed']} passed, {f['skipped']} skipped, {f['failed']} failed, {f['errors']} errors"
    if name == "bench":
        parts = [f"ours/timm {f['ours_vs_timm']:.3f}x"] if f.get("ours_vs_timm") else []
        parts += [f"{label} {ratio:.2f}x vs standard (paper 1.31-1.54x)" for label, ratio
                  in f["step_time_vs_standard"].items() if ratio]
        parts += [f"{label} {g['ratio']:.2f}x vs standard (goal <= {g['limit']:g}x)" for label, g
                  in f.get("overhead_vs_standard", {}).items()]
        parts += [f"MFU {100 * f['mfu']:.1f}%"] if f.get("mfu") else []
        parts += [f"{key} {value:,.0f}" for key, value in f["data_images_per_s"].items()]
        return "; ".join(parts + [f"goals met {f['goals_met']}"])
    text = (f"{f['train_images_per_s']:,.0f} images/s, {f['time_per_epoch_s']:.1f} s/epoch, "
            f"wall {f['wall_time_s']:.0f} s, {f.get('precision')}" if f.get("train_images_per_s") else "")
    return text + (f"; {f['dataset_note']}" if f.get("dataset_note") else "")


# --- CLI ------------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python scripts/device_check.py", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--device", choices=DEVICES, default="cuda", help="where to run (default: cuda)")
    p.add_argument("--short", action="store_true", help="tiny sizes: seconds on a CPU (the test suite's check)")
    p.add_argument("--data-dir", help="folder with cifar-10-batches-py for the training run (default: synthetic data)")
    p.add_argument("--out", type=Path, help="folder for the results (default: results/device/<device>)")
    p.add_argument("--train-stage", action="store_true", help=argparse.SUPPRESS)  # the train stage's own process
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out = (args.out or Path(layout.RESULTS_DIR) / "device" / args.device).resolve()
    if args.train_stage:
        try:
            return train_stage(args.device, args.short, args.data_dir, out)
        except Exception as exc:  # the log keeps the traceback; the last line is what the report shows
            traceback.print_exc()
            print(f"error: {' '.join(str(exc).split()) or type(exc).__name__}", flush=True)
            return 1
    if args.data_dir and not Path(args.data_dir).is_dir():
        parser.error(f"--data-dir '{args.data_dir}' is not a folder")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda, but torch sees no CUDA device (torch.cuda.is_available() is False)")
    report = check(args.device, args.short, args.data_dir, out)
    passed = sum(s["status"] == "passed" for s in report["stages"].values())
    print(f"device check ({args.device}{', --short' if args.short else ''}): {passed}/{len(STAGES)} stages passed "
          f"in {report['wall_s']:.0f} s (budget {report['budget_s']['total']} s); wrote {out / 'device_check.json'} "
          f"and {out / 'device_check.md'}", file=sys.stderr)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
