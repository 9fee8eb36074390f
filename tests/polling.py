"""Waiting on servers by readiness, never on a timer.

A server is up when it answers: requests that fail with a connection error or a socket timeout are retried, and a
poll for data keeps asking until the answer is what the test waits for. Nothing here asserts how long anything took:
the only limit, :data:`HANG_LIMIT_S`, stops a hung server (so a broken run still ends) and is far above what a slow,
loaded machine needs. A server that exits before it is ready fails the test at once, with its output.

``start_server`` writes the server's output to a file (a pipe nobody reads can fill up and block the server);
``serving`` starts one and always shuts it down: terminate, wait up to :data:`SHUTDOWN_S`, then kill.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

#: Stops a hung server only; never a measure of speed (a loaded 2-core machine answers in a fraction of it).
HANG_LIMIT_S = 600
#: How long one request may take before it is retried (a timed-out request is retried, not failed).
REQUEST_TIMEOUT_S = 120
#: terminate -> wait this long -> kill: a shutdown wait, never asserted.
SHUTDOWN_S = 120
POLL_INTERVAL_S = 0.5

#: Failures of the transport (nothing answered, or the answer was cut off): always retried.
TRANSIENT = (ConnectionError, TimeoutError, socket.timeout, http.client.RemoteDisconnected,
             http.client.IncompleteRead)


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, urllib.error.HTTPError):  # an answer: the server is up
        return False
    if isinstance(exc, urllib.error.URLError):  # e.g. connection refused while the server starts
        return isinstance(exc.reason, (OSError, *TRANSIENT))
    return isinstance(exc, TRANSIENT)


def start_server(cmd: Sequence[str | Path], log: Path, **popen) -> subprocess.Popen:
    """``cmd`` with stdout and stderr in the file ``log`` (read back by :func:`server_output`)."""
    with open(log, "w") as out:
        proc = subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, **popen)
    proc.log_path = Path(log)
    return proc


def server_output(proc: subprocess.Popen, tail: int = 3000) -> str:
    path = getattr(proc, "log_path", None)
    if path is None or not Path(path).is_file():
        return "(output not captured)"
    return Path(path).read_text(errors="replace")[-tail:]


def stop(proc: subprocess.Popen, grace_s: float = SHUTDOWN_S) -> None:
    """terminate, wait up to ``grace_s`` (a loaded machine may be slow to shut a server down), then kill."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def serving(cmd: Sequence[str | Path], log: Path, **popen) -> Iterator[subprocess.Popen]:
    """A server for the ``with`` block; stopped (terminate, then kill) however the block ends."""
    proc = start_server(cmd, log, **popen)
    try:
        yield proc
    finally:
        stop(proc)


def fetch_json(url: str, body: dict | None = None, timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
    """One request: GET, or POST of ``body`` as JSON; the decoded JSON answer. No retries."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def poll(fetch: Callable[[], Any], ready: Callable[[Any], Any], proc: subprocess.Popen | None, what: str,
         retry_on: Callable[[BaseException], bool] = _transient, limit_s: float = HANG_LIMIT_S) -> Any:
    """``fetch()`` until ``ready(answer)``; the answer. Exceptions for which ``retry_on`` is true are retried;
    fails at once with the server's output if ``proc`` exits, and after ``limit_s`` (a hung server) with the
    last answer or error."""
    give_up = time.monotonic() + limit_s  # a hang limit: reaching it means hung, not slow
    last: str = "nothing yet"
    while True:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the server exited with {proc.returncode} before it was ready (last: {last}):\n"
                        f"{server_output(proc)}")
        try:
            answer = fetch()
        except Exception as exc:  # noqa: BLE001 - judged by retry_on
            if not retry_on(exc):
                raise
            last = f"{type(exc).__name__}: {exc}"
        else:
            if ready(answer):
                return answer
            last = f"answer {str(answer)[:1000]}"
        if time.monotonic() > give_up:
            output = server_output(proc) if proc is not None else ""
            pytest.fail(f"{what}: still not ready after {limit_s} s, the limit for a hung server (last: {last})\n"
                        f"{output}")
        time.sleep(POLL_INTERVAL_S)


def wait_until_answers(url: str, proc: subprocess.Popen | None, body: dict | None = None,
                       ready: Callable[[Any], Any] = lambda answer: True, what: str | None = None,
                       limit_s: float = HANG_LIMIT_S) -> Any:
    """Ask ``url`` (GET, or POST ``body``) until the server answers with JSON for which ``ready`` is true; that
    answer. While a server starts up or loads its data, refused connections, timeouts, HTTP errors and half-loaded
    answers are all retried."""

    def retry_on(exc: BaseException) -> bool:
        return _transient(exc) or isinstance(exc, (urllib.error.HTTPError, json.JSONDecodeError))

    return poll(lambda: fetch_json(url, body), ready, proc, what or url, retry_on=retry_on, limit_s=limit_s)


def get_json(url: str, body: dict | None = None, proc: subprocess.Popen | None = None,
             limit_s: float = HANG_LIMIT_S) -> Any:
    """One request to a server that is up, retried while it fails in transport (connection refused/reset, a socket
    timeout, a cut-off answer); an HTTP error or invalid JSON is raised, not retried."""
    return poll(lambda: fetch_json(url, body), lambda answer: True, proc, url, limit_s=limit_s)


def study_experiment_loaded(experiment: Any) -> bool:
    """Readiness of TensorBoard's ``/data/plugin/hparams/experiment``: the answer is the study's own HParams
    configuration (written with display names), not the minimal one TensorBoard infers from the runs it has loaded
    while the study's ``.`` run is not loaded yet."""
    if not isinstance(experiment, dict) or not experiment.get("hparamInfos"):
        return False
    return any(m.get("displayName") for m in experiment.get("metricInfos", []))
