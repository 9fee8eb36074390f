"""Ctrl-C / SIGTERM never lands inside a storage transaction (ablations/studies/stopping.py, storage.open_storage).

Each case runs a short script in its own process (a signal handler is process-wide): the script sends itself SIGTERM
from inside a storage call (a SQLAlchemy listener that fires after a statement ran, with the transaction and its
SQLite write lock open) and prints where the KeyboardInterrupt was raised and whether the lock was free then.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from ablations.cli import duration

SCRIPT = """
import json, os, signal, sqlite3, sys, time, traceback
import optuna
from sqlalchemy import event
from ablations.studies import stopping
from ablations.studies.storage import open_storage

optuna.logging.set_verbosity(optuna.logging.ERROR)
db, storage_kind, hang, limit_s = sys.argv[1], sys.argv[2], sys.argv[3] == "hang", float(sys.argv[4])
url = "sqlite:///" + db
storage = open_storage(url) if storage_kind == "ours" else optuna.storages.RDBStorage(url)
study = optuna.create_study(study_name="s", storage=storage)
trial = study.ask()
stopping.DEFER_LIMIT_S = limit_s
stopping.stop_on_signals()
sent = []
listener_returned = []

@event.listens_for(storage.engine, "after_cursor_execute")
def signal_mid_transaction(*args):
    if not sent:
        sent.append(True)
        os.kill(os.getpid(), signal.SIGTERM)
        while hang:  # a call that never returns (a lock never released, a server that hangs)
            time.sleep(0.05)
        listener_returned.append(True)  # the statement's transaction is still open here

returned = False
try:
    study.get_trials(deepcopy=False)
    returned = True
    time.sleep(30)
except KeyboardInterrupt as exc:
    forced = bool(stopping._FORCED)  # raised by the DEFER_LIMIT_S timer, not as the call returned
    frames = [f.filename for f in traceback.extract_tb(exc.__traceback__)]
    probe = sqlite3.connect(db, timeout=0.5, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        lock_free = True
    except sqlite3.OperationalError:
        lock_free = False
    print(json.dumps({"returned": returned, "listener_returned": bool(listener_returned), "forced": forced,
                      "innermost": frames[-1],
                      "in_sqlalchemy": any("sqlalchemy" in f for f in frames), "lock_free": lock_free}))
    sys.exit(stopping.interrupted())
"""


def _run(tmp_path, storage_kind: str, hang: bool = False, limit_s: float = 90.0) -> dict:
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "o.db"), storage_kind,
                             "hang" if hang else "return", str(limit_s)], capture_output=True, text=True,
                            timeout=600)  # a hang limit only
    assert result.returncode == 143, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("interrupted (SIGTERM)"), result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_stop_signal_inside_a_storage_call_is_raised_as_the_call_returns(tmp_path):
    """The signal came while the call's transaction held SQLite's write lock: the KeyboardInterrupt is raised at the
    storage's boundary (no SQLAlchemy frame under it), the call's transaction is over and the lock is free."""
    seen = _run(tmp_path, "ours")
    assert seen["innermost"].endswith("ablations/studies/stopping.py") and not seen["in_sqlalchemy"], seen
    assert seen["lock_free"] and not seen["returned"] and seen["listener_returned"] and not seen["forced"], seen


def test_without_holding_the_signal_lands_inside_the_transaction(tmp_path):
    """The control: optuna's own RDBStorage takes the KeyboardInterrupt in the middle of SQLAlchemy's code (where a
    cursor interrupted while fetching rows can keep the write lock after its connection is closed)."""
    seen = _run(tmp_path, "optuna")
    assert seen["in_sqlalchemy"], seen


def test_a_storage_call_that_hangs_does_not_hold_the_signal_past_the_limit(tmp_path):
    """A call that never returns (a lock that is never released, a server that hangs) gets the signal raised
    inside it by the ``DEFER_LIMIT_S`` timer: the process stops although the call is still running. No duration
    is asserted: the call never ends, so only the limit can have raised it (with the limit off the script would hang
    until the subprocess's hang limit)."""
    seen = _run(tmp_path, "ours", hang=True, limit_s=0.5)
    assert seen["forced"] and seen["in_sqlalchemy"] and not seen["listener_returned"], seen
    assert not seen["returned"], seen


BUDGET_SCRIPT = """
import sys, time
from ablations.studies import stopping

stopping.stop_on_signals()
cancel = stopping.stop_after(float(sys.argv[1]))
if sys.argv[2] == "cancel":
    cancel()
try:
    time.sleep(float(sys.argv[3]))
except KeyboardInterrupt:
    sys.exit(stopping.interrupted())
print("slept to the end")
"""


def _budget(budget: str, mode: str, sleep_s: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BUDGET_SCRIPT, budget, mode, sleep_s], capture_output=True,
                          text=True, timeout=600)


def test_the_end_of_a_time_budget_stops_the_process_as_sigterm_does_and_says_so():
    """``--time-budget``'s timer: after 0.5 s the process sends itself SIGTERM, the one-hour sleep is cut short
    and the process exits 143 with the budget's line (the CLI's run and its rerun: tests/test_faults.py)."""
    result = _budget("0.5", "keep", "3600")
    assert result.returncode == 143, result.stderr
    assert result.stderr.strip() == ("time budget of 0.5 s reached: completed trials are kept; rerun the same "
                                     "command to continue") and result.stdout == ""


def test_a_cancelled_time_budget_never_fires():
    """The CLI cancels its budget as it returns (a caller's process, a test calling ``main``, must never get the
    signal later): cancelled, a 0.2 s budget lets a 1 s sleep end."""
    result = _budget("0.2", "cancel", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "slept to the end" and result.stderr == ""


def test_a_duration_is_read_in_seconds_minutes_or_hours_and_anything_else_is_refused():
    assert [duration(t) for t in ("5400", "45s", "90m", "1.5h", "2h30m", " 2H ")] == [
        5400.0, 45.0, 5400.0, 5400.0, 9000.0, 7200.0]
    for bad in ("", "0", "0m", "abc", "h", "1d", "-5"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration(bad)
