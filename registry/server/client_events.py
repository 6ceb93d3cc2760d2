"""What a client may add to the audit log (``POST /v1/events``): bounded, rate limited, true.

Any token that may pull a model may record that it pulled or loaded one of its versions, and
the event stays in the hash-chained log for good. So :func:`admit_event` checks, before
anything is written:

- **rate**, per token: a bucket of ``PT2REG_EVENT_BURST`` events (default 600) refilled at
  ``PT2REG_EVENT_RATE`` per second (default 5); past it, 429 with ``Retry-After``. The buckets
  live in memory, one set per server process: N replicas admit up to N times the rate, and a
  restart forgets them. That bounds how fast one token can grow the log, which is their
  purpose, without a shared store of counters. Every request takes from the bucket, refused
  ones included, so the checks below cost a hostile token its rate too;
- **size**: the event's ``details`` at most :data:`MAX_DETAILS_BYTES` as canonical JSON (413);
- **truth**: it names a version (``number``, ``digest`` or both, agreeing) that exists: the
  same 404 as resolving that version; its ``ref``, if any, is a ref of the same model.

    >>> guard = EventGuard(rate=1.0, burst=2, clock=lambda: 0.0)
    >>> [guard.take(7) for _ in range(3)]
    [0.0, 0.0, 1.0]
"""
from __future__ import annotations

import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import Request

from ..digests import canonical_json
from ..errors import NotFoundError, UsageError
from ..refs import Ref
from .auth import Call

__all__ = ["EventGuard", "EventTooLarge", "TooManyEvents", "admit_event", "MAX_DETAILS_BYTES",
           "ENV_EVENT_RATE", "ENV_EVENT_BURST"]

ENV_EVENT_RATE = "PT2REG_EVENT_RATE"
ENV_EVENT_BURST = "PT2REG_EVENT_BURST"
#: a client's details are a few fields (``served_from_cache_at``); the token id is added after
MAX_DETAILS_BYTES = 2048


class EventTooLarge(UsageError):
    """413: an event's details are over :data:`MAX_DETAILS_BYTES`."""

    status = 413


class TooManyEvents(UsageError):
    """429: the token recorded events faster than its rate; ``headers`` carry ``Retry-After``."""

    status = 429

    def __init__(self, message: str, *, retry_after: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.retry_after = retry_after
        self.headers = {"Retry-After": str(retry_after)}


class EventGuard:
    """Token buckets, one per key (a token id), at most ``keys`` remembered (least recently
    used forgotten first: a forgotten key starts with a full bucket)."""

    def __init__(self, rate: float, burst: int, *, keys: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._keys, self._clock = rate, burst, keys, clock
        self._buckets: OrderedDict[Any, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EventGuard:
        env = os.environ if environ is None else environ
        try:
            rate = float(env.get(ENV_EVENT_RATE, 5))
            burst = int(env.get(ENV_EVENT_BURST, 600))
        except ValueError as exc:
            raise UsageError(f"{ENV_EVENT_RATE} / {ENV_EVENT_BURST}: {exc}",
                             hint="events per second (a number) and a whole number of events") from None
        if not (rate > 0 and burst >= 1):
            raise UsageError(f"{ENV_EVENT_RATE} must be > 0 and {ENV_EVENT_BURST} >= 1")
        return cls(rate, burst)

    def take(self, key: Any) -> float:
        """Take one event from ``key``'s bucket: 0.0 when admitted, else the seconds until one
        would be."""
        now = self._clock()
        with self._lock:
            level, at = self._buckets.pop(key, (float(self.burst), now))
            level = min(float(self.burst), level + (now - at) * self.rate)
            wait = 0.0 if level >= 1 else (1 - level) / self.rate
            self._buckets[key] = (level - 1 if wait == 0.0 else level, now)
            while len(self._buckets) > self._keys:
                self._buckets.popitem(last=False)
        return wait


def admit_event(request: Request, call: Call, *, model: str, number: int | None, digest: str | None,
                ref: str | None, details: Mapping[str, Any]) -> None:
    """Raise unless the event may be recorded (see the module docstring): TooManyEvents (429),
    EventTooLarge (413), UsageError (400), NotFoundError (404)."""
    guard: EventGuard = request.app.state.event_guard
    who = call.who
    wait = guard.take(who.token_id)
    if wait > 0:
        retry = max(1, math.ceil(wait))
        raise TooManyEvents(f"token {who.owner!r} (id {who.token_id}) records events faster than this "
                            f"server allows ({guard.rate:g} per second, bursts of {guard.burst}); "
                            f"nothing was recorded", retry_after=retry, hint=f"retry in {retry} s")
    try:
        size = len(canonical_json(dict(details)))
    except ValueError:
        raise UsageError("event details must be plain JSON (no NaN or infinity)") from None
    if size > MAX_DETAILS_BYTES:
        raise EventTooLarge(f"event details are {size} bytes, at most {MAX_DETAILS_BYTES} are accepted; "
                            f"nothing was recorded", hint="a pull or load event carries a few fields")
    if ref is not None and Ref.parse(ref).name != model:
        raise UsageError(f"ref {ref[:200]!r} is not a ref of model {model!r}")
    if number is None and digest is None:
        raise UsageError("a pull or load event names its version: give 'number' or 'digest'")
    meta = request.app.state.registry.meta
    version = meta.resolve(Ref(model, version=number) if number is not None else Ref(model, digest=digest))
    if digest is not None and version.digest != digest:
        raise NotFoundError(f"model {model!r} has no version {number} with digest {digest}",
                            what="version", name=model)
