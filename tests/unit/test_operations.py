"""browse and stats on memory:// (pure facade logic over the reference backend)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

import brokerkit
from brokerkit.backends import (
    Backend,
    BrokerURL,
    Capabilities,
    Outgoing,
    QueueRef,
    Receiver,
    ReceiverSettings,
)


async def test_browse_changes_nothing_and_shows_dead_letters_with_their_info() -> None:
    async with brokerkit.connect("memory://ops-browse") as broker:
        for i in range(3):
            await broker.publish("q", b"%d" % i, fifo_group="g", headers={"k": str(i)})
        async with broker.consumer("q", ack_timeout=30.0) as consumer:
            first = await consumer.__anext__()
            await first.dead_letter("bad input")
        for _ in range(2):  # twice: the same, in the same order
            seen = [m async for m in broker.browse("q")]
            assert [m.body for m in seen] == [b"1", b"2"]
            dead = [m async for m in broker.browse("q", dead_letters=True)]
            assert [m.body for m in dead] == [b"0"]
            info = dead[0].dead_letter_info
            assert info is not None and info.reason == "bad input" and info.attempts == 1
            assert dead[0].headers == {"k": "0"} and dead[0].fifo_group == "g"
        async with broker.dead_letters("q") as dlq:
            msg = await dlq.__anext__()
            assert msg.attempt == 1  # browsing counted no delivery
            await msg.ack()
        assert [m.body async for m in broker.browse("q", limit=1)] == [b"1"]


async def test_stats_follow_ready_in_flight_delayed_and_dead() -> None:
    async with brokerkit.connect("memory://ops-stats") as broker:
        for i in range(4):
            await broker.publish("q", b"%d" % i)
        stats = await broker.stats("q")
        assert (stats.ready, stats.in_flight, stats.delayed, stats.dead) == (4, 0, 0, 0)
        assert stats.oldest_age is not None and stats.oldest_age >= 0
        async with broker.consumer("q", prefetch=1) as consumer:
            a = await consumer.__anext__()
            b = await consumer.__anext__()
            c = await consumer.__anext__()
            await a.nack(delay=60)
            await b.dead_letter("poison")
            stats = await broker.stats("q")
            assert (stats.ready, stats.in_flight, stats.delayed, stats.dead) == (1, 1, 1, 1)
            await c.ack()


async def test_browse_is_refused_where_the_backend_cannot_browse() -> None:
    class NoBrowse(Backend):
        capabilities = Capabilities(
            max_message_bytes=1 << 20,
            dedup_window=300.0,
            dedup_window_configurable=False,
            fan_out=True,
        )

        @classmethod
        def from_url(cls, url: BrokerURL) -> NoBrowse:
            return cls()

        async def publish(self, queue: QueueRef, messages: Sequence[Outgoing]) -> list[Any]:
            raise AssertionError("not used")

        async def subscribe(
            self, queue: QueueRef, group: str, settings: ReceiverSettings
        ) -> Receiver[Any]:
            raise AssertionError("not used")

    async with brokerkit.from_backend(NoBrowse()) as broker:
        with pytest.raises(brokerkit.UnsupportedFeature, match="cannot browse"):
            [m async for m in broker.browse("q")]
        stats = await broker.stats("q")
        assert stats == brokerkit.QueueStats()
