"""Where the registry lives: home, metadata database URL and blob store URL, or a server.

Precedence: explicit argument (``--home/--db/--store``) > environment (``PT2REG_HOME``,
``PT2REG_DB``, ``PT2REG_STORE``) > the embedded default under the home directory
(SQLite file ``registry.db`` and blob directory ``blobs/``). Pure: no IO but path expansion.

A registry server (``--registry URL`` / ``PT2REG_URL``) replaces the database and the store:
``url`` is then set and the client never opens either. Its token is ``PT2REG_TOKEN``
(``token``), else the file ``--token-file`` names (``token_file``), else what ``pt2reg login``
saved under the home for that URL (read by ``registry.remote.credentials``). A registry
server together with ``--db`` or ``--store`` is a usage error (exit 2), whether the server
came from ``--registry`` or ``PT2REG_URL``: configuration is never silently mixed.

Credentials are bound to an origin. ``PT2REG_TOKEN`` and ``--token-file`` belong to the
configured registry (``token_for``): ``registry_for(url)`` gives the settings to reach another
registry (a ``pt2reg://HOST/...`` URI), which carry neither; such a registry is refused unless
``PT2REG_ALLOWED_REGISTRIES`` (comma-separated URLs) names it, and then only the login saved for
it is sent there.
"""
from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from .constants import DEFAULT_HOME, ENV_ACTOR, ENV_DB, ENV_HOME, ENV_STORE, ENV_TOKEN, ENV_URL

__all__ = ["Settings", "actor", "hostname", "normalize_url", "same_origin", "ENV_ALLOWED_REGISTRIES"]

#: registry servers besides the configured one that ``pt2reg://HOST/...`` URIs may name
#: (comma-separated URLs); each gets only the login saved for it, never PT2REG_TOKEN
ENV_ALLOWED_REGISTRIES = "PT2REG_ALLOWED_REGISTRIES"


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
    #: the registry URL ``token`` and ``token_file`` belong to (the configured one); they are
    #: sent to no other (``registry_for``)
    token_for: str | None = None
    #: other registry servers a URI may name (``PT2REG_ALLOWED_REGISTRIES``), normalized URLs
    allowed_registries: tuple[str, ...] = ()

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
                token_file: str | None = None) -> Settings:
        env = dict(os.environ) if env is None else env
        from .errors import UsageError

        if registry and (db or store):
            raise UsageError("--registry cannot be combined with --db or --store",
                             hint="a registry server holds its own database and store: give one or the other")
        if (db or store) and env.get(ENV_URL):
            raise UsageError(f"{ENV_URL} ({env.get(ENV_URL)}) names a registry server, and --db/--store a database "
                             f"and store directly: which one?",
                             hint=f"unset {ENV_URL} to work on the database directly, or drop --db/--store")
        home_path = Path(home or env.get(ENV_HOME) or DEFAULT_HOME).expanduser().resolve()
        db_url = db or env.get(ENV_DB) or f"sqlite:///{home_path / 'registry.db'}"
        store_url = store or env.get(ENV_STORE) or f"file://{home_path / 'store'}"
        url = registry or env.get(ENV_URL) or None
        if url is not None:
            url = normalize_url(url)
        allowed = tuple(normalize_url(u) for u in (env.get(ENV_ALLOWED_REGISTRIES) or "").split(",") if u.strip())
        return cls(home_path, db_url, store_url, url, env.get(ENV_TOKEN) or None,
                   Path(token_file).expanduser() if token_file else None, url, allowed)

    def registry_for(self, url: str) -> Settings:
        """The settings to reach the registry server at ``url`` (a URI's host): these, when it
        is the configured registry (same origin); otherwise, when ``PT2REG_ALLOWED_REGISTRIES``
        names it, settings for it with no ``PT2REG_TOKEN`` and no ``--token-file`` (only the
        login saved for it); otherwise ``UsageError`` (exit 2): a token is never sent to a host
        because a URI names it."""
        from dataclasses import replace

        from .errors import UsageError

        url = normalize_url(url)
        if self.url is not None and same_origin(url, self.url):
            return self
        if not any(same_origin(url, allowed) for allowed in self.allowed_registries):
            configured = f"the configured registry is {self.url}" if self.url else f"no registry is configured ({ENV_URL})"
            raise UsageError(f"the URI names the registry {url}, and {configured}; credentials are never sent to a "
                             f"registry because a URI names it",
                             hint=f"name the model without a host (pt2reg:///NAME@REF) for the configured registry, "
                                  f"or list {url} in {ENV_ALLOWED_REGISTRIES} (it then gets only its own "
                                  f"`pt2reg login`)")
        return replace(self, url=url, token=None, token_file=None)


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


def same_origin(a: str, b: str) -> bool:
    """The same scheme, host (case-insensitive) and port (the scheme's default when none)."""
    from urllib.parse import urlsplit

    def origin(u: str) -> tuple[str, str, int | None]:
        p = urlsplit(u)
        return p.scheme, (p.hostname or "").lower(), p.port or {"http": 80, "https": 443}.get(p.scheme)

    return origin(a) == origin(b)


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
