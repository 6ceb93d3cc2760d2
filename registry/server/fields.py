"""Typed reads of JSON body fields and query parameters: each a value or a one-line UsageError.

    >>> text({"name": "bert"}, "name")
    'bert'
    >>> number({"number": "7"}, "number")
    Traceback (most recent call last):
    registry.errors.UsageError: field 'number' must be an integer, not str
"""
from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from ..errors import UsageError

__all__ = ["text", "opt_text", "number", "opt_number", "items", "mapping", "opt_mapping",
           "flag", "when"]

_MISSING = object()
_INT64 = 1 << 63


def _get(body: Mapping[str, Any], key: str, required: bool) -> Any:
    value = body.get(key, _MISSING)
    if value is _MISSING or (value is None and required):
        if required:
            raise UsageError(f"field {key!r} is required")
        return None
    return value


def text(body: Mapping[str, Any], key: str, *, max_len: int = 4096) -> str:
    value = _get(body, key, True)
    if not isinstance(value, str):
        raise UsageError(f"field {key!r} must be a string, not {type(value).__name__}")
    if len(value) > max_len:
        raise UsageError(f"field {key!r} is longer than {max_len} characters")
    return value


def opt_text(body: Mapping[str, Any], key: str, *, max_len: int = 4096) -> str | None:
    return None if body.get(key) is None else text(body, key, max_len=max_len)


def number(body: Mapping[str, Any], key: str) -> int:
    value = _get(body, key, True)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"field {key!r} must be an integer, not {type(value).__name__}")
    if not -_INT64 <= value < _INT64:  # what the database can hold
        raise UsageError(f"field {key!r} is out of range ({str(value)[:20]}...)",
                         hint="a 64-bit signed integer")
    return value


def opt_number(body: Mapping[str, Any], key: str) -> int | None:
    return None if body.get(key) is None else number(body, key)


def items(body: Mapping[str, Any], key: str, *, limit: int = 100_000) -> list[Any]:
    value = body.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise UsageError(f"field {key!r} must be a list, not {type(value).__name__}")
    if len(value) > limit:
        raise UsageError(f"field {key!r} has {len(value)} entries, at most {limit} are accepted")
    return value


def mapping(body: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"field {key!r} must be an object, not {type(value).__name__}")
    return value


def opt_mapping(body: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    return None if body.get(key) is None else mapping(body, key)


def flag(body: Mapping[str, Any], key: str, default: bool = False) -> bool:
    value = body.get(key, default)
    if not isinstance(value, bool):
        raise UsageError(f"field {key!r} must be true or false")
    return value


def when(raw: str | None, key: str) -> datetime | None:
    """An aware datetime from ISO-8601 text (naive is UTC); None passes through."""
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00")) if isinstance(raw, str) else None
    except ValueError:
        value = None
    if value is None:
        raise UsageError(f"{key} {str(raw)[:40]!r} is not an ISO-8601 time",
                         hint="e.g. 2026-11-24T08:00:00Z")
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
