"""Which token a remote client sends, and the login file that keeps tokens between commands.

Order: ``PT2REG_TOKEN``, else the file ``--token-file`` names, else the token ``pt2reg login``
saved for this server's URL in ``HOME/credentials.json``. That file is written with mode 0600
(atomically: a reader never sees half of it) and refused when the group or others may read it,
as ``ssh`` refuses a private key: a token in a world-readable file is a token anyone on the
machine holds.

    {"registries": {"https://registry.example.com": {"token": "pt2r_...", "owner": "ci",
                                                    "token_id": 4, "saved_at": "2026-11-24T08:00:00+00:00"}}}
"""
from __future__ import annotations

import json
import os
import stat
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..atomic import atomic_write
from ..config import Settings, normalize_url
from ..constants import CREDENTIALS_FILE, ENV_TOKEN
from ..errors import NotFoundError, UsageError

__all__ = ["credentials_path", "token_and_source", "read_token_file", "load_logins", "save_login",
           "remove_login"]

_MAX_TOKEN_FILE = 64 * 1024


def credentials_path(home: Path) -> Path:
    return Path(home) / CREDENTIALS_FILE


def token_and_source(settings: Settings) -> tuple[str | None, str | None]:
    """(the token for ``settings.url``, where it came from: ``PT2REG_TOKEN``, ``--token-file
    PATH`` or ``the login saved for URL``), (None, None) when there is none. ``PT2REG_TOKEN``
    and ``--token-file`` count only for the registry they were configured for
    (``settings.token_for``); any other URL gets only its own saved login."""
    bound = settings.token_for is None or settings.url is None or settings.token_for == settings.url
    if bound and settings.token:
        return settings.token.strip(), ENV_TOKEN
    if bound and settings.token_file is not None:
        return read_token_file(settings.token_file), f"--token-file {settings.token_file}"
    if settings.url is None:
        return None, None
    entry = load_logins(settings.home).get(settings.url)
    token = entry.get("token") if isinstance(entry, dict) else None
    if isinstance(token, str) and token:
        return token, f"the login saved for {settings.url} ({credentials_path(settings.home)})"
    return None, None


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token a file holds (surrounding whitespace dropped); ``UsageError`` when it is
    missing, empty or not text."""
    p = Path(path)
    try:
        with open(p, "rb") as fp:
            raw = fp.read(_MAX_TOKEN_FILE + 1)
    except FileNotFoundError as exc:
        raise NotFoundError(f"token file {p} not found", what="file", name=str(p),
                            hint=f"give the file `pt2reg token create` wrote the secret to, or set {ENV_TOKEN}") from exc
    except IsADirectoryError as exc:
        raise UsageError(f"token file {p} is a directory", hint="give the file holding the token") from exc
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        token = ""
    if not token or len(raw) > _MAX_TOKEN_FILE or any(c.isspace() for c in token):
        raise UsageError(f"token file {p} does not hold a token",
                         hint="the file should contain only the secret `pt2reg token create` printed (pt2r_...)")
    return token


def load_logins(home: Path) -> dict[str, Any]:
    """``{url: entry}`` from the login file; {} when there is none. ``UsageError`` when the
    group or others may read it (with the command that fixes it) or it is not ours to read."""
    path = credentials_path(home)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UsageError(f"cannot read the login file {path}: {exc.strerror}",
                         hint=f"remove it and run `pt2reg login` again, or set {ENV_TOKEN}") from exc
    with os.fdopen(fd, "rb") as fp:
        mode = os.fstat(fp.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"the login file {path} is not a regular file", hint="remove it and log in again")
        if mode & 0o077:
            raise UsageError(f"the login file {path} may be read by other users (mode {stat.S_IMODE(mode):04o})",
                             hint=f"run `chmod 600 {path}`, and revoke its tokens if others could read them")
        raw = fp.read()
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"the login file {path} is not valid JSON",
                         hint="remove it and run `pt2reg login URL --token-file F` again") from exc
    registries = data.get("registries") if isinstance(data, dict) else None
    return registries if isinstance(registries, dict) else {}


def save_login(home: Path, url: str, token: str, *, owner: str, token_id: int | None) -> Path:
    """Keep ``token`` for ``url`` in the login file (mode 0600, replaced atomically)."""
    url = normalize_url(url)
    logins = load_logins(home)
    logins[url] = {"token": token, "owner": owner, "token_id": token_id,
                   "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    return _write(home, logins)


def remove_login(home: Path, url: str | None) -> list[str]:
    """Forget the token kept for ``url`` (None: every one); returns the URLs forgotten."""
    logins = load_logins(home)
    gone = sorted(logins) if url is None else [u for u in (normalize_url(url),) if u in logins]
    if gone:
        _write(home, {u: e for u, e in logins.items() if u not in gone})
    return gone


def _write(home: Path, logins: dict[str, Any]) -> Path:
    path = credentials_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"registries": logins}, indent=2, sort_keys=True) + "\n"
    with atomic_write(path, mode=0o600) as fp:
        fp.write(text.encode("utf-8"))
    return path
