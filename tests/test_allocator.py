"""glibc's malloc kept from handing freed memory back (ablations.machine.allocator, ABLATIONS_MALLOC=keep): the second
allocation of a large block takes (almost) no new pages from the kernel; it is the default, and system leaves glibc
alone; the user's own malloc settings win; a bad value is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ablations.machine import allocator

# Allocates, touches and frees a 64 MiB block twice, as a training step's activations come and go, and prints the
# page faults of each round (a new process: mallopt and the heap's state are process-wide).
CHILD = """
import ctypes, json, resource
from ablations.machine import allocator
how = allocator.set_malloc()
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
size = 64 << 20
faults = []
for _ in range(2):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"how": how, "faults": faults}))
"""


def child(env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True,
                          env=allocator.without_user_malloc({k: v for k, v in os.environ.items()
                                                             if k != allocator.ENV}) | env)
    return json.loads(done.stdout)


def thp_always() -> bool:  # transparent huge pages for every mapping: a 64 MiB block faults ~32 times, not ~16k
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return path.exists() and "[always]" in path.read_text()


@pytest.mark.skipif(not allocator.glibc() or thp_always(), reason="glibc's mallopt, small pages")
def test_kept_memory_is_not_faulted_in_again():
    assert child({})["how"] == allocator.KEPT  # the default
    system = child({allocator.ENV: "system"})
    kept = child({allocator.ENV: "keep"})
    assert system["how"] == "system (ABLATIONS_MALLOC=system)" and kept["how"] == allocator.KEPT
    # glibc's default maps the block, unmaps it at free and maps it again: both rounds take their pages anew ...
    assert system["faults"][1] > 0.5 * system["faults"][0] > 100
    # ... kept, the first round takes them and the second reuses them
    assert kept["faults"][0] > 100 and 20 * kept["faults"][1] < kept["faults"][0]


@pytest.mark.skipif(not allocator.glibc(), reason="glibc's mallopt (Linux with glibc)")
@pytest.mark.parametrize("env", [{"MALLOC_TOP_PAD_": "0"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}])
def test_a_user_s_own_glibc_settings_are_left_alone(env):
    assert child(env | {allocator.ENV: "keep"})["how"] == (
        "system (glibc's MALLOC_* variables or malloc tunables are set)")


@pytest.mark.skipif(not allocator.glibc(), reason="glibc's mallopt (Linux with glibc)")
def test_another_allocator_is_left_alone():
    # a library that does not exist: the loader warns and keeps glibc's malloc, but keep stands down all the same
    env = {"LD_PRELOAD": "/nonexistent/libjemalloc.so.2", allocator.ENV: "keep"}
    assert child(env)["how"] == "system (LD_PRELOAD is set)"


def test_outside_glibc_keep_stands_down(monkeypatch):
    monkeypatch.setenv(allocator.ENV, "keep")
    for name in ("LD_PRELOAD", "GLIBC_TUNABLES", *allocator.GLIBC_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(allocator, "glibc", lambda: False)
    assert allocator.set_malloc.__wrapped__() == "system (not glibc)"  # uncached: this process's malloc untouched


def test_a_bad_choice_is_one_line_naming_the_choices_before_anything_runs(monkeypatch, capsys):
    monkeypatch.setenv(allocator.ENV, "fast")
    with pytest.raises(ValueError, match=r"^ABLATIONS_MALLOC='fast' is not a malloc choice; valid choices: system, "
                                         r"keep$"):
        allocator.choice()
    import ablations.training
    from ablations.run.cli import main as run_main
    from ablations.train import main as train_main

    monkeypatch.setattr(ablations.training, "run_training", lambda *a, **k: pytest.fail("training started"))
    assert run_main(["--study", "residual_variants", "--dry-run"]) == 2
    with pytest.raises(SystemExit) as exit_:
        train_main(["--max-epochs", "1"])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all("ABLATIONS_MALLOC='fast' is not a malloc choice" in line for line in lines)
