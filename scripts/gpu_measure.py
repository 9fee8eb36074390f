"""Every GPU measurement of the stacked engine and the headline study in one command, its results in one folder.

    python scripts/gpu_measure.py --out gpu-results                   # on a GPU (docs/gpu-engine.md, section 7)
    python scripts/gpu_measure.py --out gpu-results --time-budget 2h  # the same, stopped cleanly after 2 hours
    python scripts/gpu_measure.py --device cpu --tiny --out /tmp/m    # the CPU dry form (tests/test_gpu_measure.py)

Stages, each a subprocess (a stage that fails, or runs out of its share of ``--time-budget``, is recorded; the others
run):

  cuda_tests  ``python -m pytest -m cuda -q``: the engine's graph replay against its eager step, and every other
              CUDA test (on ``--device cpu`` each skips);
  study       ``scripts/gpu_study.py --study residual_variants``: the headline study through the engine (tuning stage
              and 200 reported trials), its report and timings (with a budget: stopped cleanly at its share of it, with
              what finished);
  bench       ``python -m ablations.bench --device D --quick --sections gpu,engine,modes``: the engine on the device
              (the study-size aggregate images/s, the paper recipe's images/s and MFU, the multi-stream designs'
              steps), the levers per trial step (plain, stacked K, CUDA graphs), and the modes table precision
              ``auto`` reads on CUDA (``modes-cuda.json``: bf16 vs fp32, fused vs explicit attention, measured); the
              bench writes its report after every section, so a stage stopped at its limit keeps the first ones.

The study runs before the bench: it is the result the command exists for, and the bench's figures matter less
than the study finishing. With ``--time-budget``, the CUDA tests get 60 s, the bench 150 s and the study the
rest. ``--tiny`` (the CPU dry form): a two-variant, two-seed study file and the bench's tiny
sizes, seconds each.

Writes seven files under ``--out``, the few to copy back from a remote machine: ``gpu_measure.json`` /
``gpu_measure.md`` (the stages, their seconds and status, the goals' figures), ``gpu_study.json``, ``runs.csv``
(``--import-runs`` continues the study anywhere), ``study.tar.gz`` (the report's folder, the study's logs, its
SQLite storage), ``bench.tar.gz`` (the bench's json and md) and ``logs.tar.gz`` (every stage's output). Working
files go to ``--work`` (default: a temporary folder).

Exit status: 0 every stage passed; 1 a stage failed or timed out (the files still written); 2 bad input.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

# Imported where they are used, not here: PyYAML and torch. Each takes from a tenth of a second to seconds to import,
# and the command-line tools start without them.

ROOT = Path(__file__).resolve().parents[1]
for folder in (ROOT, ROOT / "scripts"):  # the repository's packages, and gpu_study beside this file
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from gpu_study import run_until  # noqa: E402

from ablations.cli import OneLineParser, duration, markdown_table  # noqa: E402

FORMAT = 1
#: With ``--time-budget``: each stage's share, in order; the study gets what the others leave (the budget less the
#: others and FINAL_S). Without one, no stage has a limit.
CUDA_TESTS_S, BENCH_S, FINAL_S = 60, 150, 15
#: The study's default budget: the headline's default (the CPU study's twin, so the two machines' verdicts compare);
#: ``--budget gpu`` then runs Fashion-MNIST at depth 12, 60 epochs, 20 seeds, reading its files from DATA_DIR when
#: that folder is there (scripts/gpu_wheels.sh puts them there for a machine without internet access).
BUDGET, DATA_DIR = "default", Path(".data/fashion-mnist")
STUDY, TINY_STUDY = "residual_variants", {
    "name": "measure_tiny", "kind": "grid", "metric": "test_acc",
    "base": {"dataset": "synthetic", "dataset_options": {"num_samples": 128, "img_size": 8}, "embed_dim": 8,
             "num_heads": 2, "depth": 1, "max_epochs": 1, "patch_size": 4, "batch_size": 32,
             "precision": "32-true"},
    "variants": [{"label": "standard", "residual": "standard"}, {"label": "rezero", "residual": "rezero"}],
    "axes": {"seed": [0, 1]}}


def stages(args: argparse.Namespace, work: Path, python: str = sys.executable) -> dict[str, tuple[list[str], float]]:
    """Each stage's command and seconds, in the order they run."""
    study = args.study
    if args.tiny:
        import yaml

        study = str(work / "measure_tiny.yaml")
        Path(study).write_text(yaml.safe_dump(TINY_STUDY, sort_keys=False))
    budget = args.time_budget
    study_s = budget - CUDA_TESTS_S - BENCH_S - FINAL_S if budget is not None else None
    study_cmd = [python, str(ROOT / "scripts" / "gpu_study.py"), "--study", study, "--budget",
                 "default" if args.tiny else args.budget, "--device", args.device,
                 "--out", str(work / "study"), "--pack", str(work / "study_pack")]
    study_cmd += ["--time-budget", f"{study_s:g}"] if study_s is not None else []
    if args.data_dir and args.data_dir.is_dir() and not args.tiny:  # else the loader's own search (and its error)
        study_cmd += ["--data-dir", str(args.data_dir.resolve())]
    study_cmd += ["--import-runs", str(args.import_runs)] if args.import_runs else []
    if args.tiny:
        study_cmd += ["--engine", "stacked", "--no-figures"]
        study_cmd += ["--margin-s", f"{min(90.0, study_s / 2):g}"] if study_s is not None else []
    bench_cmd = [python, "-m", "ablations.bench", "--device", args.device, "--tiny" if args.tiny else "--quick",
                 "--sections", "gpu,engine" if args.tiny else "gpu,engine,modes", "--out", str(work / "bench")]
    tests_cmd = [python, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider",
                 "--continue-on-collection-errors", "tests"]
    if budget is None:
        return {"cuda_tests": (tests_cmd, None), "study": (study_cmd, None), "bench": (bench_cmd, None)}
    return {"cuda_tests": (tests_cmd, CUDA_TESTS_S), "study": (study_cmd, study_s), "bench": (bench_cmd, BENCH_S)}


def goals(work: Path) -> dict[str, Any]:
    """The engine's goals as measured by this command (None where a stage did not measure it)."""
    out: dict[str, Any] = {}
    study = work / "study" / "gpu_study.json"
    if study.is_file():
        s = json.loads(study.read_text())
        out["study_wall_s"] = s.get("wall_s")
        out["study_run_status"] = s.get("run", {}).get("status")
        out["study_trials_completed"] = {k: v["complete"] for k, v in s.get("studies", {}).items()}
        out["study_trials_planned"] = s.get("planned")
        out["study_images_per_s"] = s.get("images_per_s")
    bench = work / "bench" / "bench.json"
    if bench.is_file():
        b = json.loads(bench.read_text())
        gpu = (b["sections"].get("gpu") or {}).get("data") or {}
        if gpu:
            out["aggregate_images_per_s"] = gpu["aggregate"]["images_per_s"]
            paper = gpu["paper"]
            out["paper_images_per_s"] = {k[:-len("_images_per_s")]: v for k, v in paper.items()
                                         if k.endswith("_images_per_s")}
            out["paper_mfu"] = {k[:-len("_mfu")]: v for k, v in paper.items() if k.endswith("_mfu")}
            out["design_ratios"] = gpu["designs"]["ratios"]
        engine = (b["sections"].get("engine") or {}).get("data") or {}
        if engine:
            out["per_trial_vs_plain"] = {m["model"]: m["per_trial_vs_plain"] for m in engine["models"]}
    return out


def render(report: dict) -> str:
    lines = [f"# GPU measurements ({report['device']}{', --tiny' if report['tiny'] else ''})", "",
             f"{report['date']}; wall {report['wall_s']:.0f} s{_of(report['limit_s'])}. Generated by `python "
             "scripts/gpu_measure.py`; raw figures in gpu_measure.json, the study in gpu_study.json and study.tar.gz, "
             "the bench in bench.tar.gz.", ""]
    rows = [[name, s["status"], f"{s['seconds']:.0f}" + (f" ({s['limit_s']:.0f})" if s["limit_s"] else ""),
             s.get("error") or ""]
            for name, s in report["stages"].items()]
    lines += [markdown_table(["stage", "status", "seconds (limit)", "error"], rows, "llrl"), ""]
    for key, value in report["goals"].items():
        lines.append(f"- {key}: {json.dumps(value, default=str)}")
    return "\n".join(lines) + "\n"


def _of(limit_s: float | None) -> str:
    return f" of its {limit_s:g} s budget" if limit_s is not None else ""


def pack(work: Path, out: Path) -> list[str]:
    """The command's files into ``out`` (the module's docstring names them)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ("gpu_measure.json", "gpu_measure.md"):
        shutil.copyfile(work / name, out / name)
        written.append(name)
    for name in ("gpu_study.json", "runs.csv", "study.tar.gz"):
        if (work / "study_pack" / name).is_file():
            shutil.copyfile(work / "study_pack" / name, out / name)
            written.append(name)
    for name, folder in (("bench.tar.gz", work / "bench"), ("logs.tar.gz", work / "logs")):
        if folder.is_dir():
            with tarfile.open(out / name, "w:gz") as tar:
                tar.add(folder, arcname=folder.name)
            written.append(name)
    return written


def parser() -> OneLineParser:
    p = OneLineParser(prog="python scripts/gpu_measure.py", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--out", type=Path, required=True, help="where the seven result files go")
    p.add_argument("--work", type=Path, help="working folder (default: a temporary one)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--tiny", action="store_true", help="the CPU dry form: a tiny study and the bench's tiny sizes")
    p.add_argument("--study", default=STUDY, help=f"the study (default {STUDY})")
    p.add_argument("--budget", default=BUDGET, help=f"the study's budget (default {BUDGET}; --tiny: its one)")
    p.add_argument("--data-dir", type=Path, default=DATA_DIR,
                   help=f"the study's --data-dir (default {DATA_DIR}: Fashion-MNIST's files, as scripts/gpu_wheels.sh "
                        "puts them for a machine without internet access)")
    p.add_argument("--import-runs", type=Path, metavar="RUNS_CSV",
                   help="the runs.csv of an earlier run of the study: it continues from it")
    p.add_argument("--time-budget", type=duration, metavar="DURATION",
                   help="stop every stage cleanly within this wall time (seconds, or e.g. 90m, 2h; default: none)")
    return p


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    p = parser()
    args = p.parse_args(argv)
    if args.time_budget is not None and args.time_budget <= CUDA_TESTS_S + BENCH_S + FINAL_S + 60:
        p.error(f"--time-budget ({args.time_budget:g} s) leaves the study under a minute: give more than "
                f"{CUDA_TESTS_S + BENCH_S + FINAL_S + 60} s")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda, but torch sees no CUDA device (torch.cuda.is_available() is False)")
    work = (args.work or Path(tempfile.mkdtemp(prefix="gpu_measure_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"format": FORMAT, "device": args.device, "tiny": args.tiny, "limit_s": args.time_budget,
                              "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                              "stages": {}, "goals": {}, "wall_s": 0.0}
    for name, (command, seconds) in stages(args, work).items():
        limit = f" (limit {seconds:.0f} s)" if seconds is not None else ""
        print(f"[{name}]{limit}: {shlex.join(command[1:])}", file=sys.stderr, flush=True)
        start = time.monotonic()
        deadline = (min(start + seconds, started + args.time_budget - FINAL_S) if seconds is not None
                    else float("inf"))
        code, stopped = run_until(command, deadline, work / "logs" / f"{name}.log", grace_s=10)
        status = "timeout" if stopped else "passed" if code == 0 else "failed"
        if name == "cuda_tests" and code == 5:  # pytest: no test collected/ran (all deselected): nothing failed
            status = "passed"
        report["stages"][name] = {"command": shlex.join(command[1:]), "returncode": code, "status": status,
                                  "seconds": round(time.monotonic() - start, 1), "limit_s": seconds,
                                  "log": f"logs/{name}.log"}
        print(f"      {status} in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
        report["goals"] = goals(work)
        report["wall_s"] = round(time.monotonic() - started, 1)
        (work / "gpu_measure.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        (work / "gpu_measure.md").write_text(render(report))
    written = pack(work, args.out)
    print(f"gpu measurements: {sum(s['status'] == 'passed' for s in report['stages'].values())}/{len(report['stages'])} "
          f"stages passed in {report['wall_s']:.0f} s; wrote {', '.join(written)} into {args.out}", file=sys.stderr)
    return 0 if all(s["status"] == "passed" for s in report["stages"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
