"""glibc's malloc kept from handing freed memory back (ablations.allocator, ABLATIONS_MALLOC=keep): the second
allocation of a large block takes no new pages from the kernel; the default leaves glibc alone; a bad value."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

from ablations import allocator

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# Allocates, touches and frees a 64 MiB block twice, as a training step's activations come and go, and prints the
# page faults of the second round (a new process: mallopt and the heap's state are process-wide).
CHILD = """
import ctypes, json, resource
from ablations import allocator
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


def child(env: dict[str, str], monkeypatch) -> dict:
    for name in (allocator.ENV, "LD_PRELOAD", *allocator.GLIBC_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt (Linux with glibc)")
def test_kept_memory_is_not_faulted_in_again(monkeypatch):
    pages = (64 << 20) // 4096
    system = child({allocator.ENV: "system"}, monkeypatch)
    assert system["how"] == "system (ABLATIONS_MALLOC=system)"
    assert system["faults"][1] > pages // 2  # glibc's default: the block was mmap'ed, unmapped, mapped again
    assert child({}, monkeypatch)["how"] == "system (the default)"
    kept = child({allocator.ENV: "keep"}, monkeypatch)
    assert kept["how"] == allocator.KEPT
    assert kept["faults"][0] > pages // 2  # the first round takes its pages from the kernel ...
    assert kept["faults"][1] < pages // 100  # ... the second reuses them


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt (Linux with glibc)")
@pytest.mark.parametrize("env, why", [({"MALLOC_TOP_PAD_": "0"}, "glibc's MALLOC_* variables are set"),
                                      # (a library that does not exist: the loader warns and keeps glibc's malloc)
                                      ({"LD_PRELOAD": "/nonexistent/libjemalloc.so.2"}, "LD_PRELOAD is set")])
def test_a_user_s_own_malloc_settings_are_left_alone(env, why, monkeypatch):
    assert child(env | {allocator.ENV: "keep"}, monkeypatch)["how"] == f"system ({why})"


def test_a_bad_choice_is_one_line_naming_the_choices(monkeypatch, capsys):
    monkeypatch.setenv(allocator.ENV, "fast")
    with pytest.raises(ValueError, match=r"^ABLATIONS_MALLOC='fast' is not a malloc choice; valid choices: system, "
                                         r"keep$"):
        allocator.choice()
    from ablations.run.cli import main as run_main
    from ablations.train import main as train_main

    assert run_main(["--study", "residual_variants", "--dry-run"]) == 2
    with pytest.raises(SystemExit) as exit_:
        train_main(["--max-epochs", "1"])
    assert exit_.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all("ABLATIONS_MALLOC='fast' is not a malloc choice" in line for line in lines)
