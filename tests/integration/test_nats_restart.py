"""NATS JetStream with file storage: a consumer rides out a server restart.

The test runs its OWN throwaway nats-server (the binary scripts/services installs
under ``.services/cache``, see ``_process.nats_server_binary``; none fails the test)
on a free port with a temporary store directory, and restarts that process
(SIGTERM, wait for the exit, start again on the same port and store) while a
consumer is open and iterating. It never touches the shared server on 4222.

Acks use ``?confirm_acks=true``: ``ack()`` returns only once the server replied
to it (``ack_sync``), so "acked before the restart" is a fact the server knows,
not a pipelined ack still in a socket buffer; a graceful stop (SIGTERM) writes
the consumer state to the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _process import nats_server_binary, required, terminate

import brokerkit

NATS_SERVER = nats_server_binary()
READY_TIMEOUT = 60.0  # JetStream recovery on a loaded 2-core machine
STOP_TIMEOUT = 60.0  # graceful stop writes the store; SIGKILL only as a last resort
ACK_TIMEOUT = 4.0
DEADLINE = 90.0  # overall wait for every expected delivery after the restart


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class NatsProcess:
    """One nats-server process with JetStream; ``restart`` keeps its port and store."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.store = workdir / "store"
        self.port = _free_port()
        self.starts = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.starts += 1
        log = self.workdir / f"server-{self.starts}.log"
        argv = [self.binary, "-js", "-sd", str(self.store), "-a", "127.0.0.1", "-p", str(self.port)]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while "Server is ready" not in log.read_text(errors="replace"):
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited early:\n{log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"nats-server not ready in {READY_TIMEOUT}s")
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        terminate(proc, STOP_TIMEOUT)

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsProcess]:
    try:
        import nats  # noqa: F401  (the backend's driver)
    except ModuleNotFoundError:
        pytest.fail("nats-py is not installed (pip install 'brokerkit-mq[nats]')", pytrace=False)
    binary = required(NATS_SERVER, "no nats-server (scripts/services up nats installs it)")
    server = NatsProcess(binary, tmp_path)
    try:
        server.start()
        yield server
    finally:
        server.kill()  # always: even if start() or the test failed


@dataclass
class Seen:
    """What the iterating consumer saw, in order."""

    deliveries: list[tuple[bytes, str, int]] = field(default_factory=list)  # body, id, attempt
    acked: set[bytes] = field(default_factory=set)
    ack_errors: list[BaseException] = field(default_factory=list)


async def _wait_for(condition: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {condition}")
        await asyncio.sleep(0.05)


async def _publish_retrying(broker: brokerkit.Broker, queue: str, body: bytes) -> None:
    """Publish right after the restart: retry while reconnecting, dedup_id makes it idempotent."""
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            await broker.publish(queue, body, dedup_id=body.decode())
            return
        except brokerkit.BrokerUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _iterate(consumer: brokerkit.Consumer, seen: Seen) -> None:
    async for msg in consumer:
        seen.deliveries.append((msg.body, msg.id, msg.attempt))
        try:
            await msg.ack()
        except (brokerkit.BrokerUnavailable, brokerkit.LeaseExpired) as exc:
            seen.ack_errors.append(exc)  # not known acked: a redelivery is allowed
        else:
            seen.acked.add(msg.body)


async def test_file_storage_consumer_survives_a_server_restart(nats_server: NatsProcess) -> None:
    url = f"{nats_server.url}?confirm_acks=true&reconnect_wait=0.2&request_timeout=3"
    queue, group = "restart-q", "restart-g"
    async with brokerkit.connect(url) as broker:
        before = [f"before-{i}".encode() for i in range(6)]
        results = await broker.publish_many(queue, [brokerkit.Outgoing(b) for b in before])
        assert len(results) == len(before)

        seen = Seen()
        async with broker.consumer(queue, group, ack_timeout=ACK_TIMEOUT) as consumer:
            # settle part by hand: four acked (confirmed), one held unsettled over the restart
            acked_by_hand: set[bytes] = set()
            for _ in range(4):
                msg = await asyncio.wait_for(consumer.__anext__(), 30)
                await msg.ack()
                acked_by_hand.add(msg.body)
            held = await asyncio.wait_for(consumer.__anext__(), 30)
            assert held.attempt == 1 and held.body not in acked_by_hand

            # the rest goes to an iterating task, which stays inside the consumer meanwhile
            more = [f"more-{i}".encode() for i in range(6)]
            await broker.publish_many(queue, [brokerkit.Outgoing(b) for b in more])
            iterator = asyncio.create_task(_iterate(consumer, seen))
            try:
                await _wait_for(
                    "the iterator is in the consumer",
                    lambda: bool(seen.deliveries) or iterator.done(),
                    30,
                )
                acked_before_restart = acked_by_hand | set(seen.acked)
                seen_before_restart = len(seen.deliveries)

                await asyncio.to_thread(nats_server.restart)

                after = [f"after-{i}".encode() for i in range(3)]
                for body in after:
                    await _publish_retrying(broker, queue, body)

                everything = set(before) | set(more) | set(after)
                await _wait_for(
                    "every published message delivered and the held one back",
                    lambda: (
                        iterator.done()
                        or (
                            acked_by_hand | {b for b, _, _ in seen.deliveries} >= everything
                            and any(b == held.body for b, _, _ in seen.deliveries)
                            and set(after) <= seen.acked
                        )
                    ),
                    DEADLINE,
                )
                assert not iterator.done(), f"the iterating consumer stopped: {iterator!r}"
            finally:
                iterator.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await iterator

            # nothing acked before the restart came back after it
            after_restart = [b for b, _, _ in seen.deliveries[seen_before_restart:]]
            assert not acked_before_restart & set(after_restart), acked_before_restart & set(
                after_restart
            )
            # the unsettled one came back: same message, a later attempt
            again = [(i, a) for b, i, a in seen.deliveries if b == held.body]
            assert again and all(i == held.id and a >= 2 for i, a in again), again
            # nothing lost: each published message was delivered (acked by hand or seen)
            delivered = acked_by_hand | {b for b, _, _ in seen.deliveries}
            assert delivered >= everything
            assert set(after) <= seen.acked  # publish + receive + ack work after the restart
