"""Deadlines of Redis calls, kept by one timer: ``CallDeadlines`` (not the RabbitMQ
receiver's lease ``Deadlines``).

redis-py's own ``socket_timeout`` starts an event-loop timer around every reply it reads:
~4.5 µs each, half the time of a pipeline of 500 commands. An ``asyncio.timeout`` per
call would still cost that much per lone command. Here a call only enters its deadline
in a dict (~0.4 µs); one timer, armed while calls are in flight, looks every
``tick`` seconds and cancels the calls past their deadline, which then raise
``TimeoutError``. So a call is cut between its deadline and one tick after it.

A cut call is cancelled inside redis-py, which drops that connection (its late reply is
never read by a later call).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["CallDeadlines"]

T = TypeVar("T")


class CallDeadlines:
    """The deadlines of the calls in flight on one event loop (see the module docstring)."""

    __slots__ = ("_calls", "_cut", "_ids", "_tick", "_timer", "_timer_loop")

    def __init__(self, tick: float) -> None:
        self._tick = tick
        self._calls: dict[int, tuple[asyncio.Task[object], float]] = {}
        self._cut: set[int] = set()
        self._ids = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    async def run(self, operation: Callable[[], Awaitable[T]], seconds: float) -> T:
        """``operation()``; ``TimeoutError`` if it is still running ``seconds`` from now
        (cut at most one tick later)."""
        task = asyncio.current_task()
        assert task is not None  # awaited code runs in a task
        loop = asyncio.get_running_loop()
        call = next(self._ids)
        self._calls[call] = (task, loop.time() + seconds)
        if self._timer is None or self._timer_loop is not loop:  # (a later loop, say)
            self._timer = loop.call_later(self._tick, self._check, loop)
            self._timer_loop = loop
        try:
            return await operation()
        except asyncio.CancelledError:
            if call in self._cut and task.uncancel() == 0:  # ours, and nobody else's
                raise TimeoutError(f"no answer within {seconds} s") from None
            raise
        finally:
            del self._calls[call]
            self._cut.discard(call)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer_loop is not loop:
            return  # a timer of a loop this connection no longer runs on
        self._timer = None
        now = loop.time()
        for call, (task, deadline) in self._calls.items():
            if deadline <= now and call not in self._cut and task.get_loop() is loop:
                self._cut.add(call)
                task.cancel()
        if self._calls:
            self._timer = loop.call_later(self._tick, self._check, loop)
