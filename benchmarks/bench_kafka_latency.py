"""How long one ``publish_many(500)`` takes on Kafka, against the raw client, with the
event loop idle and with it kept busy by another task.

    python benchmarks/bench_kafka_latency.py [--url kafka://127.0.0.1:9092] [--calls 200]
        [--rounds 5]

One warm topic (6 partitions, 100-byte bodies, written to before the clock). Per round,
interleaved:

* raw: the raw ``Producer`` (acks=all, idempotence, linger 2 ms, ``batch.num.messages``
  500, as brokerkit's) produces 500 records with a delivery callback each, then
  ``flush()``: one confirmed batch, the raw client's best case for the same promise.
* bk idle: ``await broker.publish_many(queue, batch)``, nothing else on the loop.
* bk busy: the same while another task of the loop runs 200 µs of Python between
  yields (a service consuming, say): delivery reports served by a thread other than the
  loop's then wait for the GIL, once per switch interval (5 ms) each.

Prints each contender's median and p90 in ms over the round's calls (medians of the
rounds), and bk idle / raw. A regression in who serves the reports shows as bk busy
far above bk idle (one such design measured p90 7.4 s).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from confluent_kafka import Producer

import brokerkit

BODY = b"x" * 100
BATCH = 500
SPIN = 0.0002
"""Seconds of Python the busy task runs between two yields."""


def raw_call_ms(producer: Producer, topic: str) -> float:
    """One confirmed batch of ``BATCH`` through the raw producer, in ms."""
    done = 0

    def report(err: object, msg: object) -> None:
        nonlocal done
        done += 1

    started = time.perf_counter()
    for _ in range(BATCH):
        producer.produce(topic, BODY, on_delivery=report)
    producer.flush()
    took = (time.perf_counter() - started) * 1e3
    assert done == BATCH
    return took


async def bk_calls_ms(broker: brokerkit.Broker, queue: str, calls: int) -> list[float]:
    batch = [brokerkit.Outgoing(BODY) for _ in range(BATCH)]
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        await broker.publish_many(queue, batch)
        out.append((time.perf_counter() - started) * 1e3)
    return out


async def _spin(stop: asyncio.Event) -> None:
    while not stop.is_set():
        until = time.perf_counter() + SPIN
        while time.perf_counter() < until:
            pass
        await asyncio.sleep(0)


async def busy_calls_ms(broker: brokerkit.Broker, queue: str, calls: int) -> list[float]:
    stop = asyncio.Event()
    spinner = asyncio.create_task(_spin(stop))
    try:
        return await bk_calls_ms(broker, queue, calls)
    finally:
        stop.set()
        await spinner


def p90(values: list[float]) -> float:
    return sorted(values)[int(len(values) * 0.9)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="kafka://127.0.0.1:9092")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    servers = args.url.removeprefix("kafka://").split("?")[0]
    queue = f"bench-lat-{uuid.uuid4().hex[:8]}"
    async with brokerkit.connect(args.url) as broker:
        await broker.declare(queue)
        topic = f"brokerkit.{queue}"
        producer = Producer(
            {
                "bootstrap.servers": servers,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "batch.num.messages": BATCH,
            }
        )
        try:
            raw_call_ms(producer, topic)  # both sides warm before the clock
            await bk_calls_ms(broker, queue, 20)
            series: dict[str, list[tuple[float, float]]] = {"raw": [], "bk idle": [], "bk busy": []}
            for round_no in range(args.rounds):
                raw = [raw_call_ms(producer, topic) for _ in range(args.calls)]
                idle = await bk_calls_ms(broker, queue, args.calls)
                busy = await busy_calls_ms(broker, queue, args.calls)
                for name, got in (("raw", raw), ("bk idle", idle), ("bk busy", busy)):
                    series[name].append((statistics.median(got), p90(got)))
                line = ", ".join(f"{k} {v[-1][0]:.2f}/{v[-1][1]:.2f}" for k, v in series.items())
                print(f"round {round_no + 1} (median/p90 ms): {line}")
        finally:
            await broker.delete_queue(queue)
    print(f"{args.rounds} rounds of {args.calls} calls of {BATCH} x {len(BODY)} B, one warm topic")
    medians = {}
    for name, values in series.items():
        medians[name] = statistics.median(m for m, _ in values)
        spread = statistics.median(p for _, p in values)
        print(f"  {name:<8} median {medians[name]:6.2f} ms   p90 {spread:8.2f} ms")
    print(f"  ratio bk idle / raw (time per call)  {medians['bk idle'] / medians['raw']:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
