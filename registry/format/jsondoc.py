"""The one JSON encoder of the documents pt2-registry hands out: every ``--json`` output
(``cli._core.emit_json``) and every answer of the server (``remote.wire.encode``, which the
routes call) go through :func:`encode`, so a record is the same JSON in both and its times are
written one way (``format.times.iso_utc``: ISO 8601 UTC with ``Z``).

    >>> from datetime import datetime, timezone
    >>> encode({"at": datetime(2026, 12, 4, 1, 2, 3, tzinfo=timezone.utc), "n": (1, 2)})
    {'at': '2026-12-04T01:02:03.000000Z', 'n': [1, 2]}
    >>> dumps({"b": 1, "a": None})
    '{"a": null, "b": 1}'
"""
from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any

from .times import iso_utc

__all__ = ["encode", "dumps"]


def encode(value: Any) -> Any:
    """JSON-ready form of a record (dataclass or NamedTuple), list, dict or scalar; datetimes as
    ``iso_utc`` text."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # NamedTuple (ChainVerdict)
        return {k: encode(v) for k, v in zip(value._fields, value)}
    if isinstance(value, datetime):
        return iso_utc(value)
    if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [encode(v) for v in value]
    return value


def dumps(value: Any, *, indent: int | None = None) -> str:
    """``encode(value)`` as JSON text, keys sorted; anything else JSON cannot hold (a path) as its
    ``str``."""
    return json.dumps(encode(value), indent=indent, sort_keys=True, default=str)
