"""Where the registry lives: home, metadata database URL and blob store URL, or a server.

Precedence: explicit argument (``--home/--db/--store``) > environment (``PT2REG_HOME``,
``PT2REG_DB``, ``PT2REG_STORE``) > the embedded default under the home directory
(SQLite file ``registry.db`` and blob directory ``blobs/``). Pure: no IO but path expansion.

A registry server (``--registry URL`` / ``PT2REG_URL``) replaces the database and the store:
``url`` is then set and the client never opens either. Its token is ``PT2REG_TOKEN``
(``token``), else the file ``--token-file`` names (``token_file``), else what ``pt2reg login``
saved under the home (read by ``registry.remote.credentials``). An explicit ``--db`` or
``--store`` beats ``PT2REG_URL`` from the environment; with ``--registry`` it is a usage error.
"""
from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from .constants import DEFAULT_HOME, ENV_ACTOR, ENV_DB, ENV_HOME, ENV_STORE, ENV_TOKEN, ENV_URL

__all__ = ["Settings", "actor", "hostname", "normalize_url"]


@dataclass(frozen=True)
class Settings:
    home: Path
    db_url: str
    store_url: str
    #: the registry server's base URL (``--registry`` / ``PT2REG_URL``); None: direct stores
    url: str | None = None
    #: ``PT2REG_TOKEN`` (never shown: a secret)
    token: str | None = field(default=None, repr=False)
    #: ``--token-file``: a file holding the token
    token_file: Path | None = None

    @property
    def remote(self) -> bool:
        """True when a registry server stands in for the database and the store."""
        return self.url is not None

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
                env: dict[str, str] | None = None, *, registry: str | None = None,
                token_file: str | None = None) -> "Settings":
        env = dict(os.environ) if env is None else env
        if registry and (db or store):
            from .errors import UsageError

            raise UsageError("--registry cannot be combined with --db or --store",
                             hint="a registry server holds its own database and store: give one or the other")
        home_path = Path(home or env.get(ENV_HOME) or DEFAULT_HOME).expanduser().resolve()
        db_url = db or env.get(ENV_DB) or f"sqlite:///{home_path / 'registry.db'}"
        store_url = store or env.get(ENV_STORE) or f"file://{home_path / 'store'}"
        url = registry or (None if db or store else env.get(ENV_URL) or None)
        if url is not None:
            url = normalize_url(url)
        return cls(home_path, db_url, store_url, url, env.get(ENV_TOKEN) or None,
                   Path(token_file).expanduser() if token_file else None)


def normalize_url(url: str) -> str:
    """A registry server's base URL without a trailing slash; ``UsageError`` unless it is
    ``http(s)://host[:port][/path]`` with no credentials, query or fragment.

    >>> normalize_url("http://127.0.0.1:8710/")
    'http://127.0.0.1:8710'
    """
    from urllib.parse import urlsplit

    from .errors import UsageError

    text = (url or "").strip()
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise UsageError(f"invalid registry URL {url!r}: {exc}",
                         hint="use http(s)://HOST[:PORT], e.g. https://registry.example.com") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment \
            or parts.username or parts.password:
        raise UsageError(f"invalid registry URL {url!r}",
                         hint="use http(s)://HOST[:PORT] with no user, query or fragment "
                              "(the token goes in PT2REG_TOKEN or --token-file)")
    return text.rstrip("/")


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
