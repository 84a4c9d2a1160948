"""An amqp:// consumer rides out a *graceful* RabbitMQ restart (its own node, other ports).

The suite's broker restart behaviour (``contract_tests/test_faults_restart.py``, run by
``scripts/fault-check``) kills the broker with SIGKILL: the client sees its socket drop.
A graceful stop takes another path, an AMQP one: the node first sends
``connection.close`` (320 CONNECTION_FORCED) on every connection, which aio-pika reports
as a closed connection, not as a broken socket. This test covers that path.

The test runs its OWN RabbitMQ node (the Debian ``rabbitmq-server`` that scripts/services
uses) under a node name, AMQP port, distribution port and data directory of its own,
registered with the epmd already on 127.0.0.1:4369 (scripts/services starts it), and
restarts that node (SIGTERM to its process group, wait for the exit, start again on the
same port and data) while a consumer is open and iterating. It never touches the shared
node on 5672. The test checks, with polling deadlines:

* every publish that returned before the restart is delivered after it (quorum queues
  are durable; nothing confirmed is lost);
* the consumer that was iterating keeps working by itself (reconnects, subscribes anew);
* a publish started while the node is down returns after the restart (and its message
  is delivered) or raises BrokerUnavailable after the bounded retry: it never hangs;
* the delivery it held unsettled across the restart comes back, attempt counted;
* nothing acked before the restart is delivered again, nothing after it twice.

Skipped (with the reason) when the rabbitmq-server scripts are not installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio

import brokerkit

pytest.importorskip("aiormq", reason="aio-pika is not installed (brokerkit-mq[rabbitmq])")

from _process import required
from _rabbit_node import RABBIT_BIN, RabbitNode


@pytest.fixture(autouse=True)
def _rabbitmq_server() -> None:
    """Mandatory: without the rabbitmq-server scripts/services installs, fail (never skip)."""
    found = RABBIT_BIN / "rabbitmq-server"
    required(str(found) if found.exists() else None, f"no {found} (scripts/services up rabbitmq)")


ACK_TIMEOUT = 3.0
DOWN_FOR = 2.0
DEADLINE = 90.0


@pytest_asyncio.fixture
async def node(tmp_path: Path) -> AsyncIterator[RabbitNode]:
    n = RabbitNode(tmp_path)
    n.start()
    try:
        await n.ready()
        yield n
    finally:
        n.stop()


async def until(
    what: str,
    condition: Callable[[], Awaitable[bool] | bool],
    timeout: float,
    errors: list[BaseException],
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if errors:
            raise AssertionError(f"the iterator raised {errors[0]!r} while waiting for: {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        await asyncio.sleep(0.05)


async def test_consumer_rides_out_a_rabbitmq_restart(node: RabbitNode) -> None:
    queue = f"restart-{uuid.uuid4().hex[:8]}"
    stored = f"stored-{uuid.uuid4().hex[:8]}"
    errors: list[BaseException] = []
    async with brokerkit.connect(node.url) as broker:
        await broker.publish_many(queue, [brokerkit.Outgoing(b"m%d" % i) for i in range(10)])
        confirmed = [brokerkit.Outgoing(b"s%d" % i, fifo_group=f"g{i % 3}") for i in range(60)]
        await broker.publish_many(stored, confirmed)  # returned: confirmed by the broker

        # 1. a first consumer acks m0..m4 and closes (closing the channel after the acks)
        acked_before: set[bytes] = set()
        async with broker.consumer(queue, "g", prefetch=1, ack_timeout=ACK_TIMEOUT) as first:
            async for msg in first:
                await msg.ack()
                acked_before.add(msg.body)
                if len(acked_before) == 5:
                    break

        # 2. a second consumer holds one message unsettled and acks the rest
        seen: list[tuple[bytes, int]] = []
        consumer = broker.consumer(queue, "g", prefetch=1, ack_timeout=ACK_TIMEOUT)
        await consumer.open()
        held = await asyncio.wait_for(consumer.__anext__(), 10)
        assert held.body not in acked_before
        # (attempt may be 2: the first consumer had it fetched ahead, and RabbitMQ up to 4.2
        # counts every return, even the uncounted-from-4.3 basic.nack of a release)

        async def iterate() -> None:
            try:
                async for msg in consumer:
                    seen.append((msg.body, msg.attempt))
                    await msg.ack()
            except BaseException as exc:
                errors.append(exc)
                raise

        task = asyncio.ensure_future(iterate())
        try:
            rest = {b"m%d" % i for i in range(5, 10)} - {held.body}
            await until("the other four received", lambda: rest <= {b for b, _ in seen}, 15, errors)

            # 3. restart the node while the consumer is blocked in receive
            node.stop()
            # a publish during the outage: returns after recovery or raises
            # BrokerUnavailable after the bounded retry; never hangs, never lies
            during = asyncio.ensure_future(broker.publish(queue, b"during"))
            await asyncio.sleep(DOWN_FOR)
            node.start()
            await node.ready()
            try:
                await asyncio.wait_for(during, 60)
                published_during = {b"during"}
            except brokerkit.BrokerUnavailable:
                published_during = set()

            # 4. publishes after the restart arrive; the held one comes back, counted
            after = [brokerkit.Outgoing(b"n%d" % i) for i in range(5)]
            await broker.publish_many(queue, after)
            want = {b"n%d" % i for i in range(5)} | {held.body} | published_during
            await until(
                "post-restart messages and the held one",
                lambda: want <= {b for b, _ in seen},
                DEADLINE,
                errors,
            )
        finally:
            await consumer.aclose()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, brokerkit.BrokerkitError):
                await task
        assert not errors, f"the iterator raised {errors[0]!r}"
        with pytest.raises(brokerkit.LeaseExpired):
            await held.ack()  # its receipt belonged to the connection that died

        bodies = [b for b, _ in seen]
        assert not acked_before & set(bodies), "a message acked before the restart came again"
        for body in bodies:
            assert bodies.count(body) == 1, f"{body!r} delivered {bodies.count(body)} times"
        assert dict(seen)[held.body] > held.attempt  # the unsettled delivery was counted
        expected = {b"m%d" % i for i in range(5, 10)} | {b"n%d" % i for i in range(5)}
        assert set(bodies) == expected | published_during

        # 5. every confirmed publish survived, each group still in order
        got: list[brokerkit.Message] = []
        async with broker.consumer(stored, "g") as reader:
            while len(got) < len(confirmed):
                msg = await asyncio.wait_for(reader.__anext__(), 20)
                await msg.ack()
                got.append(msg)
        assert sorted(m.body for m in got) == sorted(m.body for m in confirmed)
        for g in ("g0", "g1", "g2"):
            order = [m.body for m in got if m.fifo_group == g]
            assert order == [m.body for m in confirmed if m.fifo_group == g]
