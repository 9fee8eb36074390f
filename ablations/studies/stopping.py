"""Ctrl-C and SIGTERM for the study CLI: stop cleanly, never in the middle of a storage transaction.

The first SIGINT or SIGTERM raises ``KeyboardInterrupt`` in the main thread (the running trial is marked FAIL with its
checkpoints kept; the CLI exits 130 or 143); later ones are ignored so that they cannot cut that clean-up short.

A signal that arrives while the main thread is inside a call to the study's storage is held until the call returns
(:func:`held_during`). Raised in the middle of a call it could
leave a transaction open with nothing left to close it: a SQLite cursor interrupted while fetching rows keeps its
statement, and SQLite then keeps the closed connection (and its write lock) alive for as long as the exception's
traceback holds the cursor. The process's own "mark the trial failed" then waited for its own lock until SQLite's
busy timeout (60 s), and so did every other worker on the file; seen 3 times in 250 SIGTERMs sent to a process
making storage calls in a loop against a second one (scripts/stress_stop_signals.py; tests/test_stopping.py).
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import os
import signal
import sys
import threading

EXIT_SIGINT, EXIT_SIGTERM = 130, 143  # 128 + the signal number, as a shell reports a process the signal ended
#: Longest a stop signal waits for the main thread to leave a storage call (a call waiting for SQLite's write lock
#: takes up to its 60 s busy timeout); after it the signal is raised wherever the main thread is.
DEFER_LIMIT_S = 90.0

_STOPPING: list[int] = []  # the signal that is stopping this process, once one came
_REDELIVERED: list[bool] = []  # set while a held or swallowed stop signal is delivered again (:func:`_redeliver`)
_HELD: list[bool] = []  # a stop signal waits for the main thread's storage call to end (held_during)
_FORCED: list[bool] = []  # set when a held signal waited DEFER_LIMIT_S: raise it wherever the main thread is
_DEPTH = [0]  # how many held_during blocks the main thread is in
_BUDGET: list[float] = []  # the time budget (seconds) whose end is stopping this process (:func:`stop_after`)


class Stop(KeyboardInterrupt):
    """The KeyboardInterrupt raised by the CLI's SIGINT / SIGTERM handler."""


def stop_on_signals():
    """Handle SIGTERM, the signal a scheduler stops a job with (SLURM at its time limit or on preemption, Kubernetes
    when it evicts a pod, systemd, ``kill``), like Ctrl-C: the first SIGINT or SIGTERM raises KeyboardInterrupt, so
    the running trial is marked FAIL with its checkpoints kept (the rerun resumes it) and the CLI exits 130 or 143.
    Later ones are ignored, so that a signal repeated to the whole process group (the main process passes it on to
    its workers too) cannot cut that clean-up short; SIGKILL still ends a process at once. During ``fit`` Lightning
    installs its own SIGTERM handler (``_SignalConnector``: it notes the signal and passes it to spawned ranks) and
    calls the one found here after it, so both run. A signal ignored by whoever started the CLI (``nohup``, a shell's
    background job) stays ignored. Returns a function that puts the previous handlers back."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    for state in (_STOPPING, _REDELIVERED, _HELD, _FORCED, _BUDGET):
        state.clear()
    previous = {}
    for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        if signal.getsignal(signum) is default:
            previous[signum] = signal.signal(signum, _on_stop_signal)
    unraisable = sys.unraisablehook
    sys.unraisablehook = functools.partial(_raise_swallowed_stop, unraisable)

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = unraisable

    return restore


def stop_after(seconds: float | None):
    """A wall-time budget (``--time-budget``): once ``seconds`` have passed, this process sends itself SIGTERM, the
    signal a scheduler's time limit sends, so the study stops as :func:`stop_on_signals` describes and rerunning the
    same command continues it. Set the budget below a job's time limit (SLURM's ``--time``, a preemptible node's
    notice) to leave the clean-up its seconds. Returns a function that cancels the budget (None: no budget)."""
    if seconds is None:
        return lambda: None

    def expire() -> None:
        _BUDGET.append(seconds)
        os.kill(os.getpid(), signal.SIGTERM)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    return timer.cancel


def _on_stop_signal(signum, frame) -> None:
    if _REDELIVERED:
        _REDELIVERED.clear()
    elif _STOPPING:
        return  # already stopping: let the first signal's clean-up finish
    else:
        _STOPPING.append(signum)
    if _DEPTH[0] and not _FORCED:  # inside a storage call: raised as the call returns (held_during)
        if not _HELD:
            _HELD.append(True)
            timer = threading.Timer(DEFER_LIMIT_S, _force)
            timer.daemon = True
            timer.start()
        return
    raise Stop(signal.Signals(_STOPPING[0]).name)


def _redeliver() -> None:
    """Run the stop handler again in the main thread, at its next instruction."""
    _REDELIVERED.append(True)
    _thread.interrupt_main(_STOPPING[0])


def _force() -> None:
    """A storage call that held a stop signal for :data:`DEFER_LIMIT_S`: raise it wherever the main thread is."""
    if _HELD:
        _HELD.clear()  # raised by the handler now, not again as the call ends
        _FORCED.append(True)
        _REDELIVERED.append(True)
        # A real signal to the main thread (interrupt_main would wait for the call to return): a sleep or a socket
        # read in Python's own code is interrupted by it; a C library's wait (SQLite's busy wait) runs to its end.
        signal.pthread_kill(threading.main_thread().ident, _STOPPING[0])


@contextlib.contextmanager
def held_during():
    """Hold a stop signal that arrives in the block (in the main thread) and raise it as the block ends. The study's
    storage runs every call in one (:func:`ablations.studies.storage.open_storage`), so that the KeyboardInterrupt never
    lands inside a transaction. Without the CLI's handler (:func:`stop_on_signals`) this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _DEPTH[0] += 1
    try:
        yield
    finally:
        _DEPTH[0] -= 1
        if not _DEPTH[0] and _HELD:
            _HELD.clear()
            raise Stop(signal.Signals(_STOPPING[0]).name)


def _raise_swallowed_stop(previous, unraisable) -> None:
    """``sys.unraisablehook``: a signal that arrives while Python runs a finalizer (a ``__del__`` during garbage
    collection, a weakref callback) raises its KeyboardInterrupt there, where Python can only print it ("Exception
    ignored in ...") and carries on; the process would train on and ignore the signals that follow. Deliver the
    signal again instead, so that it stops the process at the next instruction outside the finalizer."""
    if isinstance(unraisable.exc_value, Stop) and _STOPPING:
        # From another thread a moment later: raised from here (or at once), it would land in this hook again.
        timer = threading.Timer(0.05, _redeliver)
        timer.daemon = True
        timer.start()
        return
    previous(unraisable)


def stop_signal() -> int | None:
    """The signal that is stopping this process (``signal.SIGINT`` / ``signal.SIGTERM``), None while none came."""
    return _STOPPING[0] if _STOPPING else None


def check_stopping() -> None:
    """Raise KeyboardInterrupt if a stop signal came and was swallowed by code that catches everything: the study
    stops before its next trial."""
    if _STOPPING:
        raise KeyboardInterrupt(signal.Signals(_STOPPING[0]).name)


def interrupted() -> int:
    """Say that the CLI was stopped (one line) and return its exit status: 143 for SIGTERM (or the end of its time
    budget), 130 for Ctrl-C."""
    if _STOPPING and _STOPPING[0] == signal.SIGTERM and _BUDGET:
        print(f"time budget of {_BUDGET[0]:g} s reached: completed trials are kept; rerun the same command to "
              "continue", file=sys.stderr)
        return EXIT_SIGTERM
    if _STOPPING and _STOPPING[0] == signal.SIGTERM:
        print("interrupted (SIGTERM): completed trials are kept; rerun the same command to continue", file=sys.stderr)
        return EXIT_SIGTERM
    print("interrupted: completed trials are kept; rerun the same command to continue", file=sys.stderr)
    return EXIT_SIGINT
