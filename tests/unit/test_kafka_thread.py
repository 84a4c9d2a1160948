"""The consumer thread's command channel (``ConsumerThread.call``), without a Consumer.

A stand-in worker runs the thread's hot cycle for commands only (wait on ``kick``, then
``run_commands``), as the real thread does between ``consume`` calls.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from brokerkit.backends import HostPort
from brokerkit.backends.kafka._errors import error_map
from brokerkit.backends.kafka._partition import Key, Snapshot
from brokerkit.backends.kafka._thread import Assigned, ConsumerThread


class _Sink:
    def records(self, msgs: list[Any]) -> None:
        pass

    def assigned(self, parts: list[Assigned]) -> None:
        pass

    async def revoke(self, keys: list[Key]) -> list[Snapshot]:
        return []

    def revoked(self, keys: list[Key], committed: set[Key]) -> None:
        pass

    def lost(self, keys: list[Key]) -> None:
        pass


def _thread() -> ConsumerThread:
    return ConsumerThread(
        {},
        "t",
        name="test",
        dedup_window=None,
        loop=asyncio.get_running_loop(),
        sink=_Sink(),
        errors=error_map((HostPort("127.0.0.1", 9092),)),
    )


async def test_calls_run_on_the_worker_and_return_their_results_cold_and_hot() -> None:
    thread = _thread()
    stop = threading.Event()
    ran_on: list[int] = []

    def worker() -> None:
        while not stop.is_set():
            thread.kick.wait(0.002)
            thread.kick.clear()
            thread.run_commands(None)  # type: ignore[arg-type]  # commands here need none

    def command(value: int) -> Any:
        def fn(consumer: object) -> int:
            ran_on.append(threading.get_ident())
            return value

        return fn

    runner = threading.Thread(target=worker, daemon=True)
    runner.start()
    try:
        assert await thread.call(command(1)) == 1  # cold
        started = time.monotonic()
        assert await thread.call(command(2)) == 2  # hot: right after a command
        assert time.monotonic() - started < 1.0
    finally:
        stop.set()
        runner.join(5.0)
    assert ran_on == [runner.ident, runner.ident]


async def test_a_failing_command_raises_its_error_at_the_caller() -> None:
    thread = _thread()

    def boom(consumer: object) -> None:
        raise RuntimeError("boom")

    call = asyncio.ensure_future(thread.call(boom))
    await asyncio.sleep(0)
    thread.run_commands(None)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="boom"):
        await asyncio.wait_for(call, 5.0)
