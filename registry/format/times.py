"""One text form for every time the registry shows: ISO 8601 in UTC, ending in ``Z``.

``--json`` documents, the server's JSON, the CLI's tables and the web pages all write times
through :func:`iso_utc`, so a time read in one place can be pasted into another (``show --at``,
``audit --since``, the audit page's filters) and compares as text in the order it happened::

    >>> from datetime import datetime, timedelta, timezone
    >>> t = datetime(2026, 11, 22, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=1)))
    >>> iso_utc(t)                     # documents: exact, fixed width
    '2026-11-22T01:03:04.000005Z'
    >>> iso_utc(t, seconds=True)       # tables and pages: the same form, to the second
    '2026-11-22T01:03:04Z'
    >>> iso_utc(None) is None
    True

Naive datetimes are taken as UTC (what the SQLite store hands back). The audit chain's
canonical ``ts`` text (``store.audit_chain.format_ts``) is this same form, as are the times a
bundle carries (``signed_at``). Pure: no IO, importable from every layer above ``format``.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import overload

__all__ = ["iso_utc"]


@overload
def iso_utc(when: datetime, *, seconds: bool = False) -> str: ...
@overload
def iso_utc(when: None, *, seconds: bool = False) -> None: ...


def iso_utc(when: datetime | None, *, seconds: bool = False) -> str | None:
    """``when`` as ISO 8601 UTC text with ``Z``: microseconds always written (fixed width), or
    whole seconds (truncated) with ``seconds=True``; None stays None."""
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ" if seconds else "%Y-%m-%dT%H:%M:%S.%fZ")
