"""``Broker.delete_queue``: not a CONTRACT behaviour, the tooling the suite cleans up with.

The optional behaviour ``delete queue`` (``OPTIONAL_BEHAVIOURS``): ``brokerkit check``
prints and judges it after the 17, and the project's own test run has it on every broker URL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

import brokerkit

from ._helpers import nothing_within, quiet_for, receive, receive_n

QUIET = 2.0
"""Long enough for anything the deleted queue still held to show up (it is all ready);
``quiet_for`` sizes it to the broker."""


@pytest.mark.behaviour("delete queue")
async def test_delete_queue_removes_messages_dlq_group_state_and_dedup_memory(
    broker: brokerkit.Broker, queue: str, group: str, new_queue: Callable[[str | None], str]
) -> None:
    sibling = new_queue(queue + "-other")  # shares the deleted queue's name as a prefix
    await broker.publish(queue, b"old-1")
    await broker.publish(queue, b"old-2", fifo_group="g")
    await broker.publish(queue, b"old-3", dedup_id="d1")
    await broker.publish(sibling, b"sibling")
    async with broker.consumer(queue, group) as consumer:
        first = await receive(consumer)
        await first.ack()
        second = await receive(consumer)
        await second.dead_letter("to have a dead letter")

    await broker.delete_queue(queue)
    await broker.delete_queue(queue)  # idempotent

    await broker.publish(queue, b"new-1", dedup_id="d1")  # the dedup memory went too
    await broker.publish(queue, b"new-2", fifo_group="g")
    quiet = quiet_for(broker, QUIET)
    async with broker.consumer(queue, group) as consumer, broker.dead_letters(queue) as dead:
        got = sorted(m.body for m in await receive_n(consumer, 2))
        assert got == [b"new-1", b"new-2"]
        # the queue and its DLQ are watched at once: one quiet period covers both
        late, dead_late = await asyncio.gather(
            nothing_within(consumer, quiet), nothing_within(dead, quiet)
        )
        assert late is None, f"a message of the deleted queue came back: {late!r}"
        assert dead_late is None, f"the deleted queue's DLQ kept {dead_late!r}"
    async with broker.consumer(sibling, group) as consumer:
        msg = await receive(consumer)
        assert msg.body == b"sibling"
        await msg.ack()


@pytest.mark.behaviour("delete queue")
async def test_delete_queue_refuses_while_this_connection_consumes_it(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    await broker.publish(queue, b"kept")
    async with broker.consumer(queue, group) as consumer:
        with pytest.raises(brokerkit.InvalidArgument, match="close"):
            await broker.delete_queue(queue)
        msg = await receive(consumer)  # nothing was deleted
        assert msg.body == b"kept"
        await msg.ack()
    with pytest.raises(brokerkit.InvalidName):
        await broker.delete_queue("not a name")
