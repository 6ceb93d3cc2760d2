"""The JSON the registry server and its HTTP client exchange: records in, records out.

Records (``registry.store.records``, ``ChainVerdict``) cross the wire as JSON objects built by
:func:`encode` and rebuilt by :func:`decode`; datetimes travel as ISO-8601 UTC text. Both ends
use this one module, so a field added to a record travels without a second edit.

    >>> from registry.store.records import LineageEdge
    >>> decode(LineageEdge, encode(LineageEdge("dataset", "s3://d", None)))
    LineageEdge(kind='dataset', value='s3://d', digest=None, extra=None)
"""
from __future__ import annotations

import dataclasses
import types
import typing
from datetime import datetime, timezone
from functools import cache
from typing import Any, TypeVar

from ..errors import StoreError
from ..format.jsondoc import encode
from ..format.times import iso_utc

__all__ = ["encode", "decode", "decode_list", "parse_datetime", "format_datetime", "FEATURES_HEADER",
           "CLIENT_FEATURES", "client_features"]

T = TypeVar("T")

#: what a client can read, sent with every request: a server refuses to hand a version whose
#: storage a client predates (packs) to one that does not say it reads it
FEATURES_HEADER = "X-Pt2reg-Features"
CLIENT_FEATURES = ("packs",)


def client_features(header: str | None) -> frozenset[str]:
    """The features a ``FEATURES_HEADER`` value names (comma-separated; none when absent).

    >>> sorted(client_features(" packs, later "))
    ['later', 'packs']
    """
    return frozenset(f.strip() for f in (header or "").split(",") if f.strip())


def format_datetime(when: datetime) -> str:
    """ISO-8601 text in UTC, ``Z``-suffixed (``registry.format.times.iso_utc``; naive is taken as UTC)."""
    return iso_utc(when)


def parse_datetime(text: str) -> datetime:
    """The datetime of ISO-8601 text (``Z`` accepted); a naive one is taken as UTC."""
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"the server sent a malformed timestamp {text!r}") from exc
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)




@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(hint: Any, raw: Any) -> Any:
    if raw is None:
        return None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        real = [a for a in args if a is not type(None)]
        return _convert(real[0], raw) if len(real) == 1 else raw
    if hint is datetime:
        return parse_datetime(raw)
    if origin is list and args:
        return [_convert(args[0], v) for v in raw]
    if origin is tuple and args and isinstance(raw, (list, tuple)):  # JSON has no tuples
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v) for v in raw)
        return tuple(_convert(a, v) for a, v in zip(args, raw))
    if isinstance(hint, type) and (dataclasses.is_dataclass(hint) or hasattr(hint, "_fields")):
        return decode(hint, raw)
    return raw


def decode(cls: type[T], raw: Any) -> T:
    """Rebuild a record of type ``cls`` from :func:`encode`'s output; ``StoreError`` when the
    server sent something else (missing field, wrong shape)."""
    if not isinstance(raw, dict):
        raise StoreError(f"the server sent {type(raw).__name__} where a {cls.__name__} was expected")
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else list(cls._fields)
    try:
        kwargs = {n: _convert(hints.get(n, Any), raw[n]) for n in names if n in raw}
        return cls(**kwargs)
    except (TypeError, ValueError, KeyError) as exc:
        raise StoreError(f"the server sent a malformed {cls.__name__}: {exc}") from exc


def decode_list(cls: type[T], raw: Any) -> list[T]:
    if not isinstance(raw, list):
        raise StoreError(f"the server sent {type(raw).__name__} where a list of {cls.__name__} was expected")
    return [decode(cls, item) for item in raw]
