"""A URL's own backend behind a thin wrapper: test doubles for the seam, on every broker.

``wrapped(url, receiver, refuse=...)`` is a Broker whose backend is the URL's, with each
receiver wrapped in a ``ForwardingReceiver`` subclass (a fault, a slow reply, a lax lease
check) and, with ``refuse``, publish calls failed on demand: ``refuse(queue, messages)``
returns why this backend call fails (BrokerUnavailable, nothing sent) or None to let it
through; with ``pause``, each publish call takes that long more (a slow broker reply: the
facade then gathers concurrent publishes into batches, as it does on a loaded broker,
even on memory://, whose publish never waits). So failure paths (a redrive whose
republish fails, one coalesced publish batch that fails) are driven through the public
API on any broker, not hoped for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import brokerkit
from brokerkit.backends import (
    Backend,
    Delivery,
    QueueRef,
    QueueStats,
    Receiver,
    ReceiverSettings,
)
from brokerkit.testing import ForwardingReceiver

Refuse = Callable[[QueueRef, Sequence[brokerkit.Outgoing]], str | None]
"""Why a publish call fails (it raises BrokerUnavailable, sends nothing), or None."""


class Wrapped(Backend):
    """The URL's own backend, its receivers wrapped in ``receiver``, its publish calls
    refused where ``refuse`` says so."""

    def __init__(
        self,
        inner: Backend,
        receiver: type[ForwardingReceiver] = ForwardingReceiver,
        refuse: Refuse | None = None,
        pause: float = 0.0,
    ) -> None:
        self.inner = inner
        self.pause = pause
        self.receiver = receiver
        self.refuse = refuse
        self.refused = 0
        """Publish calls refused so far."""
        self.capabilities = inner.capabilities

    @classmethod
    def from_url(cls, url: brokerkit.BrokerURL) -> Backend:
        raise NotImplementedError  # built around an existing backend only

    async def open(self) -> None:
        await self.inner.open()

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def publish(
        self, queue: QueueRef, messages: Sequence[brokerkit.Outgoing]
    ) -> list[brokerkit.PublishResult]:
        if self.pause:
            await asyncio.sleep(self.pause)
        why = self.refuse(queue, messages) if self.refuse is not None else None
        if why is not None:
            self.refused += 1
            raise brokerkit.BrokerUnavailable(f"publish to {queue} refused (injected): {why}")
        return await self.inner.publish(queue, messages)

    async def declare(self, queue: QueueRef, group: str | None = None) -> None:
        await self.inner.declare(queue, group)

    async def browse(self, queue: QueueRef, limit: int) -> list[Delivery[None]]:
        return await self.inner.browse(queue, limit)

    async def stats(self, queue: QueueRef, group: str | None) -> QueueStats:
        return await self.inner.stats(queue, group)

    async def delete_queue(self, queue: str) -> None:
        await self.inner.delete_queue(queue)

    async def subscribe(
        self, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> Receiver[Any]:
        return self.receiver(await self.inner.subscribe(queue, group, settings))


def wrapped(
    broker_url: str,
    receiver: type[ForwardingReceiver] = ForwardingReceiver,
    refuse: Refuse | None = None,
    pause: float = 0.0,
) -> brokerkit.Broker:
    """A Broker over ``Wrapped`` around ``broker_url``'s backend (unopened; it opens it)."""
    inner = brokerkit.connect(broker_url).backend
    return brokerkit.from_backend(Wrapped(inner, receiver, refuse, pause))
