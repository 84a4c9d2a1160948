"""``CallDeadlines``: the one timer that cuts Redis calls past their deadline (pure asyncio)."""

from __future__ import annotations

import asyncio
import functools
import time

import pytest

from brokerkit.backends.redis_streams._call_deadlines import CallDeadlines


async def _answer_after(seconds: float, value: str = "late") -> str:
    await asyncio.sleep(seconds)
    return value


async def test_a_call_past_its_deadline_raises_timeout_error_within_one_tick() -> None:
    deadlines = CallDeadlines(tick=0.05)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await deadlines.run(lambda: _answer_after(5.0), 0.2)
    took = time.monotonic() - started
    assert 0.2 <= took < 0.2 + 0.05 + 1.0, took  # deadline, a tick, slack (uncut: 5 s)


async def test_a_call_in_time_returns_and_leaves_no_timer_running() -> None:
    deadlines = CallDeadlines(tick=0.05)
    assert await deadlines.run(lambda: _answer_after(0.01, "ok"), 1.0) == "ok"
    results = await asyncio.gather(
        *(deadlines.run(functools.partial(_answer_after, 0.01 * i, str(i)), 1.0) for i in range(10))
    )
    assert results == [str(i) for i in range(10)]
    deadline = time.monotonic() + 2.0
    while deadlines._timer is not None:  # the timer stops once no call is in flight
        assert time.monotonic() < deadline, "the timer kept running with no call in flight"
        await asyncio.sleep(0.01)


async def test_only_the_call_past_its_deadline_is_cut() -> None:
    deadlines = CallDeadlines(tick=0.02)
    slow = asyncio.ensure_future(deadlines.run(lambda: _answer_after(5.0), 0.1))
    quick = await deadlines.run(lambda: _answer_after(0.2, "quick"), 1.0)
    assert quick == "quick"
    with pytest.raises(TimeoutError):
        await slow


async def test_the_callers_own_cancel_stays_a_cancel() -> None:
    deadlines = CallDeadlines(tick=0.02)
    call = asyncio.ensure_future(deadlines.run(lambda: _answer_after(5.0), 0.1))
    deadline = time.monotonic() + 2.0
    while not deadlines._calls:  # the call is in flight
        assert time.monotonic() < deadline, "the call never started"
        await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
