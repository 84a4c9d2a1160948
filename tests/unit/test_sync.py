"""The blocking facade: one loop thread, any caller thread, a clear error on its own thread."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

import brokerkit
from brokerkit.testing import memory_url


def test_publish_from_many_threads_and_consume_in_a_thread() -> None:
    with brokerkit.SyncBroker(memory_url()) as broker:
        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(lambda i: broker.publish("q", b"%03d" % i).id, range(200)))
        assert len(set(ids)) == 200
        got = []
        with broker.consumer("q", prefetch=50) as consumer:
            for msg in consumer:
                got.append(msg.body)
                msg.ack()
                if len(got) == 200:
                    break
        assert sorted(got) == [b"%03d" % i for i in range(200)]
        assert threading.active_count() >= 2  # the loop thread is still there
    with pytest.raises(brokerkit.ResourceClosed):
        broker.publish("q", b"late")


async def test_a_call_from_a_thread_running_another_loop_works() -> None:
    broker = brokerkit.SyncBroker(memory_url())
    try:
        result = broker.publish("q", b"from a coroutine")  # blocks this loop briefly, by design
        assert result.id
    finally:
        broker.close()


def test_a_call_from_its_own_loop_thread_raises_a_clear_error() -> None:
    broker = brokerkit.SyncBroker(memory_url())
    outcome: Future[BaseException | None] = Future()

    def on_loop() -> None:
        try:
            broker.publish("q", b"x")
        except BaseException as exc:
            outcome.set_result(exc)
        else:
            outcome.set_result(None)

    try:
        broker._loop.call_soon_threadsafe(on_loop)
        error = outcome.result(5)
        assert isinstance(error, RuntimeError) and "own event-loop thread" in str(error)
    finally:
        broker.close()


def test_bad_input_fails_before_any_io() -> None:
    with pytest.raises(brokerkit.ConfigError):
        brokerkit.SyncBroker("nope://x")
    with brokerkit.SyncBroker(memory_url()) as broker:
        with pytest.raises(brokerkit.InvalidName):
            broker.publish("bad.name", b"x")
        asyncio.run(asyncio.sleep(0))  # a caller's own asyncio.run is unaffected
