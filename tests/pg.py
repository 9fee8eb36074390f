"""A throwaway PostgreSQL cluster for tests: the real server from the distribution's packages, on 127.0.0.1.

``initdb --auth=trust`` into a fresh temp folder, ``postgres`` on a free port with its unix socket in that folder,
stopped by the PID in ``postmaster.pid`` (SIGINT: fast shutdown) and waited for. initdb and postgres refuse to run
as root, so as root they run as the ``postgres`` user (``runuser``) on a folder chowned to it.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def server_bin() -> Path | None:
    """The folder holding initdb and postgres (Debian: /usr/lib/postgresql/<version>/bin), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: [int(n) for n in re.findall(r"\d+", p)])
    initdb = found[-1] if found else shutil.which("initdb")
    return Path(initdb).parent if initdb and (Path(initdb).parent / "postgres").is_file() else None


#: What to install for the PostgreSQL tests (Debian / Ubuntu; .ci/run does it).
INSTALL = "apt-get install postgresql (the server binaries initdb and postgres, and the 'postgres' user)"


def unavailable_reason() -> str | None:
    """Why a cluster cannot be started here (None: it can)."""
    if server_bin() is None:
        return "PostgreSQL server binaries (initdb, postgres) not found"
    if os.geteuid() == 0 and (shutil.which("runuser") is None or _uid("postgres") is None):
        return "running as root needs the 'postgres' user and runuser to start PostgreSQL (initdb refuses root)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _uid(user: str) -> int | None:
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


class PostgresCluster:
    """``initdb`` on construction; ``start()``, ``stop()`` (restartable on the same data folder), ``url(db)``,
    ``create_database(name)`` and ``remove()`` (stop + delete the folder)."""

    def __init__(self) -> None:
        self.bin = server_bin()
        self.root = Path(tempfile.mkdtemp(prefix="ablations-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.log = self.root / "server.log"
        self._proc: subprocess.Popen | None = None
        self._as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as_user:
            os.chown(self.root, _uid("postgres"), -1)
        init = subprocess.run([*self._as_user, str(self.bin / "initdb"), "-D", str(self.data), "--auth=trust", "-U",
                               "postgres", "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions"],
                              capture_output=True, text=True, timeout=120)
        if init.returncode != 0:
            shutil.rmtree(self.root, ignore_errors=True)
            raise RuntimeError(f"initdb failed ({init.returncode}):\n{init.stdout}{init.stderr}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, timeout: float = 600) -> None:  # a hang limit only: a loaded machine starts it slowly
        """Start the server and wait until it accepts connections."""
        import psycopg2

        with open(self.log, "a") as log:
            self._proc = subprocess.Popen(
                [*self._as_user, str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
                 "-h", "127.0.0.1", "-k", str(self.root), "-c", "fsync=off", "-c", "synchronous_commit=off",
                 "-c", "full_page_writes=off"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self._proc.returncode}:\n{self.log.read_text()[-2000:]}")
            try:
                psycopg2.connect(self.url(), connect_timeout=2).close()
                return
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    log = self.log.read_text()[-2000:]
                    raise RuntimeError(f"postgres did not accept connections:\n{log}") from None
                time.sleep(0.1)

    def stop(self, timeout: float = 600) -> None:
        """Fast shutdown (SIGINT to the postmaster, by the PID in ``postmaster.pid``) and wait until it is gone."""
        pid_file = self.data / "postmaster.pid"
        if pid_file.is_file():
            try:
                os.kill(int(pid_file.read_text().splitlines()[0]), signal.SIGINT)
            except (ProcessLookupError, ValueError, IndexError):
                pass
        if self._proc is not None:
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(timeout=120)
            self._proc = None

    def create_database(self, name: str) -> str:
        """A new empty database; its URL."""
        import psycopg2

        conn = psycopg2.connect(self.url())
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'CREATE DATABASE "{name}"')
        finally:
            conn.close()
        return self.url(name)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
