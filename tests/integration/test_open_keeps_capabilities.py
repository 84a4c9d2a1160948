"""Capabilities are fixed at construction: opening a connection never replaces them.

What a backend learns from the server at open (its version, NATS's ``max_payload``) is
kept on the backend; a NATS server that takes less than ``max_message_bytes`` makes
``publish`` refuse a too-large body with MessageTooLarge before sending anything. The
shared brokers (``BROKERKIT_REDIS_URL`` / ``BROKERKIT_NATS_URL``) are only read and
written under fresh queue names; the small-``max_payload`` NATS server is a throwaway
one of this test, on the nats-server ``scripts/services`` installed. Both are mandatory:
a broker that does not answer or a missing nats-server fails the test, never skips it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _process import nats_server_binary, required, terminate

import brokerkit

REDIS_URL = os.environ.get("BROKERKIT_REDIS_URL", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("BROKERKIT_NATS_URL", "nats://127.0.0.1:4222")
MAX_PAYLOAD = 400 * 1024
HEADER_ROOM = 64 * 1024  # what the NATS backend keeps of max_payload for headers


@pytest.mark.parametrize("url", [REDIS_URL, NATS_URL])
async def test_open_does_not_replace_capabilities(url: str) -> None:
    before = brokerkit.connect(url).capabilities
    broker = brokerkit.connect(url)
    caps = broker.capabilities
    try:
        queue = f"caps-{uuid.uuid4().hex[:10]}"
        try:
            await broker.publish(queue, b"opens the connection")
        except brokerkit.BrokerUnavailable:
            pytest.fail(f"no broker at {brokerkit.BrokerURL.parse(url).redacted()}", pytrace=False)
        assert broker.capabilities is caps and broker.backend.capabilities is caps
        assert caps == before  # the same as an unopened backend's
        version = getattr(broker.backend, "server_version", None)
        assert version, "open() reads the server version onto the backend"
        await broker.delete_queue(queue)
    finally:
        await broker.aclose()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def small_nats(tmp_path: Path) -> Iterator[str]:
    nats_server = required(nats_server_binary(), "no nats-server (scripts/services up nats)")
    port = _free_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f"host: 127.0.0.1\nport: {port}\nmax_payload: {MAX_PAYLOAD}\n"
        f'jetstream {{ store_dir: "{tmp_path / "store"}" }}\n'
    )
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [nats_server, "-c", str(conf)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 60
        while "Server is ready" not in log.read_text(errors="replace"):
            assert proc.poll() is None, f"nats-server exited:\n{log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "nats-server not ready in 60 s"
            time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        terminate(proc, 20)


async def test_a_smaller_nats_server_refuses_large_bodies_before_sending(small_nats: str) -> None:
    room = MAX_PAYLOAD - HEADER_ROOM
    broker = brokerkit.connect(small_nats)
    caps = broker.capabilities
    assert caps.max_message_bytes > room  # the option's default, stated before connecting
    queue = f"caps-{uuid.uuid4().hex[:10]}"
    try:
        await broker.publish(queue, b"x" * room)  # the largest body this server takes
        assert broker.capabilities is caps and caps.max_message_bytes > room
        assert getattr(broker.backend, "max_payload", None) == MAX_PAYLOAD
        small, big = brokerkit.Outgoing(b"small"), brokerkit.Outgoing(b"x" * (room + 1))
        with pytest.raises(brokerkit.MessageTooLarge, match=str(room)):
            await broker.publish_many(queue, [small, big])
        # nothing of the refused call was sent: only the first message is in the queue
        async with broker.consumer(queue, "g", ack_timeout=5) as consumer:
            first = await asyncio.wait_for(consumer.__anext__(), 10)
            assert len(first.body) == room
            await first.ack()
            async with brokerkit.connect(small_nats) as other:
                await other.publish(queue, b"marker")
            following = await asyncio.wait_for(consumer.__anext__(), 10)
            assert following.body == b"marker"  # not b"small"
            await following.ack()
        await broker.delete_queue(queue)
    finally:
        await broker.aclose()
