"""Database engines and transactions for the metadata store, on SQLite and PostgreSQL.

SQLite is tuned for many processes sharing one file: WAL (readers never block the writer), a
long busy timeout, foreign keys on, and write transactions opened with ``BEGIN IMMEDIATE`` so
writers queue for the lock up front instead of deadlocking when a reader upgrades to a writer.
PostgreSQL goes through psycopg 3; its writers serialize with explicit row locks and the
advisory locks below (:func:`advisory_lock`; see :mod:`registry.store.sql`).

    >>> engine = make_engine("sqlite:////tmp/pt2reg-doc.db")
    >>> engine.dialect.name
    'sqlite'
"""
from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    String,
    any_,
    bindparam,
    create_engine,
    event,
    func,
    select,
    text,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from ..errors import ConflictError, StoreError, UsageError

__all__ = ["make_engine", "kept_engine", "KEEP_ENGINES", "run_transaction", "translate_error", "redacted_url", "advisory_lock", "in_batches",
           "IN_BATCH", "WRITE_OPTION", "SQLITE_BUSY_TIMEOUT_MS", "AUDIT_LOCK_KEY", "GC_LOCK_KEY", "MIGRATION_LOCK_KEY"]

T = TypeVar("T")

SQLITE_BUSY_TIMEOUT_MS = 30_000
WRITE_OPTION = "pt2reg_write"
_ATTEMPTS = 8
# sqlstates worth retrying: serialization failure, deadlock, lock not available.
_PG_RETRY_STATES = {"40001", "40P01", "55P03"}
_PG_UNIQUE_VIOLATION = "23505"

#: PostgreSQL advisory lock keys (four ASCII bytes each), taken with :func:`advisory_lock`.
#: "pt2a": serializes audit appends (one hash chain).
AUDIT_LOCK_KEY = 0x70743261
#: "pt2g": a gc sweep holds it exclusively; push claims and publishes share it.
GC_LOCK_KEY = 0x70743267
#: "pt2m": serializes schema checks and upgrades.
MIGRATION_LOCK_KEY = 0x7074326D


#: values per query for ``in_batches`` (10,000 bound parameters cost SQLAlchemy 20 ms, SQLite 8)
IN_BATCH = 2000


def in_batches(s: Session, column: Any, values: Sequence[str]) -> Iterator[ColumnElement[bool]]:
    """``column IN values`` as one condition per ``IN_BATCH`` values, each batch bound as one
    value where the database can unpack it (SQLite ``json_each``, PostgreSQL ``= ANY(array)``):
    a push asks about every chunk of a program, ten thousand digests at once."""
    dialect = s.get_bind().dialect.name
    for start in range(0, len(values), IN_BATCH):
        batch = list(values[start:start + IN_BATCH])
        if dialect == "sqlite":
            listed = func.json_each(json.dumps(batch)).table_valued("value")
            yield column.in_(select(listed.c.value))
        elif dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import ARRAY  # ~40 ms: only when PostgreSQL is used

            yield column == any_(bindparam(None, batch, type_=ARRAY(String)))
        else:
            yield column.in_(batch)


def advisory_lock(conn: Session | Connection, key: int, *, shared: bool = False) -> None:
    """Take a transaction-scoped PostgreSQL advisory lock (``pg_advisory_xact_lock``, or its
    ``_shared`` form), released at commit or rollback. A no-op on SQLite, whose write
    transactions are serialized already (``BEGIN IMMEDIATE``)."""
    dialect = conn.dialect if isinstance(conn, Connection) else conn.get_bind().dialect
    if dialect.name == "postgresql":
        fn = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        conn.execute(text(f"SELECT {fn}(:key)"), {"key": key})


def make_engine(url: str) -> Engine:
    """An engine for ``sqlite:///PATH``, ``sqlite://`` (memory) or ``postgresql://...``.

    ``postgresql://`` and ``postgres://`` are rewritten to the psycopg 3 driver. The parent
    directory of a SQLite file is created if missing.

        >>> make_engine("postgresql://u@db.example/reg").url.drivername
        'postgresql+psycopg'
    """
    return _engine(_database_url(url))


def _database_url(url: str) -> URL:
    """``url`` checked and normalized (``make_engine``): the psycopg 3 driver for PostgreSQL, a
    SQLite file's path expanded and its directory created."""
    if not isinstance(url, str) or not url:
        raise UsageError("empty database URL", hint="e.g. sqlite:///PATH or postgresql://HOST/DB")
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    try:
        parsed = make_url(url)
    except sa_exc.ArgumentError as exc:
        raise UsageError(f"invalid database URL {url!r}") from exc
    if parsed.drivername in ("sqlite", "sqlite+pysqlite"):
        if _in_memory(parsed):
            return parsed
        path = Path(parsed.database).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        return parsed.set(database=str(path))
    if parsed.drivername == "postgresql+psycopg":
        return parsed
    raise UsageError(f"unsupported database URL scheme {parsed.drivername!r}",
                     hint="use sqlite:///PATH or postgresql://USER@HOST/DB")


def _in_memory(url: URL) -> bool:
    return url.drivername in ("sqlite", "sqlite+pysqlite") and url.database in (None, "", ":memory:")


def _engine(url: URL) -> Engine:
    """The engine for a ``_database_url``."""
    return _sqlite_engine(url) if url.drivername in ("sqlite", "sqlite+pysqlite") else \
        create_engine(url, pool_pre_ping=True)


#: engines ``kept_engine`` keeps for the next store opened on the same database, at most
KEEP_ENGINES = 4


@dataclass
class _Kept:
    engine: Engine
    identity: tuple[int, int] | None   # the SQLite file (st_dev, st_ino) it was opened on
    users: int = 0


_KEPT: OrderedDict[str, _Kept] = OrderedDict()
_KEPT_LOCK = threading.Lock()


def _file_identity(url: URL) -> tuple[int, int] | None:
    """The SQLite file at ``url`` (device, inode), None when there is none (yet) or it is no
    SQLite URL."""
    if not url.drivername.startswith("sqlite"):
        return None
    try:
        st = os.stat(url.database or "")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def kept_engine(url: str, prepare: Callable[[Engine], None]) -> tuple[Engine, Callable[[], None]]:
    """An engine for ``url`` (``make_engine``) shared by the stores this process opens on that
    database, once ``prepare(engine)`` (the schema check) accepted the database, and the
    function that hands it back; an engine ``prepare`` raised for is not kept.

    A process that opens a store per operation (``registry.load`` of one model after
    another, a pull per request) then compiles each of its SQL statements once instead of
    every time (2-3 ms each the first time, measured). What is kept is the engine and its
    compiled statements, not its connections: when the last store using it closes, its pool
    is disposed as before (a SQLite file's write-ahead log is checkpointed into it and its
    handles closed, so the file can be copied, replaced or removed; a PostgreSQL server gets
    its connections back). At most ``KEEP_ENGINES`` are kept, the least recently used one
    dropped once no store uses it. An in-memory SQLite database is never shared (each open
    is a new database); a SQLite file replaced or removed while a store was using its engine
    gets a new one; a forked child keeps none."""
    parsed = _database_url(url)
    if _in_memory(parsed):
        engine = _engine(parsed)
        try:
            prepare(engine)
        except BaseException:
            engine.dispose()
            raise
        return engine, engine.dispose
    key = parsed.render_as_string(hide_password=False)
    identity = _file_identity(parsed)
    with _KEPT_LOCK:
        kept = _KEPT.get(key)
        if kept is None or kept.identity != identity:
            # (an engine dropped from the table is disposed by its last store's release, or was
            # when its last store closed)
            kept = _KEPT[key] = _Kept(_engine(parsed), identity)
            while len(_KEPT) > KEEP_ENGINES:
                _KEPT.popitem(last=False)
        _KEPT.move_to_end(key)
        kept.users += 1

    def release(ok: bool = True) -> None:
        with _KEPT_LOCK:
            kept.users -= 1
            if not ok and _KEPT.get(key) is kept:
                del _KEPT[key]
            if kept.users == 0:
                kept.engine.dispose()   # its connections closed; its compiled statements stay

    try:
        prepare(kept.engine)
    except BaseException:
        release(False)
        raise
    with _KEPT_LOCK:
        if kept.identity is None:
            kept.identity = _file_identity(parsed)   # the SQLite file ``prepare`` created
    return kept.engine, release


def _forget_kept_engines() -> None:
    """In a forked child: the parent's connections are not this process's to use or close, and
    its lock may have been held by a thread that does not exist here."""
    global _KEPT_LOCK
    _KEPT_LOCK = threading.Lock()
    for kept in _KEPT.values():
        kept.engine.dispose(close=False)
    _KEPT.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_kept_engines)


def _sqlite_engine(url: URL) -> Engine:
    memory = _in_memory(url)
    if memory:
        engine = create_engine(url, poolclass=StaticPool,
                               connect_args={"check_same_thread": False})
    else:
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        # Take BEGIN away from the sqlite3 module so _on_begin decides DEFERRED vs IMMEDIATE.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if not memory:
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")  # durable with WAL up to a power loss
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        write = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def redacted_url(engine: Engine) -> str:
    """The engine's URL with any password hidden, for messages."""
    return engine.url.render_as_string(hide_password=True)


def _sqlite_error_name(exc: sa_exc.DBAPIError) -> str:
    return str(getattr(exc.orig, "sqlite_errorname", "") or "")


def _retryable(exc: sa_exc.DBAPIError) -> bool:
    state = getattr(exc.orig, "sqlstate", None)
    if state in _PG_RETRY_STATES or state == _PG_UNIQUE_VIOLATION:
        return True
    name = _sqlite_error_name(exc)
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or name in (
            "SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_PRIMARYKEY"):
        return True
    return "database is locked" in str(exc.orig)


def translate_error(exc: sa_exc.SQLAlchemyError, engine: Engine) -> StoreError | ConflictError:
    if isinstance(exc, sa_exc.IntegrityError):
        return ConflictError(f"the database refused a conflicting change: "
                             f"{str(getattr(exc, 'orig', exc)).splitlines()[0]}")
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return StoreError(f"database error on {redacted_url(engine)}: "
                      f"{detail[0] if detail else type(exc).__name__}")


def run_transaction(engine: Engine, work: Callable[[Session], T], *, write: bool) -> T:
    """Run ``work(session)`` in one transaction, committed when it returns.

    Write transactions that lose a race (unique violation, serialization failure, deadlock,
    SQLite busy) are retried from the start with bounded, jittered backoff, so ``work`` must
    derive everything from what it reads. SQLAlchemy errors leave as StoreError or
    ConflictError; registry errors raised by ``work`` pass through after a rollback.

        >>> engine = make_engine("sqlite://")
        >>> run_transaction(engine, lambda s: s.scalar(text("SELECT 1")), write=False)
        1
        >>> engine.dispose()
    """
    bind = engine.execution_options(**{WRITE_OPTION: True}) if write else engine
    for attempt in range(_ATTEMPTS):
        try:
            with Session(bind=bind, expire_on_commit=False) as session:
                with session.begin():
                    return work(session)
        except sa_exc.DBAPIError as exc:
            if not _retryable(exc) or exc.connection_invalidated or attempt == _ATTEMPTS - 1:
                raise translate_error(exc, engine) from exc
        except sa_exc.SQLAlchemyError as exc:
            raise translate_error(exc, engine) from exc
        time.sleep(min(1.0, 0.02 * 2 ** attempt) * (0.5 + random.random()))
    raise StoreError("unreachable: transaction retries exhausted")  # pragma: no cover
