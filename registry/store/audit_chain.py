"""The audit log's hash chain: canonical event content, event hashes, and chain verification.

Pure logic over plain values (mappings or records with the same attribute names); no database.
Each event's ``hash`` is the sha256 of the canonical JSON of its content *including* the hash of
the event before it (``prev_hash``), so editing a field, deleting an event or reordering events
breaks the chain at a specific, nameable event::

    >>> e1 = seal({"seq": 1, "ts": "2026-11-22T02:03:04.000001Z", "actor": "ana", "host": "h",
    ...            "action": "publish", "model": "bert", "version": 1}, prev_hash=GENESIS_HASH)
    >>> verify_chain([e1]).ok
    True

Timestamps are part of the hashed content, so they have one canonical text form
(:func:`format_ts`), stored verbatim by the metadata store on every backend.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any, NamedTuple

from ..digests import canonical_json, sha256_bytes
from ..format.times import iso_utc

__all__ = [
    "GENESIS_HASH", "CONTENT_FIELDS", "ChainVerdict", "format_ts", "parse_ts", "event_content",
    "event_hash", "seal", "verify_chain", "version_fields_hash",
]

#: ``prev_hash`` of the first event.
GENESIS_HASH = "0" * 64

#: The fields an event's hash covers (besides ``prev_hash``), in documentation order.
CONTENT_FIELDS = ("seq", "ts", "actor", "host", "action", "model", "version", "digest", "ref",
                  "details")

_TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


class ChainVerdict(NamedTuple):
    """Result of :func:`verify_chain`: ``(ok, first_bad_seq, reason)``."""

    ok: bool
    first_bad_seq: int | None
    reason: str


def format_ts(when: datetime) -> str:
    """Canonical UTC text of a timestamp, microsecond precision; naive datetimes are taken as UTC.

    >>> format_ts(datetime(2026, 11, 22, 2, 3, 4, 123456, tzinfo=timezone.utc))
    '2026-11-22T02:03:04.123456Z'
    """
    return iso_utc(when)


def parse_ts(text: str) -> datetime:
    """Inverse of :func:`format_ts` (an aware UTC datetime).

    >>> parse_ts("2026-11-22T02:03:04.123456Z").isoformat()
    '2026-11-22T02:03:04.123456+00:00'
    """
    return datetime.strptime(text, _TS_FORMAT).replace(tzinfo=timezone.utc)


def _field(event: Any, name: str) -> Any:
    if isinstance(event, Mapping):
        return event.get(name)
    return getattr(event, name, None)


def event_content(event: Any) -> dict[str, Any]:
    """The canonical, hashed content of an event (a mapping or a record).

    ``ts`` may be canonical text or a datetime; ``details`` may be a JSON value or its JSON text
    (as stored). Raises ``ValueError`` when ``details`` text is not JSON.

    >>> event_content({"seq": 3, "ts": "2026-11-22T02:03:04.000000Z", "action": "pull"})["details"]
    {}
    """
    ts = _field(event, "ts")
    details = _field(event, "details")
    if isinstance(details, (str, bytes)):
        details = json.loads(details)
    content = {name: _field(event, name) for name in CONTENT_FIELDS}
    content["ts"] = format_ts(ts) if isinstance(ts, datetime) else ts
    content["details"] = details if details is not None else {}
    return content


def event_hash(content: Mapping[str, Any], prev_hash: str) -> str:
    """Hex sha256 of the canonical JSON of ``content`` plus ``prev_hash``.

    >>> len(event_hash({"seq": 1}, GENESIS_HASH))
    64
    """
    return sha256_bytes(canonical_json({**content, "prev_hash": prev_hash}))


def seal(event: Mapping[str, Any], *, prev_hash: str) -> dict[str, Any]:
    """A copy of ``event`` in canonical form with ``prev_hash`` and ``hash`` filled in.

    >>> seal({"seq": 1, "ts": "2026-11-22T02:03:04.000000Z"}, prev_hash=GENESIS_HASH)["prev_hash"]
    '0000000000000000000000000000000000000000000000000000000000000000'
    """
    content = event_content(event)
    return {**content, "prev_hash": prev_hash, "hash": event_hash(content, prev_hash)}


def version_fields_hash(created_by: str, metadata_json: str,
                        lineage: Iterable[tuple[str, str, str | None, str | None]]) -> str:
    """Hex sha256 of what a version's publish event vouches for besides its digest: who
    published it, its metadata and its lineage edges ``(kind, value, digest, extra_json)``,
    exactly as stored (text forms, edges in sorted order). Recorded in the ``publish`` event's
    details as ``fields`` (or by an ``attest`` event for versions published before), so
    editing any of them in the database breaks ``audit --verify``.

    >>> version_fields_hash("ana", "{}", []) == version_fields_hash("ana", "{}", [])
    True
    >>> version_fields_hash("ana", "{}", []) == version_fields_hash("eve", "{}", [])
    False
    """
    edges = sorted(([kind, value, digest, extra] for kind, value, digest, extra in lineage),
                   key=canonical_json)
    return sha256_bytes(canonical_json({"created_by": created_by, "metadata_json": metadata_json,
                                        "lineage": edges}))


def verify_chain(events: Iterable[Any]) -> ChainVerdict:
    """Walk events in stored order and name the first one that breaks the chain.

    Detects an edited field (hash mismatch), a deleted or reordered event (sequence gap or
    ``prev_hash`` not matching the previous event's hash). An empty log is intact.

    >>> verify_chain([]).ok
    True
    """
    expected_prev = GENESIS_HASH
    expected_seq: int | None = None
    count = 0
    for event in events:
        seq = _field(event, "seq")
        if expected_seq is not None and seq != expected_seq:
            return ChainVerdict(False, seq, f"event {seq} follows event {expected_seq - 1}: "
                                            f"events are missing or out of order")
        if _field(event, "prev_hash") != expected_prev:
            what = "the start of the log" if expected_seq is None else f"event {expected_seq - 1}"
            return ChainVerdict(False, seq, f"event {seq} does not link to {what}: "
                                            f"an earlier event was deleted, altered or reordered")
        try:
            actual = event_hash(event_content(event), expected_prev)
        except (ValueError, TypeError) as exc:
            return ChainVerdict(False, seq, f"event {seq} cannot be read: {exc}")
        if actual != _field(event, "hash"):
            return ChainVerdict(False, seq, f"event {seq} was altered: its content does not "
                                            f"match its hash")
        expected_prev = actual
        expected_seq = (seq if isinstance(seq, int) else 0) + 1
        count += 1
    return ChainVerdict(True, None, f"{count} events, chain intact")
