"""Schema migrations, run programmatically through Alembic.

The migration scripts ship inside the wheel as the package ``registry._migrations`` (the
repository's top-level ``migrations/``), so ``pt2reg db upgrade`` works after a plain
``pip install``. Policy:

- a fresh, empty database is created at head when ``auto_create`` (the embedded default);
- a database behind head is never migrated silently: :class:`DatabaseOutdatedError`;
- a database ahead of this software (unknown revision) is refused with a :class:`StoreError`.

Concurrent processes opening one fresh database are safe: the check and the upgrade run in one
transaction holding a lock (SQLite ``BEGIN IMMEDIATE``; PostgreSQL an advisory lock).
For example::

    engine = make_engine("sqlite:////tmp/reg/registry.db")
    ensure_schema(engine, auto_create=True)
    current_revision(engine) == head_revision()   # -> True
"""
from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy import exc as sa_exc

from ..constants import PACKAGE_PARENT
from ..errors import DatabaseOutdatedError, StoreError
from .engine import MIGRATION_LOCK_KEY, WRITE_OPTION, advisory_lock, redacted_url, translate_error

if TYPE_CHECKING:  # alembic costs ~130 ms to import: only migrations and slow checks load it
    from alembic.config import Config
    from alembic.script import ScriptDirectory

__all__ = ["ensure_schema", "upgrade", "current_revision", "head_revision", "heads",
           "script_location", "HEAD_REVISION"]

#: The schema revision this software expects. A test keeps it equal to the scripts' only head,
#: so the everyday check (database at head?) needs no Alembic import.
HEAD_REVISION = "0007_oci_artifacts"

def script_location() -> Path:
    """Directory of the Alembic scripts: the installed ``registry._migrations`` package, or the
    top-level ``migrations/`` of a source checkout run without installing."""
    try:
        root = importlib.resources.files("registry._migrations")
    except ModuleNotFoundError:
        root = PACKAGE_PARENT / "migrations"
    if not isinstance(root, Path) or not (root / "env.py").is_file():
        raise StoreError("the database migrations are missing from this installation",
                         hint="reinstall pt2-registry")
    return root


def _config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    # ConfigParser interpolates '%', which may appear in an install path.
    config.set_main_option("script_location", str(script_location()).replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config())


def heads() -> tuple[str, ...]:
    """Every head revision of the migration scripts (exactly one in a healthy tree)."""
    return tuple(_script().get_heads())


def head_revision() -> str:
    """The revision this software expects, e.g. ``'0001_initial'``."""
    found = heads()
    if len(found) != 1:
        raise StoreError(f"the migration scripts have {len(found)} heads, expected one",
                         hint="merge them with `alembic merge`")
    return found[0]


def _revision_of(conn: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


def _fast_revision(engine: Engine) -> Any:
    """The stamped revision read with plain SQL (no Alembic import); None when unreadable."""
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table("alembic_version"):
                return None
            rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    except sa_exc.SQLAlchemyError:
        return None
    return rows[0] if len(rows) == 1 else None


def current_revision(engine: Engine) -> str | None:
    """The database's schema revision, None for a database without one (fresh).

        >>> from registry.store import make_engine
        >>> current_revision(make_engine("sqlite://")) is None
        True
    """
    try:
        with engine.connect() as conn:
            return _revision_of(conn)
    except sa_exc.SQLAlchemyError as exc:
        raise translate_error(exc, engine) from exc


def _is_known(revision: str) -> bool:
    from alembic.util import CommandError

    try:
        return _script().get_revision(revision) is not None
    except CommandError:
        return False


def _newer_error(engine: Engine, current: str) -> StoreError:
    return StoreError(
        f"the database {redacted_url(engine)} is at schema revision {current!r}, which this "
        f"pt2-registry does not know: the registry software is older than the database",
        hint="upgrade pt2-registry")


def _check_known(engine: Engine, current: str, head: str) -> None:
    """Raise unless the database is at head: outdated (behind) or newer than this software."""
    if current == head:
        return
    if not _is_known(current):
        raise _newer_error(engine, current)
    raise DatabaseOutdatedError(
        f"the database {redacted_url(engine)} is at schema revision {current!r}, behind this "
        f"pt2-registry ({head!r})", current=current, head=head)


def _has_registry_tables(conn: Connection) -> bool:
    return inspect(conn).has_table("models")


def _migrate(engine: Engine, *, only_if_fresh: bool) -> tuple[str | None, str]:
    head = head_revision()
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                advisory_lock(conn, MIGRATION_LOCK_KEY)
                before = _revision_of(conn)  # again: another process may have just migrated
                if before == head:
                    return before, head
                if before is None:
                    if _has_registry_tables(conn):
                        raise StoreError(f"the database {redacted_url(engine)} has registry "
                                         f"tables but no schema revision; pt2reg did not "
                                         f"create it")
                elif only_if_fresh:
                    _check_known(engine, before, head)
                elif not _is_known(before):
                    raise _newer_error(engine, before)
                from alembic import command

                command.upgrade(_config(conn), "head")
                return before, head
    except sa_exc.SQLAlchemyError as exc:
        raise translate_error(exc, engine) from exc


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Migrate the database to head (``pt2reg db upgrade``); returns (before, after) revisions.

    For example, on a fresh database::

        upgrade(make_engine("sqlite:////tmp/reg/registry.db"))   # -> (None, '0006_packs'), head today
    """
    return _migrate(engine, only_if_fresh=False)


def ensure_schema(engine: Engine, *, auto_create: bool) -> None:
    """Check the database is at head before use; create a fresh one when ``auto_create``.

    Raises DatabaseOutdatedError (behind head, or fresh and not ``auto_create``) or StoreError
    (unknown revision: the database is newer than this software). For example::

        ensure_schema(make_engine("sqlite:////tmp/reg/registry.db"), auto_create=True)
    """
    if _fast_revision(engine) == HEAD_REVISION:
        return
    head = head_revision()
    current = current_revision(engine)  # the common case, without taking the write lock
    if current is not None:
        _check_known(engine, current, head)
        return
    if not auto_create:
        raise DatabaseOutdatedError(
            f"the database {redacted_url(engine)} has no registry schema yet",
            current=None, head=head)
    _migrate(engine, only_if_fresh=True)
