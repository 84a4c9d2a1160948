"""A receiver that passes every verb to another (memory://'s, in the unit tests): test
doubles subclass it and override only the verb they change."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brokerkit.backends import Delivery, Receiver


class Forwarding(Receiver[Any]):
    def __init__(self, inner: Receiver[Any]) -> None:
        self.inner = inner

    async def receive(self, max_messages: int, wait: float) -> list[Delivery[Any]]:
        return await self.inner.receive(max_messages, wait)

    async def ack(self, delivery: Delivery[Any]) -> None:
        await self.inner.ack(delivery)

    async def nack(self, delivery: Delivery[Any], delay: float) -> None:
        await self.inner.nack(delivery, delay)

    async def extend(self, delivery: Delivery[Any], ack_timeout: float) -> None:
        await self.inner.extend(delivery, ack_timeout)

    async def release(self, deliveries: Sequence[Delivery[Any]]) -> None:
        await self.inner.release(deliveries)

    async def aclose(self) -> None:
        await self.inner.aclose()
