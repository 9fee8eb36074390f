"""Ctrl-C / SIGTERM never lands inside a storage transaction (ablations/stopping.py, storage.open_storage).

Each case runs a short script in its own process (a signal handler is process-wide): the script sends itself SIGTERM
from inside a storage call (a SQLAlchemy listener that fires after a statement ran, with the transaction and its
SQLite write lock open) and prints where the KeyboardInterrupt was raised and whether the lock was free then.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = """
import json, os, signal, sqlite3, sys, time, traceback
import optuna
from sqlalchemy import event
from ablations import stopping
from ablations.storage import open_storage

optuna.logging.set_verbosity(optuna.logging.ERROR)
db, storage_kind, sleep_s, limit_s = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
url = "sqlite:///" + db
storage = open_storage(url) if storage_kind == "ours" else optuna.storages.RDBStorage(url)
study = optuna.create_study(study_name="s", storage=storage)
trial = study.ask()
stopping.DEFER_LIMIT_S = limit_s
stopping.stop_on_signals()
sent = []

@event.listens_for(storage.engine, "after_cursor_execute")
def signal_mid_transaction(*args):
    if not sent:
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(sleep_s)  # the statement's transaction stays open meanwhile

returned = False
try:
    study.get_trials(deepcopy=False)
    returned = True
    time.sleep(30)
except KeyboardInterrupt as exc:
    raised_after = time.monotonic() - sent[0]
    frames = [f.filename for f in traceback.extract_tb(exc.__traceback__)]
    probe = sqlite3.connect(db, timeout=0.5, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        lock_free = True
    except sqlite3.OperationalError:
        lock_free = False
    print(json.dumps({"returned": returned, "raised_after": raised_after, "innermost": frames[-1],
                      "in_sqlalchemy": any("sqlalchemy" in f for f in frames), "lock_free": lock_free}))
    sys.exit(stopping.interrupted())
"""


def _run(tmp_path, storage_kind: str, sleep_s: float = 0.0, limit_s: float = 90.0) -> dict:
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "o.db"), storage_kind, str(sleep_s),
                             str(limit_s)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 143, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("interrupted (SIGTERM)"), result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_stop_signal_inside_a_storage_call_is_raised_as_the_call_returns(tmp_path):
    """The signal came while the call's transaction held SQLite's write lock: the KeyboardInterrupt is raised at the
    storage's boundary (no SQLAlchemy frame under it), the call's transaction is over and the lock is free."""
    seen = _run(tmp_path, "ours")
    assert seen["innermost"].endswith("ablations/stopping.py") and not seen["in_sqlalchemy"], seen
    assert seen["lock_free"] and not seen["returned"], seen


def test_without_holding_the_signal_lands_inside_the_transaction(tmp_path):
    """The control: optuna's own RDBStorage takes the KeyboardInterrupt in the middle of SQLAlchemy's code (where a
    cursor interrupted while fetching rows can keep the write lock after its connection is closed)."""
    seen = _run(tmp_path, "optuna")
    assert seen["in_sqlalchemy"], seen


@pytest.mark.parametrize("limit_s", [0.5])
def test_a_storage_call_that_hangs_does_not_hold_the_signal_past_the_limit(tmp_path, limit_s):
    """A call that takes longer than ``DEFER_LIMIT_S`` (a lock that is never released, a server that hangs) gets
    the signal raised inside it once the limit has passed, not when (or if) it returns."""
    seen = _run(tmp_path, "ours", sleep_s=20.0, limit_s=limit_s)
    assert seen["in_sqlalchemy"] and limit_s <= seen["raised_after"] < 10.0, seen
