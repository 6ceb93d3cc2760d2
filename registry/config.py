"""Where the registry lives: home, metadata database URL and blob store URL.

Precedence: explicit argument (``--home/--db/--store``) > environment (``PT2REG_HOME``,
``PT2REG_DB``, ``PT2REG_STORE``) > the embedded default under the home directory
(SQLite file ``registry.db`` and blob directory ``blobs/``). Pure: no IO but path expansion.
"""
from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from .constants import DEFAULT_HOME, ENV_ACTOR, ENV_DB, ENV_HOME, ENV_STORE

__all__ = ["Settings", "actor", "hostname"]


@dataclass(frozen=True)
class Settings:
    home: Path
    db_url: str
    store_url: str

    @property
    def embedded_db(self) -> bool:
        """True for SQLite: a fresh file is created at head automatically. A shared server
        database (PostgreSQL) is never created or migrated without `pt2reg db upgrade`."""
        return self.db_url.startswith("sqlite")

    @property
    def cache_dir(self) -> Path:
        return self.home / "cache"

    @classmethod
    def resolve(cls, home: str | None = None, db: str | None = None, store: str | None = None,
                env: dict[str, str] | None = None) -> "Settings":
        env = dict(os.environ) if env is None else env
        home_path = Path(home or env.get(ENV_HOME) or DEFAULT_HOME).expanduser().resolve()
        db_url = db or env.get(ENV_DB) or f"sqlite:///{home_path / 'registry.db'}"
        store_url = store or env.get(ENV_STORE) or f"file://{home_path / 'store'}"
        return cls(home_path, db_url, store_url)


def hostname() -> str:
    return socket.gethostname()


def actor() -> str:
    """Who is acting: ``PT2REG_ACTOR``, else ``user@host``."""
    explicit = os.environ.get(ENV_ACTOR)
    if explicit:
        return explicit
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid()) if hasattr(os, "getuid") else "unknown"
    return f"{user}@{hostname()}"
