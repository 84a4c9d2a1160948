"""brokerkit kafka:// against the raw confluent-kafka client, measured in the same run.

    python benchmarks/bench_kafka.py [--url kafka://127.0.0.1:9092] [-n 20000] [--runs 3]

publish: N 100-byte messages with delivery reports (raw: produce + flush; brokerkit:
publish_many in batches of 500). consume: the same N read and settled (raw: consume(500)
+ synchronous commit per batch; brokerkit: a consumer, ack per message). Prints the
median rate of each and brokerkit / raw.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

import brokerkit

BODY = b"x" * 100
BATCH = 500


def raw_publish(servers: str, topic: str, n: int) -> float:
    admin = AdminClient({"bootstrap.servers": servers})
    for fut in admin.create_topics([NewTopic(topic, 6, 1)]).values():
        fut.result()
    producer = Producer(
        {"bootstrap.servers": servers, "acks": "all", "enable.idempotence": True, "linger.ms": 2}
    )
    done = 0

    def report(err: object, msg: object) -> None:
        nonlocal done
        done += 1

    start = time.perf_counter()
    for _ in range(n):
        while True:
            try:
                producer.produce(topic, BODY, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush()
    elapsed = time.perf_counter() - start
    assert done == n
    return n / elapsed


def raw_consume(servers: str, topic: str, n: int) -> float:
    consumer = Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"raw-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got = 0
    start = 0.0
    while got < n:
        msgs = consumer.consume(BATCH, 1.0)
        if msgs and not start:
            start = time.perf_counter()
        got += sum(1 for m in msgs if m.error() is None)
        if msgs:
            consumer.commit(asynchronous=False)
    elapsed = time.perf_counter() - start
    consumer.close()
    return n / elapsed


async def bk_publish(url: str, queue: str, n: int) -> float:
    async with brokerkit.connect(url) as broker:
        await broker.publish(queue, b"warm-up")
        start = time.perf_counter()
        for i in range(0, n, BATCH):
            await broker.publish_many(
                queue, [brokerkit.Outgoing(BODY) for _ in range(min(BATCH, n - i))]
            )
        return n / (time.perf_counter() - start)


async def bk_consume(url: str, queue: str, n: int) -> float:
    async with (
        brokerkit.connect(url) as broker,
        broker.consumer(queue, "bench", prefetch=BATCH) as consumer,
    ):
        got = 0
        start = 0.0
        async for msg in consumer:
            if not start:
                start = time.perf_counter()
            await msg.ack()
            got += 1
            if got >= n + 1:  # + the warm-up message
                break
        return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="kafka://127.0.0.1:9092")
    parser.add_argument("-n", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    servers = args.url.removeprefix("kafka://").split("?")[0]
    rates: dict[str, list[float]] = {k: [] for k in ("raw pub", "bk pub", "raw con", "bk con")}
    for _ in range(args.runs):
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        rates["raw pub"].append(raw_publish(servers, topic, args.n))
        rates["raw con"].append(raw_consume(servers, topic, args.n))
        queue = f"bench-{uuid.uuid4().hex[:8]}"
        rates["bk pub"].append(asyncio.run(bk_publish(args.url, queue, args.n)))
        rates["bk con"].append(asyncio.run(bk_consume(args.url, queue, args.n)))
    med = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in med.items():
        print(f"{k:8s} {v:10.0f} msg/s  (runs: {', '.join(f'{x:.0f}' for x in rates[k])})")
    print(f"publish ratio brokerkit/raw: {med['bk pub'] / med['raw pub']:.2f}")
    print(f"consume ratio brokerkit/raw: {med['bk con'] / med['raw con']:.2f}")


if __name__ == "__main__":
    main()
