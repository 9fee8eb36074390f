"""Optuna storage: SQLite under results/ by default, any RDB URL (PostgreSQL for many machines), always with
heartbeats so a trial whose worker died is detected and retried with the same parameters."""

from __future__ import annotations

import copy
import functools
import importlib.util
import inspect
import multiprocessing
import os
import random
import re
import sqlite3
import sys
import threading
import time
from pathlib import Path

from ..layout import DEFAULT_STORAGE  # noqa: F401 (re-exported: sqlite:///outputs/optuna.db)
from .stopping import held_during

# Imported where they are used, not here: SQLAlchemy and Optuna. Each takes from a tenth of a second to seconds to
# import, and the command-line tools start without them.

HEARTBEAT_S = 20
GRACE_S = 60
#: How long a SQLite connection waits for another connection's write lock before "database is locked". A heartbeat
#: waits behind other processes' writes for as long: a worker whose heartbeat fails so exits (lost storage), so a
#: live worker's heartbeats are at most this plus one interval apart on SQLite.
SQLITE_LOCK_TIMEOUT_S = 60
MAX_RETRY = 3
#: Opens of a new storage that other processes are creating at the same moment (a growing random pause between
#: them), before its error is the answer
CREATE_ATTEMPTS = 8


def check_url(url: str) -> str:
    """The checks of a storage URL that connect to nothing (a dry run makes them too): ValueError (one line) for a
    string that is not a URL, a SQLite file in a folder that does not exist or that is not a SQLite database, a
    malformed URL, or a database kind or driver that SQLAlchemy cannot load. Returns the URL to connect to (with the
    installed PostgreSQL driver: ``with_installed_driver``)."""
    import sqlalchemy.exc

    if "://" not in url:
        raise ValueError(f"storage '{url}' is not a URL; e.g. {DEFAULT_STORAGE} or postgresql://user@host:5432/db")
    path = sqlite_path(url)
    if path is not None and url != DEFAULT_STORAGE and not path.parent.is_dir():
        raise ValueError(f"storage '{url}': folder '{path.parent}' does not exist")
    check_sqlite_file(url)
    target = with_installed_driver(url)
    try:
        sqlalchemy.engine.make_url(target).get_dialect().import_dbapi()
    except sqlalchemy.exc.NoSuchModuleError as exc:  # before ArgumentError, its base class
        raise ValueError(f"storage URL '{redact(url)}' has an unknown database kind: {_first_line(exc)}") from None
    except (sqlalchemy.exc.ArgumentError, ValueError) as exc:  # ValueError: e.g. a port that is not a number
        raise ValueError(f"storage URL '{redact(url)}' is not valid: {_first_line(exc)}") from None
    except ImportError as exc:
        raise ValueError(f"storage '{redact(url)}' needs a database driver that is not installed: {exc}") from None
    return target


def open_storage(url: str = DEFAULT_STORAGE, *, heartbeat_s: int = HEARTBEAT_S, grace_s: int = GRACE_S):
    """An ``RDBStorage`` with heartbeat + retry of stale trials; ValueError (one line) when the URL is malformed
    (:func:`check_url`), its driver is missing or the server cannot be reached. Never creates anything but the
    SQLite file itself (and, for the default storage, its folder)."""
    import sqlalchemy.exc

    Retry = _retry_class()

    target = check_url(url)
    if url == DEFAULT_STORAGE:
        sqlite_path(url).parent.mkdir(parents=True, exist_ok=True)
    engine_kwargs = ({"connect_args": {"timeout": SQLITE_LOCK_TIMEOUT_S}} if url.startswith("sqlite")
                     else {"pool_pre_ping": True})
    if target.startswith("postgresql"):
        engine_kwargs["connect_args"] = {"connect_timeout": 10}

    # An in-memory SQLite database is one per connection: the heartbeat's thread would open an empty one (and fail
    # there), and no other process can see its trials go stale, so it keeps no heartbeat.
    in_memory = target.startswith("sqlite") and sqlite_path(url) is None
    if in_memory:
        heartbeat_s = grace_s = None

    def rdb_storage():
        return _storage_class()(
            target, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_s, grace_period=grace_s,
            **{Retry.storage_arg: Retry(max_retry=MAX_RETRY, inherit_intermediate_values=True)})

    try:
        for attempt in range(CREATE_ATTEMPTS):
            try:
                storage = rdb_storage()
                break
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as exc:
                # Another process is creating the same new storage at the same moment (both inserted its schema
                # version, or both saw a table missing and created it: "table ... already exists"): open it again,
                # which creates only what is still missing and then reads.
                racing = isinstance(exc, sqlalchemy.exc.IntegrityError) or "already exists" in str(exc.orig or exc)
                if not racing or attempt == CREATE_ATTEMPTS - 1:
                    raise
                time.sleep(random.uniform(0.05, 0.25) * (attempt + 1))  # let the others finish creating it
        if sqlite_path(url) is not None:  # a file that several processes can share (not ":memory:")
            serialize_sqlite_transactions(storage.engine)
        return storage
    except sqlalchemy.exc.OperationalError as exc:
        raise ValueError(f"cannot reach storage '{redact(url)}': {_first_line(exc.orig or exc)}") from None
    except sqlalchemy.exc.DatabaseError as exc:
        if unusable_storage_error(exc) is None:
            raise
        raise ValueError(unusable_storage_message(url, exc)) from None


#: User attrs a retry does not inherit from the attempt it retries: they describe that attempt's process.
NOT_INHERITED = ("worker",)


@functools.cache
def _retry_class() -> type:
    """optuna's retry callback, whose WAITING copy of a failed or stale trial leaves out :data:`NOT_INHERITED`.
    With the dead attempt's ``worker`` (``<host>:<pid>``), a retry claimed by another process would name the dead
    worker until it set its own, and the main process of ``--workers N`` fails the RUNNING trials of its own
    stopped workers by that attr (``workers._fail_left_running``). Found here as ``FreshRetry`` when a storage is
    unpickled (a DDP rank: the storage carries its callback)."""
    try:
        from optuna.storages import RetryHeartbeatStaleTrialCallback as base
        storage_arg = "heartbeat_stale_trial_callback"
    except ImportError:  # optuna < 4.9
        from optuna.storages import RetryFailedTrialCallback as base
        storage_arg = "failed_trial_callback"  # the RDBStorage argument that takes it (renamed in optuna 4.9)

    def __call__(self, study, trial) -> None:
        trial = copy.copy(trial)
        trial.user_attrs = {k: v for k, v in trial.user_attrs.items() if k not in NOT_INHERITED}
        base.__call__(self, study, trial)

    return type("FreshRetry", (base,), {"__module__": __name__, "__qualname__": "FreshRetry", "__call__": __call__,
                                        "storage_arg": storage_arg,
                                        "__doc__": _retry_class.__doc__})


@functools.cache
def _storage_class():
    """``RDBStorage`` whose every call holds a Ctrl-C / SIGTERM until it returns (:func:`ablations.studies.stopping.held_during`):
    a KeyboardInterrupt raised in the middle of a transaction could leave it open, and the lock with it."""
    import optuna

    base = optuna.storages.RDBStorage
    calls = {name: _holding_stop_signals(member) for name, member in vars(base).items()
             if inspect.isfunction(member) and not name.startswith("__")}

    def __setstate__(self, state) -> None:  # unpickled in a DDP rank: the same BEGIN IMMEDIATE as open_storage's
        base.__setstate__(self, state)
        if sqlite_path(self.url) is not None:
            serialize_sqlite_transactions(self.engine)

    def set_trial_user_attrs(self, trial_id: int, attrs: dict) -> None:
        """``set_trial_user_attr`` for every item of ``attrs`` in one transaction (optuna commits each attr in its
        own: a trial's summary of ~50 attrs is ~50 commits, each a SQLite file lock and sync or a PostgreSQL round
        trip). Present where optuna has the private step it repeats (:func:`_has_one_transaction_steps`)."""
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session

        with _create_scoped_session(self.scoped_session, True) as db:
            for key, value in attrs.items():
                self._set_trial_attr_without_commit(db, models.TrialUserAttributeModel, trial_id, key, value)

    members = {"__module__": __name__, **calls, "__setstate__": __setstate__}
    if _has_one_transaction_steps(base):
        members["set_trial_user_attrs"] = _holding_stop_signals(set_trial_user_attrs)
    return type("StudyStorage", (base,), members)


def _has_one_transaction_steps(base) -> bool:
    """Whether optuna has the private steps ``set_trial_user_attrs`` repeats in one transaction (optuna 3.0 to 5.x)."""
    try:
        from optuna.storages._rdb.storage import _create_scoped_session  # noqa: F401
    except ImportError:
        return False
    return callable(getattr(base, "_set_trial_attr_without_commit", None))


def set_user_attrs(trial, attrs: dict) -> None:
    """``trial.set_user_attr(key, value)`` for every item of ``attrs``, in one storage transaction where the storage
    is a :func:`open_storage` one (else attr by attr). ``trial``: an ``optuna.Trial`` being run."""
    storage = getattr(trial, "storage", None)
    storage = getattr(storage, "_backend", storage)  # optuna wraps an RDBStorage in _CachedStorage, which hands a
    write = getattr(storage, "set_trial_user_attrs", None)  # running trial's attrs straight through to it
    if write is None or not hasattr(trial, "_cached_frozen_trial"):
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return
    write(trial._trial_id, attrs)
    trial._cached_frozen_trial.user_attrs.update(attrs)  # what Trial.set_user_attr keeps after its write


def __getattr__(name: str):
    if name == "StudyStorage":  # made on first use (optuna imports slowly); found here when a storage is unpickled
        return _storage_class()
    if name == "FreshRetry":  # the retry callback a storage carries, the same way
        return _retry_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _holding_stop_signals(method):
    @functools.wraps(method)
    def call(*args, **kwargs):
        with held_during():
            return method(*args, **kwargs)

    return call


def serialize_sqlite_transactions(engine) -> None:
    """Make every transaction on a SQLite ``engine`` take the write lock when it begins (``BEGIN IMMEDIATE``).

    Python's sqlite3 driver starts a transaction only at the first write, so Optuna's "read the trial, check it is
    WAITING, mark it RUNNING" ran its read outside any transaction: two processes could both read a WAITING trial
    and both mark it RUNNING. Both then trained the same grid point and the second to finish died on "Cannot tell
    a COMPLETE trial" (seen with three independent ``ablations.run`` processes on one SQLite file; ``SELECT ... FOR
    UPDATE``, which protects PostgreSQL, is a no-op in SQLite). With the lock taken at ``BEGIN``, the second
    process waits (``timeout``), then reads RUNNING and takes the next trial. SQLAlchemy's documented recipe for
    the pysqlite driver; the pooled connections made before it are dropped so that every connection has it."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _no_driver_begin(dbapi_connection, connection_record) -> None:
        dbapi_connection.isolation_level = None  # the driver emits no BEGIN of its own

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()


#: SQLite's result codes for a file that is not a database or whose pages are damaged (SQLITE_CORRUPT, SQLITE_NOTADB).
_SQLITE_DAMAGED = (11, 26)


def sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (relative, or absolute with four slashes); None for other URLs and for an
    in-memory database."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def check_sqlite_file(url: str) -> None:
    """ValueError (one line) when the SQLite file of ``url`` exists but is not a usable database: garbage bytes, a
    truncated file, damaged pages. The file is opened read-only for SQLite's ``quick_check`` and never written, so
    a damaged storage is left exactly as it is for the user to restore; optuna opening it read-write could add tables
    to it or write into its damaged pages. A missing or empty file is not checked (SQLite makes a new database of
    it), nor one that SQLite cannot read for another reason (locked, a crashed writer's journal to roll back):
    those are for the storage itself to handle."""
    path = sqlite_path(url)
    if path is None or not path.is_file() or path.stat().st_size == 0:
        return
    problem = _sqlite_damage(path)
    if problem is not None:
        raise ValueError(f"storage file '{path}' is not a usable SQLite database ({problem}); it was left as it is: "
                         "restore it from a backup, or pass --storage with another file")


def _sqlite_damage(path: Path) -> str | None:
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=SQLITE_LOCK_TIMEOUT_S)
        try:
            rows = con.execute("PRAGMA quick_check(1)").fetchall()
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        return _first_line(exc) if _sqlite_code(exc) in _SQLITE_DAMAGED else None
    return None if rows == [("ok",)] else " ".join(str(rows[0][0]).split())


def _sqlite_code(exc: BaseException) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF  # the primary result code of an extended one


def unusable_storage_error(exc: BaseException) -> BaseException | None:
    """The SQLite error behind ``exc`` when the storage file itself is damaged (not a database, malformed pages),
    anywhere in its cause/context chain; None for anything else."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if _sqlite_code(getattr(exc, "orig", None) or exc) in _SQLITE_DAMAGED:
            return getattr(exc, "orig", None) or exc
        exc = exc.__cause__ or exc.__context__
    return None


def unusable_storage_message(url: str, error: BaseException) -> str:
    """One line for a storage file found damaged while it was being used."""
    return (f"storage '{redact(url)}' is not a usable SQLite database ({_first_line(getattr(error, 'orig', None) or error)}); "
            "it was left as it is: restore it from a backup, or pass --storage with another file")


def with_installed_driver(url: str) -> str:
    """``postgresql://`` with the PostgreSQL driver that is installed. SQLAlchemy 2.1 maps the bare scheme to
    psycopg (3), 2.0 to psycopg2; this project depends on psycopg2-binary, so without psycopg 3 the bare URL would
    fail with "driver not installed". An explicit ``postgresql+driver://`` is left alone; ``postgres://`` (libpq's
    and many hosting services' spelling, unknown to SQLAlchemy) is read as ``postgresql://``."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://") and importlib.util.find_spec("psycopg") is None \
            and importlib.util.find_spec("psycopg2") is not None:
        return "postgresql+psycopg2://" + url[len("postgresql://"):]
    return url


def retried_trial_number(frozen) -> int | None:
    """The number of the original trial a retried trial repeats (None for a first attempt)."""
    return frozen.system_attrs.get("failed_trial")


def point_key(params: dict) -> str:
    """A grid point's key: its parameters in name order (the same point enqueued, imported or retried)."""
    return repr(sorted(params.items()))


def repeated_results(trials) -> set[int]:
    """Numbers of the COMPLETE trials whose grid point (the ``fixed_params`` it was enqueued or imported with) an
    earlier-numbered COMPLETE trial already has. A worker prunes a point another has run before training it, but
    two workers that import the same ``runs.csv`` at the same moment each add its rows (each sees none there yet):
    a point's result is its first completed trial, and the readers (the report, the tuning stage's choice) skip
    the repeats. Trials of a search (no ``fixed_params``) never repeat one another."""
    seen, repeated = set(), set()
    for t in sorted(trials, key=lambda t: t.number):
        point = t.system_attrs.get("fixed_params")
        if t.state.name != "COMPLETE" or point is None:
            continue
        key = point_key(point)
        if key in seen:
            repeated.add(t.number)
        seen.add(key)
    return repeated


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
    return (f"lost storage '{redact(url)}': {_first_line(getattr(error, 'orig', None) or error)}; completed "
            "trials are kept and a trial that was running is retried from its last checkpoint: rerun the same "
            "command once the database is reachable again")


def exit_when_heartbeat_fails(url: str) -> None:
    """Make a failed heartbeat stop this worker at once, with one line and exit status 1, instead of a thread
    traceback: training on without heartbeats, the trial would soon look dead and another worker would retry it
    beside this one, in the same run folder. The trial stays RUNNING; once the storage is back, the next run fails
    it (stale heartbeat) and retries it from its last checkpoint, as after ``kill -9``."""
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


def redact(url: str) -> str:
    """Hide a password in a URL before printing it."""
    return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)
