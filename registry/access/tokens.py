"""Token secrets: how they are made, how they are stored (a hash), and how long they live.

A secret is ``pt2r_`` + 256 random bits (URL-safe base64). The store keeps only its SHA-256:
with that much entropy a slow password hash adds nothing, and a fast one lets the server look
a token up by hash on every request.

    >>> looks_like_token(new_secret())
    True
    >>> len(hash_secret("pt2r_x"))
    64
"""
from __future__ import annotations

import hashlib
import re
import secrets
from datetime import datetime, timedelta, timezone

from ..errors import UsageError

__all__ = ["PREFIX", "new_secret", "hash_secret", "looks_like_token", "parse_expiry",
           "validate_owner"]

PREFIX = "pt2r_"
_TOKEN_RE = re.compile(r"pt2r_[A-Za-z0-9_\-]{43}\Z")  # token_urlsafe(32) is 43 characters
_DURATION_RE = re.compile(r"([0-9]{1,6})([mhdw])\Z")
_OWNER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+\-]{0,63}\Z")
_UNITS = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
EXPIRY_HINT = ("give a duration such as 30d, 12h, 90m or 2w, or an ISO-8601 time "
               "such as 2027-01-31T00:00:00Z")


def new_secret() -> str:
    """A fresh token secret (shown to its owner once, never stored)."""
    return PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    """The SHA-256 hex of ``secret``: what the store keeps and looks tokens up by."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def looks_like_token(text: str) -> bool:
    """Whether ``text`` has the shape of a secret from :func:`new_secret` (no lookup)."""
    return isinstance(text, str) and _TOKEN_RE.match(text) is not None


def validate_owner(owner: str) -> str:
    """``owner`` if it is a valid token owner name (it becomes the audit log's actor)."""
    if not isinstance(owner, str) or not _OWNER_RE.match(owner):
        raise UsageError(f"invalid token owner {owner!r}",
                         hint="use letters, digits, '-', '_', '.', '@', '+', at most 64 "
                              "characters, e.g. ci-training or ana@team")
    return owner


def parse_expiry(text: str, now: datetime) -> datetime:
    """The aware expiry time of ``text``: a duration after ``now`` (``30d``, ``12h``, ``90m``,
    ``2w``) or an ISO-8601 time (a naive one is UTC). UsageError if malformed or not in the
    future."""
    raw = (text or "").strip() if isinstance(text, str) else ""
    m = _DURATION_RE.match(raw)
    if m:
        amount = int(m.group(1))
        if amount < 1:
            raise UsageError(f"invalid expiry {text!r}: the duration must be positive", hint=EXPIRY_HINT)
        return now + timedelta(**{_UNITS[m.group(2)]: amount})
    try:
        when = datetime.fromisoformat(raw.replace("Z", "+00:00")) if raw else None
    except ValueError:
        when = None
    if when is None:
        raise UsageError(f"invalid expiry {text!r}", hint=EXPIRY_HINT)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    if when <= now:
        raise UsageError(f"invalid expiry {text!r}: that time has passed", hint=EXPIRY_HINT)
    return when
