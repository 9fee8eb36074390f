"""The child process of :func:`ablations.bench.child.run`: ``python -m ablations.bench.tasks '<json>'`` runs one
task (a section's measurement in a process of its own) with the parent's settings and threads, and prints its
result as one JSON line."""

from __future__ import annotations

import json
import sys

from ..machine import allocator
from .harness import Settings
from .loops import lightning_times
from .malloc import time_both_sizes
from .steps import one_model_time, overhead_times

# Imported where they are used, not here: torch. Each takes from a tenth of a second to seconds to import, and the
# command-line tools start without them.


def settings_from(fields: dict) -> Settings:
    """``Settings`` back from ``asdict`` through JSON (lists were tuples)."""
    return Settings(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def main(payload: str) -> None:
    import torch

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
