"""A NATS connection keeps reading after a PING whose ``flush`` gave up (``_link.py``).

nats-py 2.16 leaves the future of a timed-out ``flush`` queued, cancelled; when the PONG
comes after all, its read loop dies on it and the connection stays up deaf. An ack during
a network cut waits for such a PING (``NatsReceiver.flush_acks``), so after the restore
the consumer sent pull requests and read none of their deliveries (issue 16, 20 s cuts).

The path to the shared test server (``BROKERKIT_NATS_URL``, default
nats://127.0.0.1:4222) goes through the suite's TCP proxy: cut (bytes held, nothing
closed), then restored. Skipped when no server answers there.
"""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

import brokerkit
from brokerkit.backends import QueueRef, ReceiverSettings
from brokerkit.backends.nats import NatsBackend
from contract_tests._proxy import through_proxy

URL = os.environ.get("BROKERKIT_NATS_URL", "nats://127.0.0.1:4222")


async def test_a_ping_that_timed_out_in_a_cut_leaves_the_connection_reading() -> None:
    queue = QueueRef(f"t-pong-{uuid.uuid4().hex[:10]}")
    path = through_proxy(URL)
    backend = NatsBackend.from_url(brokerkit.BrokerURL.parse(path.url + "?request_timeout=1"))
    try:
        try:
            await backend.open()
        except brokerkit.BrokerUnavailable:
            pytest.skip("no NATS server at the test URL")
        receiver = await backend.subscribe(queue, "g", ReceiverSettings(30.0))
        path.cut()
        with pytest.raises(brokerkit.BrokerUnavailable):
            await receiver.flush_acks()  # its PING waits in the cut path
        path.restore()  # the PONG comes now, after its flush gave up
        await backend.publish(queue, [brokerkit.Outgoing(b"after the cut")])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20.0
        got: list[bytes] = []
        while not got and loop.time() < deadline:
            got = [d.body for d in await receiver.receive(1, 1.0)]
        assert got == [b"after the cut"]
        await receiver.aclose()
        await backend.delete_queue(queue.name)
    finally:
        await backend.aclose()
        path.close()
