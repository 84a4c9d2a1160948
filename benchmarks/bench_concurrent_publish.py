"""Concurrent single publishes against publish_many, on any URL (issue: throughput where
services feel it).

    python benchmarks/bench_concurrent_publish.py URL [--messages 20000] [--rounds 5]
        [--concurrency 500] [--size 100]

Per round, interleaved: ``publish_many`` in batches of 500 (one caller), then
``--concurrency`` tasks each making single ``await broker.publish()`` calls one after
the other, then one task making single calls (the latency a lone caller sees), each on
a queue of its own (see ``_queue``; deleted outside the clock). Every publish is
broker-confirmed.
Prints medians and each round's figures, the ratio of concurrent single publishes to
``publish_many``, and how many calls raised (must be 0).

``--ceiling`` adds a contender after the singles: the same callers, each awaiting a
future of its own, gathered by the least a gatherer can do (``_BareGatherer``: a list,
one ``call_soon`` per turn, batches of 250, 4 in flight, like the core's coalescer) and
sent with the backend's own ``publish`` (``broker.backend``), one prebuilt message
repeated: no message built, no validation, no ``Broker.publish`` frame, no cancellation
or FIFO care. What any design that gives each caller its own awaitable cannot beat on
this backend and machine. Its ratio to ``publish_many`` is the ceiling of
the singles' ratio; singles/ceiling is the share of it the core reaches.

``--direct`` adds the other floor: the same callers, each building and validating its
message exactly as ``Broker.publish`` does and awaiting the backend's own ``publish`` of
that one message (``_direct_publish``): no coalescer, no ``Broker.publish`` frame. On
memory://, whose publish never suspends (so nothing is ever gathered there), no
``publish()`` that builds and validates its message can beat it. Elsewhere it is one
backend call per message at once, the design the coalescer replaced (on Redis 500 of
them once ran the connection pool out): a round that raises is counted, not fatal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable

import brokerkit
from brokerkit._bench import (
    callers_rate,
    concurrent_publish_rate,
    publish_rate,
    round_line,
    summary,
)
from brokerkit._coalesce import MAX_BATCH, MAX_IN_FLIGHT
from brokerkit._message import outgoing
from brokerkit._validate import check_outgoing
from brokerkit.backends.base import Backend, QueueRef


class _BareGatherer:
    """The floor of gathering: a future per call, batches sent with the backend's publish.

    Not a library candidate (no cancellation, no FIFO order across batches, no lone
    fast path); the benchmark's measure of what asyncio's wake-up of each caller costs.
    """

    def __init__(self, backend: Backend, queue: str, body: bytes) -> None:
        self._backend = backend
        self._queue = QueueRef(queue)
        self._message = brokerkit.Outgoing(body)
        self._pending: list[asyncio.Future[brokerkit.PublishResult]] = []
        self._in_flight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    def publish(self) -> asyncio.Future[brokerkit.PublishResult]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[brokerkit.PublishResult] = loop.create_future()
        self._pending.append(future)
        if not self._scheduled and self._in_flight < MAX_IN_FLIGHT:
            self._scheduled = True
            loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self._scheduled = False
        while self._pending and self._in_flight < MAX_IN_FLIGHT:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            self._in_flight += 1
            task = asyncio.ensure_future(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[asyncio.Future[brokerkit.PublishResult]]) -> None:
        try:
            results = await self._backend.publish(self._queue, [self._message] * len(batch))
            for future, result in zip(batch, results, strict=True):
                future.set_result(result)
        except Exception as exc:
            for future in batch:
                future.set_exception(exc)
        finally:
            self._in_flight -= 1
            if self._pending and not self._scheduled:
                self._scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)


async def ceiling_rate(
    broker: brokerkit.Broker, queue: str, count: int, body: bytes, *, concurrency: int
) -> float:
    """``concurrent_publish_rate`` through ``_BareGatherer`` instead of ``broker.publish``."""
    await broker.open()
    gatherer = _BareGatherer(broker.backend, queue, body)

    async def caller(n: int) -> None:
        for _ in range(n):
            await gatherer.publish()

    return await callers_rate(count, concurrency, caller)


async def direct_rate(
    broker: brokerkit.Broker, queue: str, count: int, body: bytes, *, concurrency: int
) -> float:
    """``concurrent_publish_rate`` with each call made by ``_direct_publish``."""
    await broker.open()
    backend = broker.backend
    ref = QueueRef(queue)

    async def caller(n: int) -> None:
        for _ in range(n):
            await _direct_publish(backend, ref, body)

    return await callers_rate(count, concurrency, caller)


def _direct_publish(
    backend: Backend, queue: QueueRef, body: bytes
) -> Awaitable[list[brokerkit.PublishResult]]:
    """One message built and validated as ``Broker.publish`` does, sent alone."""
    caps = backend.capabilities
    message = check_outgoing(
        outgoing(body, None, None, {}),
        max_bytes=caps.max_message_bytes,
        max_headers=caps.max_headers,
        max_header_bytes=caps.max_header_bytes,
    )
    return backend.publish(queue, (message,))


async def sequential_latency(
    broker: brokerkit.Broker, queue: str, count: int, body: bytes
) -> float:
    """Median microseconds of one awaited publish with nothing else in flight."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        await broker.publish(queue, body)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


@contextlib.asynccontextmanager
async def _queue(
    broker: brokerkit.Broker, contender: str, kept: dict[str, str]
) -> AsyncIterator[str]:
    """The queue ``contender`` publishes to: never another contender's.

    memory:// gets a new one per round, deleted at once (its messages stay in this
    process and would make every later garbage collection slower). A real broker keeps
    one per contender for all rounds (``kept``, deleted after the last): a new Kafka
    topic per round, and the deletion of the last one, kept the broker busy during the
    next clock (publish_many fell from 125k to 40k msgs/s over three rounds; on one
    topic it held 210k-250k).
    """
    if broker.url.scheme != "memory":
        yield kept.setdefault(contender, f"bench-cp-{uuid.uuid4().hex[:12]}")
        return
    queue = f"bench-cp-{uuid.uuid4().hex[:12]}"
    try:
        yield queue
    finally:
        await _delete(broker, queue)


async def _delete(broker: brokerkit.Broker, queue: str) -> None:
    """Delete ``queue``; a failure is printed, not raised, so that the cleanup goes on to
    the other queues (four undeleted queues of 60 000 messages each once left ElasticMQ
    answering 503 to everything after)."""
    try:
        await broker.delete_queue(queue)
    except brokerkit.UnsupportedFeature:
        pass
    except brokerkit.BrokerkitError as exc:
        print(f"could not delete {queue}: {type(exc).__name__}: {exc}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--latency-samples", type=int, default=300)
    parser.add_argument(
        "--ceiling", action="store_true", help="add the bare-gatherer contender (see above)"
    )
    parser.add_argument(
        "--direct", action="store_true", help="add the uncoalesced contender (see above)"
    )
    args = parser.parse_args()
    body = b"x" * args.size
    single = f"single x{args.concurrency}"
    rates: dict[str, list[float]] = {"publish_many": [], single: []}
    if args.ceiling:
        rates["ceiling"] = []
    if args.direct:
        rates["direct"] = []
    latency: list[float] = []
    errors = 0
    kept: dict[str, str] = {}
    async with brokerkit.connect(args.url) as broker:
        try:
            for round_no in range(args.rounds):
                async with _queue(broker, "publish_many", kept) as queue:
                    rates["publish_many"].append(
                        await publish_rate(broker, queue, args.messages, body)
                    )
                try:
                    async with _queue(broker, "single", kept) as queue:
                        rate = await concurrent_publish_rate(
                            broker, queue, args.messages, body, concurrency=args.concurrency
                        )
                    rates[single].append(rate)
                except brokerkit.BrokerkitError as exc:
                    errors += 1
                    print(f"round {round_no + 1}: concurrent publishes raised {type(exc).__name__}")
                if args.ceiling:
                    async with _queue(broker, "ceiling", kept) as queue:
                        rates["ceiling"].append(
                            await ceiling_rate(
                                broker, queue, args.messages, body, concurrency=args.concurrency
                            )
                        )
                if args.direct:
                    try:
                        async with _queue(broker, "direct", kept) as queue:
                            rate = await direct_rate(
                                broker, queue, args.messages, body, concurrency=args.concurrency
                            )
                        rates["direct"].append(rate)
                    except brokerkit.BrokerkitError as exc:
                        print(f"round {round_no + 1}: direct publishes raised {type(exc).__name__}")
                async with _queue(broker, "lone", kept) as queue:
                    latency.append(
                        await sequential_latency(broker, queue, args.latency_samples, body)
                    )
                print(round_line(round_no, rates) + f", lone publish {latency[-1]:.0f} us")
        finally:  # outside every clock
            for queue in kept.values():
                await _delete(broker, queue)
    title = (
        f"{broker.url.redacted()}: {args.messages} x {args.size} B, {args.rounds} rounds, "
        f"rounds that raised: {errors}"
    )
    ratios = [("single/publish_many", single, "publish_many")]
    if args.ceiling:
        ratios += [
            ("ceiling/publish_many", "ceiling", "publish_many"),
            ("single/ceiling", single, "ceiling"),
        ]
    if args.direct:
        ratios += [
            ("direct/publish_many", "direct", "publish_many"),
            ("single/direct", single, "direct"),
        ]
    if all(rates.values()):
        print(summary(rates, ratios, title=title))
    lat = ", ".join(f"{v:.0f}" for v in latency)
    print(f"  lone publish median {statistics.median(latency):.0f} us  ({lat})")


if __name__ == "__main__":
    asyncio.run(main())
