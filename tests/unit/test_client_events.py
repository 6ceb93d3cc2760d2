"""``registry.server.client_events.EventGuard``: per-token buckets, on a clock the test moves."""
from __future__ import annotations

import pytest

from registry.errors import UsageError
from registry.server.client_events import EventGuard


def test_each_token_has_its_own_bucket_refilled_at_the_rate() -> None:
    now = [0.0]
    guard = EventGuard(rate=2.0, burst=3, clock=lambda: now[0])
    assert [guard.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert guard.take("a") == pytest.approx(0.5)
    assert guard.take("b") == 0.0  # another token is not held up
    now[0] = 0.5
    assert guard.take("a") == 0.0 and guard.take("a") > 0
    now[0] = 1000.0
    assert [guard.take("a") for _ in range(4)][-1] > 0  # refilled to the burst, never past it


def test_forgotten_tokens_start_full_and_the_bounds_are_checked() -> None:
    guard = EventGuard(rate=1.0, burst=1, keys=2, clock=lambda: 0.0)
    assert guard.take(1) == 0.0 and guard.take(1) > 0
    guard.take(2)
    guard.take(3)  # token 1 forgotten: at most two remembered
    assert guard.take(1) == 0.0
    for env in ({"PT2REG_EVENT_RATE": "0"}, {"PT2REG_EVENT_BURST": "x"}, {"PT2REG_EVENT_RATE": "-1"}):
        with pytest.raises(UsageError):
            EventGuard.from_env(env)
    assert (EventGuard.from_env({}).rate, EventGuard.from_env({}).burst) == (5.0, 600)
