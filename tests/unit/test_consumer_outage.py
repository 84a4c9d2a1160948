"""An open consumer rides out a broker outage longer than the backend's own retry.

A backend's receive gives up after its retry budget (Redis: 10 s) with BrokerUnavailable;
a network cut of 20 s made the iterator raise it, and the consumer stopped (``brokerkit
check redis://… --proxy``, 2026-12-03). CONTRACT section 9: consumers recover by
themselves. Pure facade logic: memory://'s receiver behind one that fails as an
unreachable broker would.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

import brokerkit
from brokerkit.backends import Delivery, QueueRef, Receiver, ReceiverSettings
from brokerkit.backends.memory import MemoryBackend
from brokerkit.testing import ForwardingReceiver, memory_url


class _Down(ForwardingReceiver):
    """memory://'s receiver; its receives fail while ``down`` (counted in ``failed``)."""

    def __init__(self, inner: Receiver[Any]) -> None:
        super().__init__(inner)
        self.down = True
        self.failed = 0

    async def receive(self, max_messages: int, wait: float) -> list[Delivery[Any]]:
        if self.down:
            self.failed += 1
            raise brokerkit.BrokerUnavailable("redis at 127.0.0.1:6379 did not answer")
        return await self.inner.receive(max_messages, wait)


class _Backend(MemoryBackend):
    receiver: _Down | None = None

    async def subscribe(self, queue: QueueRef, group: str, settings: ReceiverSettings) -> _Down:
        self.receiver = _Down(await super().subscribe(queue, group, settings))
        return self.receiver


async def _until(condition: Any, what: str, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.01)


async def test_the_iterator_waits_through_an_outage_and_yields_once_the_broker_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backend = _Backend.from_url(brokerkit.BrokerURL.parse(memory_url()))
    caplog.set_level(logging.WARNING, logger="brokerkit.consumer")
    async with brokerkit.from_backend(backend) as broker:
        await broker.publish("q", b"after the outage")
        async with broker.consumer("q", "g") as consumer:
            took = asyncio.ensure_future(consumer.__anext__())
            await _until(lambda: backend.receiver and backend.receiver.failed >= 3, "3 failures")
            assert not took.done()  # still waiting: no BrokerUnavailable out of the iterator
            assert backend.receiver is not None
            backend.receiver.down = False
            msg = await asyncio.wait_for(took, 5.0)
            assert msg.body == b"after the outage"
            await msg.ack()
    texts = [r.getMessage() for r in caplog.records]
    assert any("receiving again until it answers" in t and "q/g" in t for t in texts), texts
    assert any("receiving again after" in t for t in texts), texts
    assert len(texts) == 2, texts  # not one line per failed receive


async def test_close_ends_an_iterator_that_waits_through_an_outage() -> None:
    backend = _Backend.from_url(brokerkit.BrokerURL.parse(memory_url()))
    async with brokerkit.from_backend(backend) as broker:
        consumer = broker.consumer("q", "g")
        await consumer.open()
        took = asyncio.ensure_future(consumer.__anext__())
        await _until(lambda: backend.receiver and backend.receiver.failed >= 2, "2 failures")
        await consumer.aclose()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(took, 3.0)


async def test_a_consumer_that_cannot_subscribe_still_raises() -> None:
    class Unreachable(MemoryBackend):
        async def subscribe(self, queue: QueueRef, group: str, settings: ReceiverSettings) -> Any:
            raise brokerkit.BrokerUnavailable("redis at 127.0.0.1:6379 did not answer")

    backend = Unreachable.from_url(brokerkit.BrokerURL.parse(memory_url()))
    async with brokerkit.from_backend(backend) as broker:
        with pytest.raises(brokerkit.BrokerUnavailable):  # a wrong host fails at once
            async with broker.consumer("q", "g") as consumer:
                await consumer.__anext__()
