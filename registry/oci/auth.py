"""Credentials for OCI registries, where docker, podman and skopeo keep them, and the
distribution spec's challenges (``WWW-Authenticate``).

Where credentials come from, first found wins:

1. ``REGISTRY_AUTH_FILE`` (podman, skopeo, buildah), when set: it must exist;
2. ``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``.

In a file, the host's entry of ``credHelpers`` (``docker-credential-<helper> get``), else
``credsStore`` (the same for every host), else ``auths``: ``auth`` (base64 ``user:password``),
``username``/``password`` or ``identitytoken``. Entries are matched by host (and port) only:
``https://ghcr.io``, ``ghcr.io`` and ``ghcr.io/v1/`` name the same registry; an entry for
``ghcr.io/team`` (podman's per-repository form) applies to repositories under it, the longest
match first.

A ``Credential`` is bound to the host it was found for; ``client.OciClient`` sends it only to
that registry (and to the token realm that registry names in its challenge, over HTTPS unless
the registry itself is plain HTTP) and never follows a redirect with it. Nothing here logs or
prints a secret; ``repr`` hides them.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import NotFoundError, UsageError

__all__ = ["Credential", "Challenge", "find_credential", "auth_files", "parse_challenges", "ENV_AUTH_FILE",
           "ENV_DOCKER_CONFIG"]

ENV_AUTH_FILE = "REGISTRY_AUTH_FILE"
ENV_DOCKER_CONFIG = "DOCKER_CONFIG"
_MAX_FILE = 4 * 1024 * 1024
#: a credential helper that does not answer in this long is not waited for
HELPER_TIMEOUT = 30.0
_HELPER_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}\Z")


@dataclass(frozen=True)
class Credential:
    """A registry login, for ``host`` only. ``identity_token``: an OAuth2 refresh token
    (``docker login`` to some registries stores one instead of a password)."""

    host: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    identity_token: str | None = field(default=None, repr=False)
    source: str = ""

    @property
    def basic(self) -> str | None:
        """The ``Authorization`` value of HTTP basic auth, when a username and password are known."""
        if self.username is None or self.password is None:
            return None
        return "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode("ascii")


def auth_files() -> list[Path]:
    """The credential files consulted, in order (``REGISTRY_AUTH_FILE`` alone when it is set)."""
    named = os.environ.get(ENV_AUTH_FILE)
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise NotFoundError(f"{ENV_AUTH_FILE}={named}: no such file", what="file", name=named)
        return [path]
    config_dir = os.environ.get(ENV_DOCKER_CONFIG)
    return [Path(config_dir).expanduser() / "config.json" if config_dir else Path.home() / ".docker" / "config.json"]


def _read(path: Path) -> dict:
    try:
        if path.stat().st_size > _MAX_FILE:
            raise UsageError(f"{path} is larger than {_MAX_FILE} bytes: not a credentials file")
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the registry credentials in {path}: {type(exc).__name__}",
                         hint="fix the file (it is JSON, as `docker login` writes it) or point "
                              f"{ENV_AUTH_FILE}/{ENV_DOCKER_CONFIG} elsewhere") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} is not a JSON object", hint="it should be what `docker login` writes")
    return data


def _entry_host(key: str) -> tuple[str, str]:
    """(host, repository prefix) of an ``auths`` key: scheme and ``/v1/`` or ``/v2/`` dropped."""
    text = key.strip()
    for scheme in ("https://", "http://"):
        if text.startswith(scheme):
            text = text[len(scheme):]
    host, _, rest = text.partition("/")
    rest = rest.strip("/")
    if rest in ("v1", "v2"):
        rest = ""
    return host.lower(), rest


def find_credential(host: str, repository: str = "") -> Credential | None:
    """The login for ``host`` (and ``repository``), or None: anonymous access."""
    host = host.lower()
    for path in auth_files():
        data = _read(path)
        raw_helpers = data.get("credHelpers")
        helpers: dict[str, Any] = raw_helpers if isinstance(raw_helpers, dict) else {}
        helper = helpers.get(host) or data.get("credsStore")
        if isinstance(helper, str) and helper:
            found = _from_helper(helper, host, path)
            if found is not None:
                return found
        raw_auths = data.get("auths")
        auths: dict[str, Any] = raw_auths if isinstance(raw_auths, dict) else {}
        best: tuple[int, dict[str, Any]] | None = None
        for key, entry in auths.items():
            h, prefix = _entry_host(str(key))
            if h != host or not isinstance(entry, dict):
                continue
            if prefix and not (repository == prefix or repository.startswith(prefix + "/")):
                continue
            if best is None or len(prefix) > best[0]:
                best = (len(prefix), entry)
        if best is not None:
            return _from_entry(best[1], host, path)
    return None


def _from_entry(entry: dict, host: str, path: Path) -> Credential | None:
    source = f"{path} (auths entry for {host})"
    if isinstance(entry.get("identitytoken"), str) and entry["identitytoken"]:
        return Credential(host, username=entry.get("username") or None, identity_token=entry["identitytoken"],
                          source=source)
    auth = entry.get("auth")
    if isinstance(auth, str) and auth:
        try:
            user, sep, password = base64.b64decode(auth, validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            raise UsageError(f"{path}: the auth entry for {host} is not base64 of user:password",
                             hint=f"run `docker login {host}` again") from None
        if not sep:
            raise UsageError(f"{path}: the auth entry for {host} is not base64 of user:password",
                             hint=f"run `docker login {host}` again")
        return Credential(host, user, password, source=source)
    if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
        return Credential(host, entry["username"], entry["password"], source=source)
    return None


def _from_helper(helper: str, host: str, path: Path) -> Credential | None:
    if not _HELPER_RE.match(helper):
        raise UsageError(f"{path}: credential helper {helper!r} is not a helper name")
    program = shutil.which(f"docker-credential-{helper}")
    if program is None:
        raise UsageError(f"{path} names the credential helper {helper!r} for {host}, but "
                         f"docker-credential-{helper} is not on PATH", hint="install it, or remove the entry")
    try:
        answer = subprocess.run([program, "get"], input=host.encode(), capture_output=True, timeout=HELPER_TIMEOUT,
                                check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"credential helper docker-credential-{helper} failed for {host}: {type(exc).__name__}") \
            from None
    if answer.returncode != 0:   # "credentials not found in native keychain": anonymous
        return None
    try:
        data = json.loads(answer.stdout)
        user, secret = data["Username"], data["Secret"]
        if not isinstance(user, str) or not isinstance(secret, str):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"credential helper docker-credential-{helper} gave a malformed answer for {host}") \
            from None
    source = f"docker-credential-{helper} (for {host})"
    if user == "<token>":
        return Credential(host, identity_token=secret, source=source)
    return Credential(host, user, secret, source=source)


@dataclass(frozen=True)
class Challenge:
    """One ``WWW-Authenticate`` challenge: ``scheme`` (lowercase) and its parameters."""

    scheme: str
    params: dict[str, str]


_PARAM_RE = re.compile(r'\s*([A-Za-z0-9_-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))\s*,?')


def parse_challenges(header: str) -> list[Challenge]:
    """``Bearer realm="https://auth/token",service="reg",scope="repository:a:pull"`` ->
    ``[Challenge('bearer', {...})]`` (several challenges in one header are split at schemes).

    >>> parse_challenges('Bearer realm="https://a/t",service="r"')[0].params["service"]
    'r'
    """
    out: list[Challenge] = []
    text = header.strip()
    while text:
        m = re.match(r"([A-Za-z][A-Za-z0-9_-]*)\s*", text)
        if m is None:
            break
        scheme, text = m.group(1).lower(), text[m.end():]
        params: dict[str, str] = {}
        while text:
            p = _PARAM_RE.match(text)
            if p is None or (p.group(2) is None and p.group(3) == "" and "=" not in text[:p.end()]):
                break
            # a new scheme starts where a token is not followed by '='
            params[p.group(1).lower()] = p.group(2).replace('\\"', '"') if p.group(2) is not None else p.group(3)
            text = text[p.end():].lstrip(" ,")
            if re.match(r"[A-Za-z][A-Za-z0-9_-]*\s+[A-Za-z0-9_-]+\s*=", text):
                break
        out.append(Challenge(scheme, params))
    return out
