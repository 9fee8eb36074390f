"""tests/polling.py: readiness polling retries what a slow or starting server does, and fails on what is wrong."""

from __future__ import annotations

import json
import sys
import threading
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pg import free_port
from polling import fetch_json, get_json, poll, serving, wait_until_answers


@contextmanager
def _server(answers: list[tuple[int, object]], port: int = 0) -> Iterator[tuple[str, list[str]]]:
    """An in-process HTTP server that gives ``answers`` in turn (the last one from then on); its URL and the
    paths it was asked for."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            asked.append(self.path)
            status, body = answers[min(len(asked), len(answers)) - 1]
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/x", asked
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_wait_until_answers_retries_http_errors_and_answers_that_are_not_ready():
    with _server([(503, {}), (404, {}), (200, {"ready": False}), (200, {"ready": True})]) as (url, asked):
        assert wait_until_answers(url, None, ready=lambda a: a["ready"]) == {"ready": True}
    assert len(asked) == 4


def test_refused_connections_are_retried_until_the_server_is_up():
    port = free_port()  # nothing listens here yet
    url = f"http://127.0.0.1:{port}/x"
    stop = threading.Event()

    def late_server() -> None:
        with _server([(200, {"up": True})], port=port):
            stop.wait()

    thread = threading.Thread(target=late_server, daemon=True)
    refused: list[BaseException] = []

    def fetch():
        try:
            return fetch_json(url)
        except urllib.error.URLError as exc:
            refused.append(exc)
            if not thread.is_alive():
                thread.start()  # the server comes up only after a request was refused
            raise

    try:
        assert poll(fetch, lambda answer: True, None, "the late server") == {"up": True}
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
    assert refused and isinstance(refused[0].reason, ConnectionRefusedError)


def test_a_server_that_exits_before_it_answers_fails_with_its_output(tmp_path):
    with serving([sys.executable, "-c", "print('cannot bind: boom', flush=True); raise SystemExit(3)"],
                 tmp_path / "server.log") as proc:
        with pytest.raises(pytest.fail.Exception, match=r"(?s)exited with 3.*cannot bind: boom"):
            wait_until_answers(f"http://127.0.0.1:{free_port()}/x", proc, what="the server")


def test_get_json_raises_http_errors_instead_of_retrying():
    with _server([(500, {"error": "broken"}), (200, {})]) as (url, asked):
        with pytest.raises(urllib.error.HTTPError):
            get_json(url)
    assert asked == ["/x"]
