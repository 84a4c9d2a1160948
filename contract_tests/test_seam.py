"""The lease check, layer by layer: the backend seam on its own, the facade on its own.

Both the facade (``Message``) and each backend (``Receiver``) refuse to settle a lost
lease; either check alone hides the other's absence from the public API. These tests
take each layer alone: the backend through the seam a backend author implements
(``brokerkit.backends.base``), and the facade over a backend that never checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any

import pytest

import brokerkit
from brokerkit.backends import (
    Backend,
    Delivery,
    PublishCopy,
    QueueRef,
    Receiver,
    ReceiverSettings,
)
from brokerkit.testing import ForwardingReceiver

from ._helpers import (
    WAIT,
    absence_window,
    eventually,
    lease_for,
    nothing_within,
    receive_n,
    redelivery_deadline,
)
from ._wrap import wrapped

LEASE = 1.0
"""The lease the tests were written with; ``lease_for`` sizes it to the broker."""


async def _subscribe(backend: Backend, queue: str, group: str, lease: float) -> Receiver[Any]:
    settings = ReceiverSettings(ack_timeout=lease)
    return await backend.subscribe(QueueRef(queue), group, settings)


async def _first(
    receivers: Sequence[Receiver[Any]], timeout: float
) -> tuple[Receiver[Any], Delivery[Any]]:
    """The first delivery any of ``receivers`` leases (in the order given), and which one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for receiver in receivers:
            got = await receiver.receive(1, 0.2 if receiver is receivers[0] else 0.0)
            if got:
                assert len(got) == 1
                return receiver, got[0]
    raise AssertionError(f"no delivery through the seam within {timeout:.1f}s")


@pytest.mark.behaviour("lease expiry")
async def test_seam_receiver_refuses_a_stale_settle_after_redelivery(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """Receiver.ack of a lost lease raises LeaseExpired once the message was redelivered.

    Two receivers of one group; the first one's lease runs out and the message goes
    to one of them again. A stale ack of the first delivery must not settle the live
    one (lease tokens must not repeat across receivers).
    """
    await broker.publish(queue, b"stale")
    backend = broker.backend
    lease = lease_for(broker, LEASE)
    first = await _subscribe(backend, queue, group, lease)
    second = await _subscribe(backend, queue, group, lease)
    try:
        # which receiver of a group gets a message is the broker's choice (a Kafka partition)
        owner, stale = await _first((first, second), WAIT)
        other = second if owner is first else first
        holder, live = await _first((other, owner), redelivery_deadline(broker, lease))
        assert (live.id, live.attempt) == (stale.id, 2)
        with pytest.raises(brokerkit.LeaseExpired):
            await owner.ack(stale)
        await holder.ack(live)  # the stale ack settled nothing: the live lease still holds
    finally:
        await first.aclose()
        await second.aclose()
    async with broker.consumer(queue, group, ack_timeout=lease) as consumer:
        again = await nothing_within(consumer, absence_window(broker, lease))
        assert again is None, f"acked through the seam, delivered again: {again!r}"


class _LaxReceiver(ForwardingReceiver):
    """Never says LeaseExpired: the facade alone must notice a lost lease."""

    async def ack(self, delivery: Delivery[Any]) -> None:
        with contextlib.suppress(brokerkit.LeaseExpired):
            await self.inner.ack(delivery)

    async def nack(self, delivery: Delivery[Any], delay: float) -> None:
        with contextlib.suppress(brokerkit.LeaseExpired):
            await self.inner.nack(delivery, delay)

    async def dead_letter(
        self, delivery: Delivery[Any], copy: brokerkit.Outgoing, publish: PublishCopy
    ) -> None:
        with contextlib.suppress(brokerkit.LeaseExpired):
            await self.inner.dead_letter(delivery, copy, publish)

    async def extend(self, delivery: Delivery[Any], ack_timeout: float) -> None:
        with contextlib.suppress(brokerkit.LeaseExpired):
            await self.inner.extend(delivery, ack_timeout)


class _SlowReplyReceiver(ForwardingReceiver):
    """Its receive leases, then waits for the reply: exactly as cancellation-safe as the
    seam demands (a cancel after the lease loses the batch until the lease ends)."""

    async def receive(self, max_messages: int, wait: float) -> list[Delivery[Any]]:
        got = await self.inner.receive(max_messages, wait)
        if got:
            await asyncio.sleep(0.005)  # the broker leased them; the reply is on its way
        return got


@pytest.mark.behaviour("lease expiry")
async def test_seam_facade_refuses_a_settle_after_the_lease_even_if_the_backend_would_not(
    broker_url: str, queue: str, group: str
) -> None:
    async with wrapped(broker_url, _LaxReceiver) as lax:
        settles = ("ack", "nack", "dead_letter", "extend")
        await lax.publish_many(queue, [brokerkit.Outgoing(s.encode()) for s in settles])
        lease = lease_for(lax, LEASE)
        async with lax.consumer(queue, group, ack_timeout=lease, close_timeout=0) as consumer:
            # one message per kind of settle, held at once: their leases run out together
            held = await receive_n(consumer, len(settles), ack=False)
            received = time.monotonic()
            await eventually(
                lambda: time.monotonic() > received + lease + 0.1, what="the leases to end"
            )
            for msg in held:
                with pytest.raises(brokerkit.LeaseExpired):
                    if msg.body == b"dead_letter":
                        await msg.dead_letter("late")
                    else:
                        await getattr(msg, msg.body.decode())()
            # nothing was settled: each comes back
            again = await receive_n(consumer, len(settles), timeout=redelivery_deadline(lax, lease))
            assert sorted(m.body for m in again) == sorted(s.encode() for s in settles)


@pytest.mark.behaviour("ack")
async def test_seam_facade_keeps_what_a_cancelled_fetch_leased(
    broker_url: str, queue: str, group: str
) -> None:
    """Cancelling ``__anext__`` loses nothing even over a receive that leases, then awaits.

    The seam lets a cancelled ``receive`` lose its batch until the lease ends; the
    facade must not cancel a fetch that may have leased (60 s leases here: a lost batch
    would come back far beyond the deadline, with attempt 2).
    """
    count = 20
    got: list[brokerkit.Message] = []
    async with wrapped(broker_url, _SlowReplyReceiver) as slow:
        await slow.publish_many(queue, [brokerkit.Outgoing(f"s{i}".encode()) for i in range(count)])
        async with slow.consumer(queue, group, prefetch=4, ack_timeout=60.0) as consumer:
            deadline = time.monotonic() + WAIT
            turns = 0
            while len(got) < count:
                assert time.monotonic() < deadline, f"{len(got)} of {count}: a batch was lost"
                task = asyncio.ensure_future(consumer.__anext__())
                await asyncio.sleep(0.002 if turns % 2 else 0)  # inside the reply, or before
                turns += 1
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    got.append(await task)
                if turns % 3 == 0:
                    msg = await nothing_within(consumer, 0.5)
                    if msg is not None:
                        got.append(msg)
            for msg in got:
                await msg.ack()
    assert sorted(m.body for m in got) == sorted(f"s{i}".encode() for i in range(count))
    assert all(m.attempt == 1 for m in got), "a batch came back only after its lease"
