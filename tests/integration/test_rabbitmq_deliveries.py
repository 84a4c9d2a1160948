"""Deliveries handed to a receiver's callback by the channel's reader
(``rabbitmq/_deliveries.py``), not through a task each, against the shared RabbitMQ
(``BROKERKIT_RABBITMQ_URL``), on fresh queues deleted after.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

aiormq = pytest.importorskip("aiormq", reason="aio-pika is not installed")

from brokerkit.backends.rabbitmq._deliveries import consume, direct_callbacks  # noqa: E402
from contract_tests._helpers import eventually, fresh  # noqa: E402

URL = os.environ.get("BROKERKIT_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
COUNT = 50


@pytest.fixture
async def channel() -> AsyncIterator[Any]:
    try:
        connection = await aiormq.connect(URL)
    except (aiormq.exceptions.AMQPConnectionError, OSError):
        pytest.fail(f"no RabbitMQ at {URL}", pytrace=False)  # mandatory: never a skip
    try:
        yield await connection.channel(publisher_confirms=True)
    finally:
        await connection.close()


async def _queue_with(channel: Any, bodies: list[bytes]) -> str:
    queue = fresh("deliveries")
    await channel.queue_declare(queue, auto_delete=False)
    for body in bodies:
        await channel.basic_publish(body, routing_key=queue)
    return queue


async def test_deliveries_reach_the_callback_in_order_all_on_the_readers_task(
    channel: Any,
) -> None:
    bodies = [f"m{i}".encode() for i in range(COUNT)]
    queue = await _queue_with(channel, bodies)
    got: list[bytes] = []
    tasks: set[asyncio.Task[Any] | None] = set()

    def on_message(message: Any) -> None:
        got.append(message.body)
        tasks.add(asyncio.current_task())

    try:
        assert direct_callbacks(channel) is not None  # aiormq 7.x has what it needs
        await consume(channel, queue, on_message, no_ack=True)
        await eventually(lambda: len(got) == COUNT, timeout=10, what=f"{COUNT} deliveries")
        assert got == bodies
        # aiormq's own path runs each callback in a task of its own
        assert len(tasks) == 1, f"{len(tasks)} tasks ran {COUNT} callbacks"
    finally:
        await channel.queue_delete(queue)


async def test_a_callback_that_raises_is_logged_and_the_channel_reads_on(
    channel: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queue = await _queue_with(channel, [b"bad", b"good-1", b"good-2"])
    got: list[bytes] = []

    def on_message(message: Any) -> None:
        if message.body == b"bad":
            raise RuntimeError("the callback failed")
        got.append(message.body)

    try:
        with caplog.at_level(logging.ERROR, logger="brokerkit.backends.rabbitmq._deliveries"):
            await consume(channel, queue, on_message, no_ack=True)
            await eventually(
                lambda: len(got) == 2, timeout=10, what="the deliveries after the failed one"
            )
        assert got == [b"good-1", b"good-2"]
        assert not channel.is_closed
        assert any("the callback failed" in (r.exc_text or "") for r in caplog.records)
    finally:
        await channel.queue_delete(queue)


async def test_other_consumers_of_the_channel_keep_aiormqs_path(channel: Any) -> None:
    ours_queue = await _queue_with(channel, [b"ours"])
    theirs_queue = await _queue_with(channel, [b"theirs"])
    ours: list[bytes] = []
    theirs: list[bytes] = []

    async def their_callback(message: Any) -> None:  # a coroutine: aiormq's task runs it
        theirs.append(message.body)

    try:
        await consume(channel, ours_queue, lambda m: ours.append(m.body), no_ack=True)
        await channel.basic_consume(theirs_queue, their_callback, no_ack=True)
        await eventually(
            lambda: ours == [b"ours"] and theirs == [b"theirs"], timeout=10, what="both deliveries"
        )
    finally:
        await channel.queue_delete(ours_queue)
        await channel.queue_delete(theirs_queue)


def test_a_channel_without_aiormqs_internals_gets_no_direct_path() -> None:
    class Bare:  # what an aiormq without those internals would hand out
        number = 1
        consumers: dict[str, Any] = {}

    assert direct_callbacks(Bare()) is None
