"""Alembic environment of pt2-registry.

Runs in two ways:

- embedded, from :mod:`registry.store.migrate` (``pt2reg db upgrade``, and the automatic
  creation of a fresh SQLite registry): the caller passes an open connection, possibly inside
  a transaction that already holds the migration lock, in ``config.attributes["connection"]``;
- from the ``alembic`` command line in a source checkout, for writing new revisions::

      alembic -c alembic.ini -x url=sqlite:///dev.db revision --autogenerate -m "add x"

  The URL comes from ``-x url=...``, else ``PT2REG_DB``, else ``sqlalchemy.url`` in the ini.
"""
from __future__ import annotations

import os

from alembic import context

from registry.store.orm import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = (context.get_x_argument(as_dictionary=True).get("url") or os.environ.get("PT2REG_DB")
           or config.get_main_option("sqlalchemy.url"))
    if not url:
        raise SystemExit("no database URL: pass -x url=..., set PT2REG_DB or sqlalchemy.url")
    return url


def _configure(**kwargs) -> None:
    context.configure(target_metadata=target_metadata, compare_type=True, **kwargs)


def _run(connection) -> None:
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    url = _url()
    _configure(url=url, literal_binds=True, render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from registry.store.engine import make_engine

    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
