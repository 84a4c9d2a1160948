"""A redis:// consumer survives a Redis restart (its own throwaway redis-server, AOF on).

The server runs with ``--appendonly yes`` in a temporary dir, so the stream, the group's
PEL and the lease ZSET survive the restart. The test checks, with polling deadlines:

* a consumer that is iterating while the server goes away keeps working (reconnects);
* it receives messages published after the restart;
* nothing acked before the restart is delivered again;
* the message it held unsettled across the restart comes back (attempt 2) once its lease
  ran out, and nothing confirmed is lost.

Fails (with the reason) when there is no ``redis-server`` (scripts/services installs
Debian's): a mandatory test that cannot run is a failure, not a skip.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from _process import redis_server_binary, required, terminate

import brokerkit

REDIS_SERVER = redis_server_binary()

ACK_TIMEOUT = 2.0
DOWN_FOR = 3.0  # seconds the server stays down


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One redis-server process on a fixed port and dir; restartable."""

    def __init__(self, port: int, workdir: Path) -> None:
        self.port = port
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert REDIS_SERVER is not None
        self.proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "yes",
                "--dir", str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGTERM (Redis flushes and fsyncs the AOF on shutdown), SIGKILL if it hangs."""
        proc, self.proc = self.proc, None
        terminate(proc, 10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    required(REDIS_SERVER, "no redis-server (scripts/services up redis installs Debian's)")
    srv = Server(free_port(), tmp_path)
    srv.start()
    try:
        yield srv
    finally:
        if srv.proc is not None:
            srv.proc.kill()
            srv.proc.wait(timeout=10)


async def until(
    what: str,
    condition: Callable[[], Awaitable[bool]],
    timeout: float,
    errors: list[BaseException] | None = None,
) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if errors:
            raise AssertionError(f"the iterator raised {errors[0]!r} while waiting for: {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        await asyncio.sleep(0.05)


async def test_consumer_survives_a_redis_restart(server: Server) -> None:
    url = f"redis://127.0.0.1:{server.port}/0"
    queue = f"restart-{uuid.uuid4().hex[:8]}"
    raw = aioredis.Redis(port=server.port)
    stream = f"brokerkit:{{{queue}}}:s"

    async def pending() -> int:
        try:
            summary = await raw.xpending(stream, "g")
        except (aioredis.ConnectionError, OSError):
            return -1
        return int(summary["pending"])

    async with brokerkit.connect(url) as broker:
        await broker.publish_many(queue, [brokerkit.Outgoing(b"m%d" % i) for i in range(10)])

        # 1. a first consumer acks m0..m4 and closes: closing flushes the coalesced acks
        acked_before: set[bytes] = set()
        async with broker.consumer(queue, "g", prefetch=1, ack_timeout=ACK_TIMEOUT) as first:
            async for msg in first:
                await msg.ack()
                acked_before.add(msg.body)
                if len(acked_before) == 5:
                    break
        assert acked_before == {b"m%d" % i for i in range(5)}
        await until("the first consumer's acks recorded", lambda: _eq(pending, 0), 5)

        # 2. a second consumer holds m5 unsettled and keeps iterating (acking the rest)
        seen: list[tuple[bytes, int]] = []
        consumer = broker.consumer(queue, "g", prefetch=1, ack_timeout=ACK_TIMEOUT)
        await consumer.open()
        held = await asyncio.wait_for(consumer.__anext__(), 5)
        assert held.body == b"m5" and held.attempt == 1
        errors: list[BaseException] = []

        async def iterate() -> None:
            try:
                async for msg in consumer:
                    seen.append((msg.body, msg.attempt))
                    await msg.ack()
            except BaseException as exc:  # surfaced below, with the test's own message
                errors.append(exc)
                raise

        task = asyncio.ensure_future(iterate())
        try:
            before = {b"m%d" % i for i in range(6, 10)}
            await until("m6..m9 received", lambda: _has(seen, before), 10, errors)
            # acks of m6..m9 reached Redis: only the held m5 is still pending
            await until("only m5 pending before the restart", lambda: _eq(pending, 1), 5, errors)
            received_before = len(seen)

            # 3. restart while the consumer is blocked in receive
            server.stop()
            await asyncio.sleep(DOWN_FOR)
            server.start()

            # 4. messages published after the restart arrive; m5 comes back after its lease
            after = [brokerkit.Outgoing(b"n%d" % i) for i in range(5)]
            await broker.publish_many(queue, after)
            want_after = {b"n%d" % i for i in range(5)}
            await until(
                "messages published after the restart", lambda: _has(seen, want_after), 15, errors
            )
            await until(
                "the unsettled m5 redelivered",
                lambda: _has(seen, {b"m5"}),
                ACK_TIMEOUT + broker.capabilities.redelivery_slack + 10,
                errors,
            )
            await until("everything acked: nothing pending", lambda: _eq(pending, 0), 10, errors)
            assert not errors, f"the iterator raised {errors[0]!r}"
        finally:
            await consumer.aclose()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, brokerkit.BrokerkitError):
                await task
        assert not errors, f"the iterator raised {errors[0]!r}"

        bodies = [body for body, _ in seen]
        # nothing acked before the restart came again, and nothing after it twice
        assert not acked_before & set(bodies)
        assert len(seen) >= received_before
        for body in bodies:
            assert bodies.count(body) == 1, f"{body!r} delivered {bodies.count(body)} times"
        assert dict(seen)[b"m5"] >= 2  # the held one counted its first, unsettled delivery
        assert set(bodies) == {b"m%d" % i for i in range(5, 10)} | want_after

        # a fresh consumer finds nothing left (no loss, no stray redelivery)
        async with broker.consumer(queue, "g", ack_timeout=ACK_TIMEOUT) as last:
            with contextlib.suppress(TimeoutError):
                extra = await asyncio.wait_for(last.__anext__(), 1.5)
                raise AssertionError(f"unexpected redelivery of {extra.body!r}")
    await raw.aclose()


async def _eq(probe: Callable[[], Awaitable[int]], value: int) -> bool:
    return await probe() == value


async def _has(seen: list[tuple[bytes, int]], bodies: set[bytes]) -> bool:
    return bodies <= {body for body, _ in seen}
