"""Helpers for testing your own services, on an isolated ``memory://`` broker per test.

``memory://`` passes the whole contract suite (leases, durable attempts, nack delays, the
DLQ, dedup, FIFO groups), so a test written with these helpers sees what production
brokers do, not a mock's idea of it::

    async def test_signup_sends_the_email():
        url = brokerkit.testing.memory_url()
        async with brokerkit.connect(url) as broker:
            await broker.publish("emails", b'{"to": "a@example.com"}')
            await brokerkit.testing.run_until_idle(app, url=url)
            dead = await brokerkit.testing.assert_dead_lettered(broker, "emails")
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from brokerkit._app import App
from brokerkit._broker import DEFAULT_GROUP, Broker, connect
from brokerkit._consumer import Message
from brokerkit._message import Outgoing
from brokerkit.backends.base import Delivery, PublishCopy, Receiver

__all__ = [
    "ForwardingReceiver",
    "assert_dead_lettered",
    "fresh_broker",
    "memory_url",
    "run_until_idle",
    "take_one",
]


def memory_url(prefix: str = "test") -> str:
    """A ``memory://`` URL no other test uses: an empty broker of its own."""
    return f"memory://{prefix}{uuid.uuid4().hex[:16]}"


@asynccontextmanager
async def fresh_broker() -> AsyncIterator[Broker]:
    """``async with fresh_broker() as broker``: connected to an isolated ``memory://``."""
    async with connect(memory_url()) as broker:
        yield broker


async def run_until_idle(
    app: App, *, url: str | None = None, idle: float = 0.2, timeout: float = 10.0
) -> None:
    """Run ``app``'s handlers until none is busy and none finished a message for ``idle``
    seconds, then stop it (draining). AssertionError if not idle within ``timeout``.

    A message nacked with a delay longer than ``idle`` is not waited for: use a retry
    policy with short delays in tests.
    """
    await app.start(url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            now = time.monotonic()
            if app.busy == 0 and now - app.last_activity >= idle:
                return
            if now > deadline:
                raise AssertionError(f"{app!r} still busy after {timeout:.1f}s")
            await asyncio.sleep(min(idle / 4, 0.05))
    finally:
        await app.stop(drain_timeout=timeout)


async def take_one(
    broker: Broker, queue: str, *, group: str = DEFAULT_GROUP, timeout: float = 5.0
) -> Message:
    """The next message of ``queue`` (acked), or AssertionError after ``timeout`` seconds."""
    async with broker.consumer(queue, group, prefetch=1) as consumer:
        try:
            msg = await asyncio.wait_for(consumer.__anext__(), timeout)
        except TimeoutError:
            raise AssertionError(f"no message on {queue!r} within {timeout:.1f}s") from None
        await msg.ack()
    return msg


async def assert_dead_lettered(
    broker: Broker, queue: str, *, reason: str | None = None, timeout: float = 5.0
) -> Message:
    """The next message of ``queue``'s DLQ (acked); AssertionError if none arrives within
    ``timeout`` seconds, or if ``reason`` is given and not in its dead-letter reason."""
    async with broker.dead_letters(queue, prefetch=1) as dead:
        try:
            msg = await asyncio.wait_for(dead.__anext__(), timeout)
        except TimeoutError:
            raise AssertionError(f"no dead letter of {queue!r} within {timeout:.1f}s") from None
        await msg.ack()
    info = msg.dead_letter_info
    assert info is not None
    if reason is not None and reason not in info.reason:
        raise AssertionError(f"dead-letter reason {info.reason!r} does not contain {reason!r}")
    return msg


class ForwardingReceiver(Receiver[Any]):
    """A receiver that passes every verb to ``inner``, for test doubles of a backend:
    subclass it and override only the verb the double changes (a fault, a slow reply,
    acks recorded late), e.g. around ``await backend.subscribe(...)`` in a ``Backend``
    subclass handed to ``brokerkit.from_backend``."""

    def __init__(self, inner: Receiver[Any]) -> None:
        self.inner = inner

    async def receive(self, max_messages: int, wait: float) -> list[Delivery[Any]]:
        return await self.inner.receive(max_messages, wait)

    async def ack(self, delivery: Delivery[Any]) -> None:
        await self.inner.ack(delivery)

    async def nack(self, delivery: Delivery[Any], delay: float) -> None:
        await self.inner.nack(delivery, delay)

    async def dead_letter(
        self, delivery: Delivery[Any], copy: Outgoing, publish: PublishCopy
    ) -> None:
        await self.inner.dead_letter(delivery, copy, publish)

    async def extend(self, delivery: Delivery[Any], ack_timeout: float) -> None:
        await self.inner.extend(delivery, ack_timeout)

    async def release(self, deliveries: Sequence[Delivery[Any]]) -> None:
        await self.inner.release(deliveries)

    async def aclose(self) -> None:
        await self.inner.aclose()
