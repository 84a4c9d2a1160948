"""The NATS receiver's pull engine, through the Receiver API, on the shared test server
(``BROKERKIT_NATS_URL``, default nats://127.0.0.1:4222; skipped when none answers there).
"""

from __future__ import annotations

import uuid
from typing import Any

from _nats import nats_backend  # noqa: F401  (the fixture ``backend``)

import brokerkit
from brokerkit.backends import QueueRef, ReceiverSettings
from brokerkit.backends.nats import NatsBackend

PULL = "$JS.API.CONSUMER.MSG.NEXT."


async def test_a_zero_wait_receive_takes_one_look_on_an_idle_queue(backend: NatsBackend) -> None:
    """``receive(n, 0)`` (the consumer's read-ahead) looks once and returns: at most one
    pull request per durable (the group's and one per partition: 33 by default).

    Before: every pull-request status that landed during the 50 ms look started the look
    again, and with 33 durables they landed more often than that: on an idle queue one
    read-ahead kept pulling for up to 7 s (200 looks, 2026-12-03). A last attempt waits
    for the read-ahead before it goes out alone, and its lease ran out meanwhile: it went
    to the DLQ without its last try (CI, the crash behaviour on NATS)."""
    queue = QueueRef(f"t-look-{uuid.uuid4().hex[:10]}")
    nc = backend.link.client
    sent: list[str] = []
    publish = nc.publish

    async def counted(subject: str, *args: Any, **kwargs: Any) -> None:
        if subject.startswith(PULL):
            sent.append(subject)
        await publish(subject, *args, **kwargs)

    try:
        r = await backend.subscribe(queue, "g", ReceiverSettings(30.0))
        durables = backend.options.partitions + 1
        nc.publish = counted  # type: ignore[method-assign]
        try:
            worst = 0
            for _ in range(150):
                sent.clear()
                assert await r.receive(32, 0.0) == []
                worst = max(worst, len(sent))
        finally:
            del nc.publish
        await r.aclose()
        assert worst <= durables, f"one zero-wait receive sent {worst} pull requests"
    finally:
        await backend.delete_queue(queue.name)


async def test_a_release_after_the_server_redelivered_sends_no_third_copy(
    backend: NatsBackend,
) -> None:
    """A delivery given back after its lease ran out is not ``-NAK``ed: the server has
    sent the message again already, and a ``-NAK`` for the older delivery made it send the
    newer one once more, to a second holder (after a 20 s cut both copies were handed out
    and acked: an acked message came back)."""
    queue = QueueRef(f"t-late-nak-{uuid.uuid4().hex[:10]}")
    lease = 1.0
    try:
        r = await backend.subscribe(queue, "g", ReceiverSettings(lease))
        await backend.publish(queue, [brokerkit.Outgoing(b"m")])
        first = await r.receive(1, 5.0)
        assert [d.body for d in first] == [b"m"]
        again = await r.receive(1, lease + 5.0)  # its lease ran out: the server sends it again
        assert [(d.body, d.extras["consumer_sequence"] > 1) for d in again] == [(b"m", True)]
        await r.release(first)  # the older delivery, lease over
        third = await r.receive(1, lease * 0.7)  # before the newer one's own lease ends
        assert third == [], "the release of an expired delivery made the server send it again"
        await r.ack(again[0])
        await r.aclose()
    finally:
        await backend.delete_queue(queue.name)
