"""Holding off Python's cyclic garbage collector while per-chunk records live (``gc_held``)."""
from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["GC_HOLD_SECONDS", "gc_held"]

#: the longest the collector stays held off, however many holds overlap (a long transfer, or
#: pushes and pulls in several threads back to back, must not keep it off for minutes)
GC_HOLD_SECONDS = 10.0


class _GcHold:
    """The process's one hold on the cyclic collector (``gc_held``), counted."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders = 0
        self.was_on = False                           # the collector was on when the first hold began
        self.timer: threading.Timer | None = None

    def enter(self, limit: float) -> None:
        with self.lock:
            self.holders += 1
            if self.holders == 1:
                self.was_on = gc.isenabled()
                gc.disable()
                self.timer = threading.Timer(limit, self.expire)
                self.timer.daemon = True
                self.timer.start()

    def exit(self) -> None:
        with self.lock:
            self.holders -= 1
            if self.holders == 0:
                if self.timer is not None:
                    self.timer.cancel()
                    self.timer = None
                if self.was_on:
                    gc.enable()

    def expire(self) -> None:
        """The time limit: the collector runs again, though holds are still open."""
        with self.lock:
            if self.holders and self.was_on:
                gc.enable()


_GC_HOLD = _GcHold()


@contextlib.contextmanager
def gc_held(limit: float = GC_HOLD_SECONDS) -> Iterator[None]:
    """Hold off Python's cyclic garbage collector while a step builds and drops per-chunk
    records (a manifest, a pack index and the parts of a 10,000-tensor program: some 50,000
    objects that live a few dozen milliseconds). Collected while they live, they are promoted
    to the oldest generation, and every few pulls that triggers a full collection of the whole
    process, 80 ms in a process that imported torch (measured); held, they are freed by their
    reference counts before any collection sees them.

    Nested and concurrent holds are counted: the collector runs again when the last one ends,
    and only if it was on before the first; and after ``limit`` seconds of overlapping holds in
    any case, so other threads' cyclic garbage is never kept for long. (An application that
    turns the collector off while a hold lasts finds it on again when the hold ends.)"""
    _GC_HOLD.enter(limit)
    try:
        yield
    finally:
        _GC_HOLD.exit()
