"""Timings that need a process of their own, run as ``python -m ablations.bench.child '<json>'``: section 12's,
whose malloc settings are per process, sections 3 and 11's with ``--processes`` and section 11's models with
``--isolate``. The payload names a ``task``, the benchmark's ``settings``, the parent's ``threads`` and the task's
``arguments``; the child prints its result as one JSON line."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from typing import Any

from .. import allocator
from .harness import Settings

TIMEOUT_S = 1800  # one child's limit: a hung child stops the section with an error, not the bench


def run(task: str, settings: Settings, threads: int, env: dict[str, str] | None = None, **arguments: Any) -> dict:
    """Run ``task`` in a new Python process (``env``: its environment; None: this one's) and return its result."""
    payload = json.dumps({"task": task, "settings": asdict(settings), "threads": threads, "arguments": arguments})
    try:
        done = subprocess.run([sys.executable, "-m", __name__, payload], env=env, capture_output=True, text=True,
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


def settings_from(fields: dict) -> Settings:
    """``Settings`` back from ``asdict`` through JSON (lists were tuples)."""
    return Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def main(payload: str) -> None:
    import torch

    from .loops import lightning_times
    from .malloc import time_both_sizes
    from .steps import one_model_time, overhead_times

    tasks = {"lightning": lightning_times, "malloc": time_both_sizes, "one_model": one_model_time,
             "overhead": overhead_times}
    request = json.loads(payload)
    torch.set_num_threads(request["threads"])
    if request["settings"]["device"] == "cpu":
        allocator.set_malloc()  # as the parent (and training): ABLATIONS_MALLOC of the child's environment
    result = tasks[request["task"]](settings_from(request["settings"]), **request["arguments"])
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
