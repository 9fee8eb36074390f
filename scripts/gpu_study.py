"""A whole study on a GPU in one command: the run, its report and its timings, under one folder.

    python scripts/gpu_study.py --study residual_variants                   # on a GPU: the headline
    python scripts/gpu_study.py --study residual_variants --budget gpu --time-budget 3h
    python scripts/gpu_study.py --study tests/x.yaml --device cpu --time-budget 120 --out /tmp/s   # the CPU dry form

Two stages, each a subprocess in its own process group:

  run     ``python -m ablations.run --study NAME [--budget B] [--set ...] --device D --engine E --workers W
          [--stack K] --storage sqlite:///<out>/optuna.db --results-dir <out>`` (the engine's stacks on a GPU:
          ``docs/gpu-engine.md``). With ``--time-budget``, it must end by the *run deadline*: the budget less the
          margin kept for the report. At the deadline the script sends SIGTERM to the run's process group, the study
          stops cleanly (its running trials marked failed with their checkpoints kept, exit 143), and SIGKILL follows
          after :data:`STOP_GRACE_S` if it has not;
  report  ``python -m ablations.report ... --no-figures`` on that storage: ``<out>/<study name>/runs.csv`` and the
          study's tables, from whatever finished (a study stopped inside its tuning stage reports its tuning rows
          and runs.csv); then (with a budget: with :data:`FIGURES_S` left) the same with its figures. With a
          budget, killed at its end less :data:`FINAL_S`.

Between the two, ``<out>/<study name>/runs.csv`` is written straight from the storage (the report's writer), so
that the study can be continued elsewhere whatever the report's time.

``<out>/gpu_study.json`` and ``.md`` (rewritten after each stage) hold the timings: each stage's seconds and status,
the trials each stage of the study completed of how many, the stacks the engine trained, the training images of
the completed trials and their aggregate images/s over the run's wall time, the study's wall time per completed
trial, and the machine. ``--pack DIR`` then writes the four files to copy back from a remote machine into DIR:
the two timing files, the ``runs.csv`` (``python -m ablations.run --study NAME --import-runs runs.csv``
continues the study on any machine) and ``study.tar.gz`` (the report's folder, the run's log and the SQLite
storage; not the TensorBoard event files).

Exit status: 0 the study completed and the report was written; 1 the run stopped at its deadline or failed, or
the report failed (what finished is still written); 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

# Imported where they are used, not here: torch and the report's modules. Each takes from a tenth of a second to
# seconds to import, and the command-line tools start without them.

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file (python scripts/gpu_study.py): the repository's packages
    sys.path.insert(0, str(ROOT))

from ablations.cli import OneLineParser, duration, markdown_table  # noqa: E402

FORMAT = 1
#: With ``--time-budget``: seconds kept after the run for the report and writing (the run's deadline is the budget
#: less this).
MARGIN_S = 90
#: After the run's SIGTERM: seconds for the workers to mark their trials failed before SIGKILL.
STOP_GRACE_S = 30
#: Seconds kept at the very end for this script's own writing (the report is killed before).
FINAL_S = 10
#: The figures are made (a second report pass) only with at least this many seconds left after the tables.
FIGURES_S = 30
#: Default workers and trials per stack by device: on a GPU several processes keep it busy while each spends its
#: CPU time on the epoch's evaluation, diagnostics and checkpoints; a CPU runs one.
WORKERS = {"cuda": 12, "cpu": 1}
STACK = {"cuda": 20, "cpu": 8}


def run_command(args: argparse.Namespace, out: Path, python: str = sys.executable) -> list[str]:
    """The study's ``ablations.run`` call."""
    command = [python, "-m", "ablations.run", "--study", args.study, "--budget", args.budget, "--device", args.device,
               "--engine", args.engine, "--workers", str(args.workers), "--stack", str(args.stack),
               "--storage", storage_url(out), "--results-dir", str(out), "--no-progress"]
    for item in args.sets:
        command += ["--set", item]
    command += ["--data-dir", args.data_dir] if args.data_dir else []
    return command + (["--import-runs", str(args.import_runs)] if args.import_runs else [])


def report_command(args: argparse.Namespace, out: Path, figures: bool, python: str = sys.executable) -> list[str]:
    command = [python, "-m", "ablations.report", "--study", args.study, "--budget", args.budget,
               "--storage", storage_url(out), "--results-dir", str(out), "--no-note"]
    for item in args.sets:
        command += ["--set", item]
    return command + ([] if figures else ["--no-figures"])


def storage_url(out: Path) -> str:
    return f"sqlite:///{out / 'optuna.db'}"


def run_until(command: list[str], deadline: float, log: Path, grace_s: float = STOP_GRACE_S) -> tuple[int | None, bool]:
    """Run ``command`` in its own process group (output to ``log``) until it ends or ``deadline`` (a
    ``time.monotonic()``; ``math.inf``: none): then SIGTERM to the group, SIGKILL after ``grace_s``. Returns (exit
    status, stopped at the deadline)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        handle.write(f"$ {shlex.join(command)}\n")
        handle.flush()
        proc = subprocess.Popen(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=None if math.isinf(deadline) else max(0.0, deadline - time.monotonic())), False
        except subprocess.TimeoutExpired:
            pass
        except BaseException:
            _signal_group(proc, signal.SIGKILL)
            raise
        _signal_group(proc, signal.SIGTERM)
        try:
            return proc.wait(timeout=grace_s), True
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            return proc.wait(), True


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def study_counts(out: Path) -> dict[str, Any]:
    """Per stored study (the reported grid and its ``-tune`` stage): trials by state, the engine's stacks, and the
    completed trials' training images and wall times (read from the SQLite storage)."""
    path = out / "optuna.db"
    if not path.is_file():
        return {}
    counts: dict[str, Any] = {}
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        for study_id, name in db.execute("SELECT study_id, study_name FROM studies"):
            states = dict(db.execute("SELECT state, COUNT(*) FROM trials WHERE study_id = ? GROUP BY state",
                                     (study_id,)).fetchall())
            attrs: dict[int, dict[str, Any]] = {}
            for trial_id, key, value in db.execute(
                    "SELECT t.trial_id, a.key, a.value_json FROM trials t JOIN trial_user_attributes a "
                    "ON a.trial_id = t.trial_id WHERE t.study_id = ? AND t.state = 'COMPLETE' AND a.key IN "
                    "('images_seen', 'wall_time_s', 'engine', 'device')", (study_id,)):
                attrs.setdefault(trial_id, {})[key] = json.loads(value)
            engines: dict[str, int] = {}
            for a in attrs.values():
                engines[a.get("engine") or "plain"] = engines.get(a.get("engine") or "plain", 0) + 1
            counts[name] = {"states": states, "complete": states.get("COMPLETE", 0),
                            "images": int(sum(a.get("images_seen") or 0 for a in attrs.values())),
                            "trial_wall_s": float(sum(a.get("wall_time_s") or 0 for a in attrs.values())),
                            "engines": engines}
    return counts


def write_runs_csv(args: argparse.Namespace, out: Path, study_name: str) -> str:
    """``<out>/<study name>/runs.csv`` straight from the storage (the report's own writer; no tables, no event
    files read), before the report: whatever the report's time, the study can be continued. Returns what happened,
    in a few words."""
    try:
        from ablations import layout
        from ablations.report import runs as runs_csv
        from ablations.report.load import collect, open_study, open_tune_study
        from ablations.studies.overrides import apply_sets, parse_sets
        from ablations.studies.spec import load_spec

        spec = apply_sets(load_spec(args.study, args.budget), parse_sets(args.sets))
        study = open_study(storage_url(out), study_name, spec)
        data = collect(study, spec, out, tune_study=open_tune_study(study))
        path = runs_csv.write(data, layout.report_dir(out, study_name) / "runs.csv")
        return f"written: {path}"
    except Exception as exc:  # noqa: BLE001 - e.g. nothing stored yet: the report says it in its own words
        return f"not written: {' '.join(str(exc).split())[:200] or type(exc).__name__}"


def planned_trials(args: argparse.Namespace) -> dict[str, int]:
    """The trials each stage of the study has: ``{study name: n, tuning stage name: n}``."""
    from ablations.studies.overrides import apply_sets, parse_sets
    from ablations.studies.spec import load_spec, tune_name

    spec = apply_sets(load_spec(args.study, args.budget), parse_sets(args.sets))
    planned = {spec.study_name: spec.size}
    if spec.tune is not None:
        planned[tune_name(spec.study_name)] = spec.tune_stage().size
    return planned


def machine_facts(device: str) -> dict[str, Any]:
    import platform

    import torch

    facts = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
             "python": platform.python_version(), "cpu_count": os.cpu_count(), "gpu": None}
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1)}
    return facts


def write(report: dict, out: Path) -> None:
    (out / "gpu_study.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "gpu_study.md").write_text(render(report))


def render(report: dict) -> str:
    m = report["machine"]
    limit = (f"time budget {report['limit_s']:g} s (run deadline {report['run_deadline_s']:g} s), "
             if report["limit_s"] is not None else "")
    lines = [f"# {report['study']} ({report['budget']}) in one {report['device']} command", "",
             f"{report['date']}; {m.get('gpu') or 'no GPU'}; torch {m['torch']}, CUDA {m['cuda']}, Python "
             f"{m['python']}, {m['cpu_count']} CPUs; {limit}wall {report['wall_s']:.0f} s. Generated by `python "
             f"scripts/gpu_study.py`; raw figures in gpu_study.json. Command: `{report['run']['command']}`.", ""]
    rows = [[name, f"{c['complete']} of {report['planned'].get(name, '?')}",
             ", ".join(f"{k}: {v}" for k, v in sorted(c["engines"].items())) or "—", f"{c['images']:,}"]
            for name, c in report["studies"].items()]
    lines += [markdown_table(["stored study", "trials completed", "trained by", "training images"], rows, "lrll"), ""]
    run, rep = report["run"], report.get("report") or {}
    lines += [f"- run: {run['status']} after {run['seconds']:.0f} s"
              + (" (stopped at its deadline: the trials left continue elsewhere with --import-runs)"
                 if run.get("stopped") else "")
              + f"; {report['images_per_s']:,.0f} training images/s over the run's wall time, all trials together",
              f"- report: {rep.get('status', 'not run')}" + (f" after {rep['seconds']:.0f} s (figures: "
                                                             f"{rep.get('figures')})" if rep else "")]
    return "\n".join(lines) + "\n"


def pack(out: Path, dest: Path, study_name: str) -> list[Path]:
    """The four files to copy back into ``dest`` (module docstring)."""
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ("gpu_study.json", "gpu_study.md"):
        if (out / name).is_file():
            written.append(dest / name)
            written[-1].write_bytes((out / name).read_bytes())
    runs = out / study_name / "runs.csv"
    if runs.is_file():
        written.append(dest / "runs.csv")
        written[-1].write_bytes(runs.read_bytes())
    archive = dest / "study.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for item in (out / study_name, out / "logs", out / "optuna.db"):
            if item.exists():
                tar.add(item, arcname=item.name)
    written.append(archive)
    return written


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    p = OneLineParser(prog="python scripts/gpu_study.py", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--study", required=True, help="a study name or YAML file (as ablations.run)")
    p.add_argument("--budget", default="default", help="the study's budget (default: default)")
    p.add_argument("--set", action="append", default=[], dest="sets", metavar="FIELD=VALUE",
                   help="as ablations.run --set (repeatable)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--engine", choices=("auto", "plain", "stacked"), default="auto")
    p.add_argument("--workers", type=int, help=f"ablations.run --workers (default: {WORKERS})")
    p.add_argument("--stack", type=int, help=f"ablations.run --stack (default: {STACK})")
    p.add_argument("--time-budget", type=duration, metavar="DURATION",
                   help="stop the run cleanly and write the report within this wall time (seconds, or e.g. 90m, 3h; "
                        "default: none)")
    p.add_argument("--margin-s", type=float, default=MARGIN_S,
                   help=f"with --time-budget: seconds of it kept after the run for the report (default {MARGIN_S})")
    p.add_argument("--data-dir", help="as ablations.run --data-dir")
    p.add_argument("--import-runs", type=Path, metavar="RUNS_CSV",
                   help="as ablations.run --import-runs: continue a study from an earlier run's runs.csv")
    p.add_argument("--no-figures", action="store_true", help="the report's tables only")
    p.add_argument("--out", type=Path, help="working folder (default: results/device/<device>/study-<study>-<budget>)")
    p.add_argument("--pack", type=Path, metavar="DIR", help="also write the four files to copy back into DIR")
    args = p.parse_args(argv)
    if args.time_budget is not None and args.time_budget <= args.margin_s + FINAL_S:
        p.error(f"--time-budget ({args.time_budget:g} s) must exceed --margin-s ({args.margin_s:g}) + {FINAL_S} s")
    limit = math.inf if args.time_budget is None else args.time_budget
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda, but torch sees no CUDA device (torch.cuda.is_available() is False)")
    args.workers = args.workers or WORKERS[args.device]
    args.stack = args.stack or STACK[args.device]
    try:
        planned = planned_trials(args)
    except ValueError as exc:
        p.error(" ".join(str(exc).split()))
    study_name = next(iter(planned))
    out = (args.out or ROOT / "results" / "device" / args.device / f"study-{Path(args.study).stem}-{args.budget}")
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "format": FORMAT, "study": args.study, "budget": args.budget, "sets": args.sets, "device": args.device,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "limit_s": args.time_budget,
        "run_deadline_s": None if args.time_budget is None else args.time_budget - args.margin_s, "machine": machine_facts(args.device), "planned": planned,
        "workers": args.workers, "stack": args.stack, "wall_s": 0.0, "studies": {}, "images_per_s": 0.0}
    command = run_command(args, out)
    deadline = f" (deadline {limit - args.margin_s:.0f} s)" if args.time_budget is not None else ""
    print(f"[1/2] run{deadline}: {shlex.join(command[1:])}", file=sys.stderr, flush=True)
    run_start = time.monotonic()
    code, stopped = run_until(command, started + limit - args.margin_s, out / "logs" / "run.log")
    run_s = time.monotonic() - run_start
    report["run"] = {"command": shlex.join(command[1:]), "returncode": code, "stopped": stopped,
                     "seconds": round(run_s, 1),
                     "status": "stopped at its deadline" if stopped else "passed" if code == 0 else "failed"}
    report["studies"] = study_counts(out)
    images = sum(c["images"] for c in report["studies"].values())
    report["images_per_s"] = images / run_s if run_s > 0 else 0.0
    report["wall_s"] = round(time.monotonic() - started, 1)
    write(report, out)
    print(f"      {report['run']['status']} in {run_s:.0f} s: " + ", ".join(
        f"{name} {c['complete']}/{planned.get(name, '?')}" for name, c in report["studies"].items()),
        file=sys.stderr, flush=True)
    report["runs_csv"] = write_runs_csv(args, out, study_name)  # first of all: what --import-runs continues from
    write(report, out)
    # the report's tables (runs.csv again among them), then its figures if time is left
    report_start = time.monotonic()
    for figures in (False, True):
        left = started + limit - FINAL_S - time.monotonic()
        if figures and (args.no_figures or report["report"]["status"] != "passed" or left < FIGURES_S):
            break
        command = report_command(args, out, figures)
        print(f"[2/2] report{' figures' if figures else ''}: {shlex.join(command[1:])}", file=sys.stderr, flush=True)
        code_r, killed = run_until(command, started + limit - FINAL_S, out / "logs" / "report.log",
                                   grace_s=3)
        status = "timeout" if killed else "passed" if code_r == 0 else "failed"
        if figures:
            report["report"]["figures"] = status
            continue
        report["report"] = {"command": shlex.join(command[1:]), "returncode": code_r, "status": status,
                            "figures": "not made"}
    report["report"]["seconds"] = round(time.monotonic() - report_start, 1)
    report["wall_s"] = round(time.monotonic() - started, 1)
    write(report, out)
    written = pack(out, args.pack, study_name) if args.pack else []
    print(f"gpu study: run {report['run']['status']}, report {report['report']['status']}, wall "
          f"{report['wall_s']:.0f} s; wrote {out / 'gpu_study.json'}"
          + (f" and {len(written)} files into {args.pack}" if written else ""), file=sys.stderr)
    return 0 if report["run"]["status"] == "passed" and report["report"]["status"] == "passed" else 1


if __name__ == "__main__":
    raise SystemExit(main())
