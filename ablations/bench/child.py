"""Timings that need a process of their own: section 12's, whose malloc settings are per process, sections 3 and
11's with ``--processes`` and section 11's models with ``--isolate``. ``run`` starts the child,
``python -m ablations.bench.tasks '<json>'`` (:mod:`ablations.bench.tasks`), and reads its answer. The payload
names a ``task``, the benchmark's ``settings``, the parent's ``threads`` and the task's ``arguments``; the child
prints its result as one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from typing import Any

TIMEOUT_S = 1800  # one child's limit: a hung child stops the section with an error, not the bench
CHILD = "ablations.bench.tasks"  # the module the child process runs


def run(task: str, settings: Any, threads: int, env: dict[str, str] | None = None, **arguments: Any) -> dict:
    """Run ``task`` in a new Python process (``env``: its environment; None: this one's) with the benchmark's
    ``settings`` (:class:`ablations.bench.harness.Settings`) and return its result."""
    payload = json.dumps({"task": task, "settings": asdict(settings), "threads": threads, "arguments": arguments})
    try:
        done = subprocess.run([sys.executable, "-m", CHILD, payload], env=env, capture_output=True, text=True,
                              check=False, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the child process of task {task} ran past {TIMEOUT_S} s") from None
    last = (done.stderr.strip().splitlines() or ["no output on stderr"])[-1]
    if done.returncode != 0:
        raise RuntimeError(f"the child process of task {task} failed (exit {done.returncode}): {last}")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(f"the child process of task {task} printed no JSON result (stderr: {last})") from None
