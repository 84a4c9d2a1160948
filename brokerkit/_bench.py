"""``brokerkit bench``: brokerkit's own publish and consume+ack throughput on a URL.

The per-backend scripts in ``benchmarks/`` measure the raw client library in
the same run and print ratios; this command gives the brokerkit side for any
URL, so brokers can be compared. Quote medians: these machines are noisy.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import brokerkit
from brokerkit._bench_raw import RawRound

RAW_BATCH = 500
"""The raw client's batch: the size of brokerkit's ``publish_many`` batches here."""


@dataclass(frozen=True)
class BenchResult:
    publish: list[float]
    consume: list[float]
    concurrent: list[float] = field(default_factory=list)
    """Single publishes from ``concurrency`` tasks at once (empty unless asked for)."""
    raw: dict[str, list[float]] = field(default_factory=dict)
    """The raw client's series by name (``publish``, ``consume+ack``), when asked for."""

    @property
    def publish_median(self) -> float:
        return statistics.median(self.publish)

    @property
    def consume_median(self) -> float:
        return statistics.median(self.consume)


async def publish_rate(
    broker: brokerkit.Broker, queue: str, count: int, body: bytes, *, tasks: int = 1
) -> float:
    """Messages per second for ``count`` confirmed publishes in ``publish_many`` batches of
    500; ``tasks`` callers at a time (one batch's round trip overlaps another's produce)."""
    batch = [brokerkit.Outgoing(body) for _ in range(min(count, 500))]
    chunks = [batch[: count - sent] for sent in range(0, count, 500)]

    async def caller(mine: list[list[brokerkit.Outgoing]]) -> None:
        for chunk in mine:
            await broker.publish_many(queue, chunk)

    started = time.perf_counter()
    await asyncio.gather(*(caller(chunks[i::tasks]) for i in range(tasks)))
    return count / (time.perf_counter() - started)


def shares(count: int, tasks: int) -> list[int]:
    """``count`` calls split as evenly as can be over at most ``tasks`` tasks (none empty)."""
    return [n for i in range(tasks) if (n := count // tasks + (1 if i < count % tasks else 0))]


async def callers_rate(
    count: int, concurrency: int, caller: Callable[[int], Awaitable[None]]
) -> float:
    """Calls per second for ``count`` calls split over ``concurrency`` tasks at once, each
    running ``caller(n)`` (its own loop of ``n`` awaited calls: no extra frame per call)."""
    started = time.perf_counter()
    await asyncio.gather(*(caller(n) for n in shares(count, concurrency)))
    return count / (time.perf_counter() - started)


async def concurrent_publish_rate(
    broker: brokerkit.Broker, queue: str, count: int, body: bytes, *, concurrency: int
) -> float:
    """Messages per second for ``count`` single ``publish()`` calls from ``concurrency``
    tasks at once (each awaiting its own call, then making the next): a web service."""

    async def caller(n: int) -> None:
        for _ in range(n):
            await broker.publish(queue, body)

    return await callers_rate(count, concurrency, caller)


async def consume_rate(broker: brokerkit.Broker, queue: str, count: int, prefetch: int) -> float:
    """Messages per second to receive and ack ``count`` messages, timed from the first one."""
    async with broker.consumer(queue, "bench", prefetch=prefetch) as consumer:
        return await drain_rate(consumer, count)


async def drain_rate(consumer: brokerkit.Consumer, count: int) -> float:
    """Receive and ack ``count`` messages one by one; per second, timed from the first."""
    first = await consumer.__anext__()
    started = time.perf_counter()
    await first.ack()
    got = 1
    async for msg in consumer:
        await msg.ack()
        got += 1
        if got == count:
            break
    return (count - 1) / (time.perf_counter() - started)


async def run_bench(
    url: str,
    *,
    messages: int = 20_000,
    size: int = 100,
    rounds: int = 3,
    prefetch: int = 500,
    concurrency: int = 0,
    raw: RawRound | None = None,
) -> BenchResult:
    """``concurrency`` > 0 also measures that many single-publish callers at once; ``raw``
    (a benchmark script's ``raw_round``) runs one raw-client round before each of ours."""
    body = b"x" * size
    publish: list[float] = []
    consume: list[float] = []
    concurrent: list[float] = []
    raw_series: dict[str, list[float]] = {}
    # One queue for every round, written to and read once before the first (outside the
    # clock): the first writes to a new Kafka topic are several times slower, and deleting
    # a topic keeps the broker busy for a while, so a queue per round timed that instead.
    queue = f"bench-{uuid.uuid4().hex[:12]}"
    warm_up = min(messages, 1000)
    async with brokerkit.connect(url) as broker:
        try:
            await publish_rate(broker, queue, warm_up, body)
            await consume_rate(broker, queue, warm_up, prefetch)
            for _ in range(rounds):
                if raw is not None:  # interleaved: both sides see the same machine load
                    for name, rate in (await raw(url, messages, size, RAW_BATCH)).items():
                        raw_series.setdefault(name, []).append(rate)
                publish.append(await publish_rate(broker, queue, messages, body))
                if concurrency:
                    concurrent.append(
                        await concurrent_publish_rate(
                            broker, queue, messages, body, concurrency=concurrency
                        )
                    )
                # consume what was published (the concurrent series published as many again)
                total = messages * (2 if concurrency else 1)
                consume.append(await consume_rate(broker, queue, total, prefetch))
        finally:
            with contextlib.suppress(brokerkit.UnsupportedFeature):
                await broker.delete_queue(queue)  # leave the broker as we found it
    return BenchResult(publish, consume, concurrent, raw_series)


def round_line(round_no: int, rates: dict[str, list[float]]) -> str:
    """The latest value of every series, for a benchmark script's per-round progress line."""
    latest = ", ".join(f"{name} {values[-1]:,.0f}/s" for name, values in rates.items() if values)
    return f"round {round_no + 1}: {latest}"


def summary(
    rates: dict[str, list[float]], ratios: list[tuple[str, str, str]], *, title: str
) -> str:
    """Medians of every series and the named ``(label, brokerkit, raw)`` ratios, printable.

    The one report format of the benchmark scripts in ``benchmarks/``.
    """
    medians = {name: statistics.median(values) for name, values in rates.items()}
    lines = [title]
    for name, values in rates.items():
        runs = ", ".join(f"{v:,.0f}" for v in values)
        lines.append(f"  {name:<16} median {medians[name]:>10,.0f} msgs/s  ({runs})")
    for label, ours, raw in ratios:
        lines.append(f"  ratio {label:<24} {medians[ours] / medians[raw]:.2f}")
    return "\n".join(lines)
