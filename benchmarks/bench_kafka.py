"""brokerkit kafka:// against the raw confluent-kafka client, measured in the same run.

    python benchmarks/bench_kafka.py [--url kafka://127.0.0.1:9092] [-n 20000] [--runs 3]

Each run, in this order, on fresh topics (6 partitions, 100-byte bodies):

* raw pub: ``Producer`` (acks=all, idempotence, linger.ms=2, as brokerkit's) ``produce``
  with an ``on_delivery`` callback per message + ``poll(0)``, then ``flush``; every
  delivery report is counted (all N confirmed). One warm-up message is flushed first
  (connection and producer id outside the clock, as for brokerkit). The clock covers
  produce..flush.
* raw pub/batch: as raw pub, but ``flush`` after every 500 (each batch confirmed before
  the next is produced): the raw equivalent of an awaited ``publish_many(500)``, which
  returns only confirmed ids. For information, beside raw pub's best case.
* raw pub/batch x4: raw pub/batch from 4 threads sharing the producer, each batch of 500
  confirmed (its reports counted, the thread polling meanwhile) before that thread
  produces its next: the raw client keeping bk pub x4's promise (every batch confirmed
  before its caller goes on) the plain way. For information: raw pub never waits for a
  confirmation, so bk pub x4 / raw pub mixes the promise's cost with brokerkit's.
* raw con: a new group reads the N: ``consume(500, 1.0)`` + ``commit(asynchronous=False)``
  of the position after every batch; no per-message work beyond ``error()``; librdkafka's
  defaults except ``fetch.queue.backoff.ms``, set as brokerkit sets it. Clock from
  the first message to the last.
* raw con/store: as raw con, plus per message ``value()`` and ``store_offsets(msg)``
  (librdkafka's own per-message "ack") and a synchronous commit of the stored offsets
  per batch. For information: the closest raw equivalent of per-message acks.
* raw aio con/store: raw con/store through confluent-kafka's own asyncio consumer
  (``confluent_kafka.aio.AIOConsumer``): ``await consume(500, 1.0)``, per message
  ``value()`` + ``await store_offsets(message=m)``, ``await commit(asynchronous=False)``
  per batch. Each call is a hop to its thread pool: the raw client's own async API
  doing what ``async for`` + ``await msg.ack()`` does. For information.
* bk pub: ``publish_many`` in batches of 500, each awaited (all delivery reports in).
* bk pub x4: the same batches from 4 tasks at once, so that one batch's round trip
  overlaps the next one's produce loop: what a service publishing from several tasks
  gets. For information, beside raw pub (which never waits for a batch either).
* bk con: a consumer (prefetch 500), ``async for msg`` + ``await msg.ack()`` per message.
* bk recv: the Kafka backend's ``Receiver`` alone, without the facade (no ``Message``,
  no read-ahead, no ``async for``): ``receive(500)`` + ``await receiver.ack(d)`` per
  delivery, a new group on bk con's queue. For information: the most any batch or
  lighter facade API could get out of this backend; the rest of the gap to raw con is
  the backend's per-record bookkeeping and its count commit before each hand-out.

Prints the median of each and the brokerkit / raw ratios (against raw con). Every run
deletes the topics and queues it made, so the broker is left as it was found.

Warm publish mode (``--warm [-n 100000] [--runs 7]``): one topic, made and written to
once before the clock (a new topic is several times slower at first), then per round,
interleaved: raw pub, raw pub/batch x4, bk pub x4, bk pub (one task). Prints medians,
the ratios of the medians and bk pub x4 / raw pub paired per round.

Backlog mode (``--backlog 20000,100000,1000000 [--partitions 1] [--take 100000]``): for
each size one queue is declared and filled up front by a raw producer (outside the
clock); each run then reads the first ``--take`` messages (at most all) of every
backlog with a new group, raw (``consume(500)`` + one commit per batch, as raw con)
and brokerkit (bk con), sizes and contenders interleaved. Prints the medians, each
bk/raw ratio, and each bk rate against bk's rate at the smallest backlog: consumption
must not get slower because more is waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

import brokerkit
from brokerkit._bench import consume_rate, drain_rate, publish_rate, summary
from brokerkit.backends import QueueRef, ReceiverSettings

BODY = b"x" * 100
BATCH = 500


def new_producer(servers: str, topic: str) -> Producer:
    """A producer as brokerkit's (acks=all, idempotence, linger.ms=2) with ``topic``
    made (6 partitions) unless it exists, and one warm-up message flushed: connection,
    producer id and metadata outside the clock, as brokerkit's warm-up publish."""
    admin = AdminClient({"bootstrap.servers": servers})
    if topic not in admin.list_topics(timeout=10).topics:
        for fut in admin.create_topics([NewTopic(topic, 6, 1)]).values():
            fut.result()
    producer = Producer(
        {"bootstrap.servers": servers, "acks": "all", "enable.idempotence": True, "linger.ms": 2}
    )
    producer.produce(topic, b"warm-up")
    producer.flush()
    return producer


def produce_records(
    producer: Producer, topic: str, count: int, report: Callable[[Any, Any], None]
) -> None:
    """``count`` records of ``BODY``, each with ``report`` as its delivery callback, and a
    ``poll(0)`` after each: the raw loop (one call per batch, not per record)."""
    for _ in range(count):
        while True:
            try:
                producer.produce(topic, BODY, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)


def raw_publish(
    producer: Producer, topic: str, n: int, *, confirm_every: int | None = None
) -> float:
    """Produce ``n`` and count every delivery report; ``confirm_every``: flush after that
    many (each batch confirmed before the next), else once at the end."""
    done = 0

    def report(err: object, msg: object) -> None:
        nonlocal done
        done += 1

    step = confirm_every or n
    start = time.perf_counter()
    for sent in range(0, n, step):
        produce_records(producer, topic, min(step, n - sent), report)
        if confirm_every:
            producer.flush()  # the batch's reports are all in
    producer.flush()
    elapsed = time.perf_counter() - start
    assert done == n
    return n / elapsed


def raw_publish_concurrent(producer: Producer, topic: str, n: int, threads: int = 4) -> float:
    """raw pub/batch from ``threads`` threads at once (see the module docstring)."""
    sizes = [min(BATCH, n - sent) for sent in range(0, n, BATCH)]
    confirmed = [0] * threads

    def worker(me: int) -> None:
        for size in sizes[me::threads]:
            counted = itertools.count(1)  # ``next`` is atomic: any thread's poll may report
            done = threading.Event()

            def report(
                err: object,
                msg: object,
                counted: Iterator[int] = counted,
                size: int = size,
                done: threading.Event = done,
            ) -> None:
                if next(counted) == size:
                    done.set()

            produce_records(producer, topic, size, report)
            while not done.is_set():
                producer.poll(0.001)
            confirmed[me] += size

    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    assert sum(confirmed) == n
    return n / elapsed


def fill(servers: str, topic: str, n: int) -> None:
    """Produce ``n`` bodies to ``topic`` as fast as possible (not timed)."""
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 20, "acks": "all"})
    for _ in range(n):
        while True:
            try:
                producer.produce(topic, BODY)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush()


def raw_consume(servers: str, topic: str, n: int, *, store_each: bool = False) -> float:
    """Batched consume(), one synchronous commit per batch.

    ``store_each``: also read each value and ``store_offsets`` it, the closest raw
    equivalent of a per-message ack.
    """
    # here, not at the top: ab_kafka_recv.py imports this script beside older trees
    from brokerkit.backends.kafka._link import FETCH_QUEUE_BACKOFF_MS

    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"raw-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.auto.offset.store": not store_each,
            # as brokerkit's consumers: with librdkafka's 1 s default, a raw loop reading
            # a backlog of ~100 000 or more stalls for up to a second each time its local
            # queue was full (docs/backends/kafka.md, "Backlog")
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        }
    )
    consumer.subscribe([topic])
    got = 0
    start = 0.0
    while got < n:
        msgs = consumer.consume(BATCH, 1.0)
        if msgs and not start:
            start = time.perf_counter()
        for m in msgs:
            if m.error() is None:
                if store_each:
                    m.value()
                    consumer.store_offsets(message=m)
                got += 1
        if msgs:
            consumer.commit(asynchronous=False)
    elapsed = time.perf_counter() - start
    consumer.close()
    return n / elapsed


async def raw_aio_consume(servers: str, topic: str, n: int) -> float:
    """raw con/store through ``AIOConsumer`` (see the module docstring)."""
    from confluent_kafka.aio import AIOConsumer

    from brokerkit.backends.kafka._link import FETCH_QUEUE_BACKOFF_MS

    consumer = AIOConsumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"raw-aio-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        }
    )
    await consumer.subscribe([topic])
    got = 0
    start = 0.0
    try:
        while got < n:
            msgs = await consumer.consume(BATCH, 1.0)
            if msgs and not start:
                start = time.perf_counter()
            for m in msgs:
                if m.error() is None:
                    m.value()
                    await consumer.store_offsets(message=m)
                    got += 1
            if msgs:
                await consumer.commit(asynchronous=False)
        return n / (time.perf_counter() - start)
    finally:
        await consumer.close()


async def bk_publish(url: str, queue: str, n: int, tasks: int = 1) -> float:
    async with brokerkit.connect(url) as broker:
        await broker.publish(queue, b"warm-up")  # as raw: producer id and metadata first
        return await publish_rate(broker, queue, n, BODY, tasks=tasks)


async def bk_consume(url: str, queue: str, n: int) -> float:
    async with brokerkit.connect(url) as broker:
        return await consume_rate(broker, queue, n + 1, BATCH)  # + the warm-up message


async def bk_consume_group(url: str, queue: str, n: int) -> float:
    """bk con with a new group: the first ``n`` of a queue's backlog."""
    async with brokerkit.connect(url) as broker:
        group = f"g{uuid.uuid4().hex[:8]}"
        async with broker.consumer(queue, group, prefetch=BATCH) as consumer:
            return await drain_rate(consumer, n)


async def declare(url: str, queue: str) -> None:
    async with brokerkit.connect(url) as broker:
        await broker.declare(queue)


async def bk_receive(url: str, queue: str, n: int, group: str = "bench-recv") -> float:
    """The backend's receiver alone (see the module docstring), timed from the first batch."""
    async with brokerkit.connect(url) as broker:
        await broker.open()
        receiver = await broker.backend.subscribe(
            QueueRef(queue), group, ReceiverSettings(ack_timeout=30.0)
        )
        try:
            got, start = 0, 0.0
            while got < n:
                deliveries = await receiver.receive(BATCH, 1.0)
                if deliveries and not start:
                    start = time.perf_counter()
                for delivery in deliveries:
                    await receiver.ack(delivery)
                got += len(deliveries)
            return n / (time.perf_counter() - start)
        finally:
            await receiver.aclose()


async def delete_queues(url: str, queues: list[str]) -> None:
    async with brokerkit.connect(url) as broker:
        for queue in queues:
            await broker.delete_queue(queue)


def delete_topics(servers: str, topics: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": servers})
    for fut in admin.delete_topics(topics, operation_timeout=10).values():
        fut.result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="kafka://127.0.0.1:9092")
    parser.add_argument("-n", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backlog", help="backlog mode: comma-separated sizes")
    parser.add_argument("--partitions", type=int, default=1, help="backlog mode")
    parser.add_argument("--take", type=int, default=100_000, help="backlog mode")
    parser.add_argument("--warm", action="store_true", help="warm publish mode")
    args = parser.parse_args()
    servers = args.url.removeprefix("kafka://").split("?")[0]
    if args.warm:
        asyncio.run(warm_main(args.url, servers, args.n, args.runs))
        return
    if args.backlog:
        sizes = [int(x) for x in args.backlog.split(",")]
        backlog_main(args.url, servers, sizes, args.partitions, args.take, args.runs)
        return
    names = (
        "raw pub",
        "raw pub/batch",
        "raw pub/batch x4",
        "bk pub",
        "bk pub x4",
        "raw con",
        "raw con/store",
        "raw aio con/store",
        "bk con",
        "bk recv",
    )
    rates: dict[str, list[float]] = {k: [] for k in names}
    for _ in range(args.runs):
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        rates["raw pub"].append(raw_publish(new_producer(servers, topic), topic, args.n))
        batch_topic = f"bench-{uuid.uuid4().hex[:8]}"
        producer = new_producer(servers, batch_topic)
        rates["raw pub/batch"].append(
            raw_publish(producer, batch_topic, args.n, confirm_every=BATCH)
        )
        x4_topic = f"bench-{uuid.uuid4().hex[:8]}"
        producer = new_producer(servers, x4_topic)
        rates["raw pub/batch x4"].append(raw_publish_concurrent(producer, x4_topic, args.n))
        rates["raw con"].append(raw_consume(servers, topic, args.n))
        rates["raw con/store"].append(raw_consume(servers, topic, args.n, store_each=True))
        rates["raw aio con/store"].append(asyncio.run(raw_aio_consume(servers, topic, args.n)))
        queue = f"bench-{uuid.uuid4().hex[:8]}"
        rates["bk pub"].append(asyncio.run(bk_publish(args.url, queue, args.n)))
        overlapped = f"bench-{uuid.uuid4().hex[:8]}"
        rates["bk pub x4"].append(asyncio.run(bk_publish(args.url, overlapped, args.n, tasks=4)))
        rates["bk con"].append(asyncio.run(bk_consume(args.url, queue, args.n)))
        rates["bk recv"].append(asyncio.run(bk_receive(args.url, queue, args.n + 1)))
        delete_topics(servers, [topic, batch_topic, x4_topic])  # leave the broker as we found it
        asyncio.run(delete_queues(args.url, [queue, overlapped]))
    ratios = [
        ("publish", "bk pub", "raw pub"),
        ("publish vs raw pub/batch", "bk pub", "raw pub/batch"),
        ("publish x4 vs raw pub", "bk pub x4", "raw pub"),
        ("raw pub/batch x4 vs raw pub", "raw pub/batch x4", "raw pub"),
        ("publish x4 vs raw pub/batch x4", "bk pub x4", "raw pub/batch x4"),
        ("consume", "bk con", "raw con"),
        ("consume vs raw store", "bk con", "raw con/store"),
        ("consume vs raw aio store", "bk con", "raw aio con/store"),
        ("receiver alone", "bk recv", "raw con"),
    ]
    print(summary(rates, ratios, title=f"{args.runs} runs, {args.n} x {len(BODY)} B messages"))


async def warm_main(url: str, servers: str, n: int, rounds: int) -> None:
    """See "Warm publish mode" in the module docstring."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    async with brokerkit.connect(url) as broker:
        await broker.declare(queue)
        topic = f"brokerkit.{queue}"
        try:
            producer = new_producer(servers, topic)
            raw_publish(producer, topic, min(n, 20_000))  # both sides warm before the clock
            await publish_rate(broker, queue, min(n, 20_000), BODY, tasks=4)
            rates: dict[str, list[float]] = {
                k: [] for k in ("raw pub", "raw pub/batch x4", "bk pub", "bk pub x4")
            }
            for _ in range(rounds):
                rates["raw pub"].append(raw_publish(producer, topic, n))
                rates["raw pub/batch x4"].append(raw_publish_concurrent(producer, topic, n))
                rates["bk pub x4"].append(await publish_rate(broker, queue, n, BODY, tasks=4))
                rates["bk pub"].append(await publish_rate(broker, queue, n, BODY))
        finally:
            await broker.delete_queue(queue)
    ratios = [
        ("publish x4 vs raw pub", "bk pub x4", "raw pub"),
        ("raw pub/batch x4 vs raw pub", "raw pub/batch x4", "raw pub"),
        ("publish x4 vs raw pub/batch x4", "bk pub x4", "raw pub/batch x4"),
        ("publish vs raw pub", "bk pub", "raw pub"),
    ]
    title = f"{rounds} rounds, {n} x {len(BODY)} B on one warm topic (6 partitions)"
    print(summary(rates, ratios, title=title))
    paired = [b / r for b, r in zip(rates["bk pub x4"], rates["raw pub"], strict=True)]
    runs = ", ".join(f"{x:.2f}" for x in paired)
    print(f"  bk pub x4 / raw pub per round: median {statistics.median(paired):.2f}  ({runs})")


def backlog_main(
    url: str, servers: str, sizes: list[int], partitions: int, take: int, runs: int
) -> None:
    """See "Backlog mode" in the module docstring."""
    sep = "&" if "?" in url else "?"
    url = f"{url}{sep}partitions={partitions}"
    queues = {n: f"bench-{uuid.uuid4().hex[:8]}" for n in sizes}
    for n, queue in queues.items():
        asyncio.run(declare(url, queue))
        fill(servers, f"brokerkit.{queue}", n)
    rates: dict[str, list[float]] = {}
    try:
        for _ in range(runs):
            for n, queue in queues.items():
                count = min(n, take)
                topic = f"brokerkit.{queue}"
                rates.setdefault(f"raw con {n}", []).append(raw_consume(servers, topic, count))
                rates.setdefault(f"bk con {n}", []).append(
                    asyncio.run(bk_consume_group(url, queue, count))
                )
    finally:
        asyncio.run(delete_queues(url, list(queues.values())))
    ratios = [(f"bk/raw {n}", f"bk con {n}", f"raw con {n}") for n in sizes]
    ratios += [(f"bk {n} / bk {sizes[0]}", f"bk con {n}", f"bk con {sizes[0]}") for n in sizes[1:]]
    title = f"{runs} runs, backlogs {sizes} on {partitions} partition(s), first {take} read"
    print(summary(rates, ratios, title=title))


if __name__ == "__main__":
    main()
