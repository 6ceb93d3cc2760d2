"""Waiting in tests for something bound to happen: a background thread's next round, a server's
signer, a child process. Never a speed limit: the only limit is a hang guard, far longer than
anything takes on a busy machine, so a test fails on what did not happen, not on how long it
took."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["HANG_GUARD_S", "wait_until"]

T = TypeVar("T")

#: how long a wait goes on before it is called a hang (a failure naming what never happened)
HANG_GUARD_S = 300.0


def wait_until(predicate: Callable[[], T], what: str, *, poll: float = 0.02,
               limit: float = HANG_GUARD_S) -> T:
    """``predicate()``'s first true value, polled every ``poll`` s; AssertionError naming
    ``what`` if none comes within ``limit`` s."""
    deadline = time.monotonic() + limit
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still not after {limit:.0f} s (a hang)")
        time.sleep(poll)
