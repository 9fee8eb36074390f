"""Optuna storage: SQLite under results/ by default, any RDB URL (PostgreSQL for many machines), always with
heartbeats so a trial whose worker died is detected and retried with the same parameters."""

from __future__ import annotations

from pathlib import Path

from .layout import DEFAULT_STORAGE  # noqa: F401 (re-exported: sqlite:///results/optuna.db)

HEARTBEAT_S = 20
GRACE_S = 60
MAX_RETRY = 3


def open_storage(url: str = DEFAULT_STORAGE, *, heartbeat_s: int = HEARTBEAT_S, grace_s: int = GRACE_S):
    """An ``RDBStorage`` with heartbeat + retry of stale trials; ValueError (one line) when the URL is malformed,
    its driver is missing or the server cannot be reached. Never creates anything but the SQLite file itself."""
    import optuna
    import sqlalchemy.exc

    try:
        from optuna.storages import RetryHeartbeatStaleTrialCallback as Retry
        callback_arg = "heartbeat_stale_trial_callback"
    except ImportError:  # optuna < 4.9
        from optuna.storages import RetryFailedTrialCallback as Retry
        callback_arg = "failed_trial_callback"

    if "://" not in url:
        raise ValueError(f"storage '{url}' is not a URL; e.g. {DEFAULT_STORAGE} or postgresql://user@host:5432/db")
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):])
        if url == DEFAULT_STORAGE:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif str(path) != ":memory:" and not path.parent.is_dir():
            raise ValueError(f"storage '{url}': folder '{path.parent}' does not exist")
    target = _with_installed_driver(url)
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    if target.startswith("postgresql"):
        engine_kwargs["connect_args"] = {"connect_timeout": 10}
    try:
        sqlalchemy.engine.make_url(target)
    except (sqlalchemy.exc.ArgumentError, ValueError) as exc:  # ValueError: e.g. a port that is not a number
        raise ValueError(f"storage URL '{_redact(url)}' is not valid: {_first_line(exc)}") from None
    try:
        return optuna.storages.RDBStorage(
            target, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_s, grace_period=grace_s,
            **{callback_arg: Retry(max_retry=MAX_RETRY, inherit_intermediate_values=True)})
    except sqlalchemy.exc.NoSuchModuleError as exc:
        raise ValueError(f"storage URL '{_redact(url)}' has an unknown database kind: {_first_line(exc)}") from None
    except sqlalchemy.exc.OperationalError as exc:
        raise ValueError(f"cannot reach storage '{_redact(url)}': {_first_line(exc.orig or exc)}") from None
    except ImportError as exc:
        raise ValueError(f"storage '{_redact(url)}' needs a database driver that is not installed: {exc}") from None


def _with_installed_driver(url: str) -> str:
    """``postgresql://`` with the PostgreSQL driver that is installed. SQLAlchemy 2.1 maps the bare scheme to
    psycopg (3), 2.0 to psycopg2; this project depends on psycopg2-binary, so without psycopg 3 the bare URL would
    fail with "driver not installed". An explicit ``postgresql+driver://`` is left alone; ``postgres://`` (libpq's
    and many hosting services' spelling, unknown to SQLAlchemy) is read as ``postgresql://``."""
    import importlib.util

    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None \
            and importlib.util.find_spec("psycopg2") is not None:
        return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def retried_trial_number(frozen) -> int | None:
    """The number of the original trial a retried trial repeats (None for a first attempt)."""
    return frozen.system_attrs.get("failed_trial")


def lost_storage_error(exc: BaseException) -> BaseException | None:
    """The database error behind ``exc`` when the storage itself failed (server gone, connection dropped, SQLite
    locked): a SQLAlchemy ``OperationalError`` or ``InterfaceError`` anywhere in its cause/context chain, which
    optuna wraps or re-raises while failing the trial. None for anything else (those keep their traceback)."""
    import sqlalchemy.exc

    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def lost_storage_message(url: str, error: BaseException) -> str:
    """One line for a worker that lost its storage mid-study."""
    return (f"lost storage '{_redact(url)}': {_first_line(getattr(error, 'orig', None) or error)}; completed "
            "trials are kept and a trial that was running is retried from its last checkpoint: rerun the same "
            "command once the database is reachable again")


def exit_when_heartbeat_fails(url: str) -> None:
    """Make a failed heartbeat stop this worker at once, with one line and exit status 1, instead of a thread
    traceback: training on without heartbeats, the trial would soon look dead and another worker would retry it
    beside this one, in the same run folder. The trial stays RUNNING; once the storage is back, the next run fails
    it (stale heartbeat) and retries it from its last checkpoint, as after ``kill -9``."""
    import multiprocessing
    import os
    import sys
    import threading

    default = threading.excepthook

    def hook(args) -> None:
        error = lost_storage_error(args.exc_value) if args.exc_value is not None else None
        if error is None:
            default(args)
            return
        sys.stderr.write(f"error: {lost_storage_message(url, error)}\n")
        sys.stderr.flush()
        for child in multiprocessing.active_children():  # ddp_spawn ranks of the running trial
            child.kill()
        os._exit(1)

    threading.excepthook = hook


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _redact(url: str) -> str:
    """Hide a password in a URL before printing it."""
    import re

    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)
