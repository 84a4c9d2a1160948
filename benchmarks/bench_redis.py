"""Raw redis-py vs brokerkit on Redis Streams, in one run: publish and consume+ack.

    python benchmarks/bench_redis.py [--url redis://127.0.0.1:6379/0] [--messages 20000]
                                     [--rounds 5] [--size 100] [--batch 500]

Raw publish: pipelined ``XADD`` in batches of ``--batch`` (the same batches brokerkit's
``publish_many`` gets). Raw consume+ack: ``XREADGROUP GROUP bench c1 COUNT batch BLOCK 1000
STREAMS s >`` then one awaited ``XACK`` of every id of the batch before the next read (what a
careful raw user writes: each entry read once and acked, the same server work brokerkit
does, without leases). brokerkit: ``brokerkit._bench`` (the
same loops ``brokerkit bench`` runs) with ``prefetch=batch``. Rounds alternate raw and
brokerkit; medians and ratios are printed. Each round uses fresh keys, deleted after.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

import redis.asyncio as aioredis

import brokerkit
from brokerkit._bench import consume_rate, publish_rate, round_line, summary


async def raw_publish(r: aioredis.Redis, stream: str, count: int, body: bytes, batch: int) -> float:
    started = time.perf_counter()
    sent = 0
    while sent < count:
        n = min(batch, count - sent)
        pipe = r.pipeline(transaction=False)
        for _ in range(n):
            pipe.xadd(stream, {b"b": body})
        await pipe.execute()
        sent += n
    return count / (time.perf_counter() - started)


async def raw_consume(r: aioredis.Redis, stream: str, count: int, batch: int) -> float:
    await r.xgroup_create(stream, "bench", id="0", mkstream=True)
    got = 0
    started = 0.0
    while got < count:
        reply: Any = await r.xreadgroup("bench", "c1", {stream: ">"}, count=batch, block=1000)
        if not reply:
            continue
        if not started:
            started = time.perf_counter()
        ids = [entry_id for entry_id, _ in reply[0][1]]
        await r.xack(stream, "bench", *ids)
        got += len(ids)
    return (count - 1) / (time.perf_counter() - started)


def raw_client(url: str) -> aioredis.Redis:
    """A redis-py client on ``url``'s host, database and password."""
    parsed = brokerkit.BrokerURL.parse(url)
    host = parsed.hosts[0] if parsed.hosts else brokerkit.BrokerURL.parse("redis://h").hosts[0]
    return aioredis.Redis(
        host=host.host,
        port=host.port or 6379,
        db=int(parsed.path.strip("/") or 0),
        password=parsed.password,
    )


async def raw_round(url: str, messages: int, size: int, batch: int) -> dict[str, float]:
    """One raw round on a fresh stream, deleted after: what ``brokerkit bench --raw`` shows."""
    raw = raw_client(url)
    stream = f"bench-raw-{uuid.uuid4().hex[:12]}"
    try:
        publish = await raw_publish(raw, stream, messages, b"x" * size, batch)
        consume = await raw_consume(raw, stream, messages, batch)
    finally:
        await raw.delete(stream)
        await raw.aclose()
    return {"publish": publish, "consume+ack": consume}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    body = b"x" * args.size
    raw = raw_client(args.url)
    rates: dict[str, list[float]] = {k: [] for k in ("raw_pub", "bk_pub", "raw_con", "bk_con")}
    async with brokerkit.connect(args.url) as broker:
        for round_no in range(args.rounds):
            stream = f"bench-raw-{uuid.uuid4().hex[:12]}"
            queue = f"bench-{uuid.uuid4().hex[:12]}"
            rates["raw_pub"].append(await raw_publish(raw, stream, args.messages, body, args.batch))
            rates["bk_pub"].append(await publish_rate(broker, queue, args.messages, body))
            rates["raw_con"].append(await raw_consume(raw, stream, args.messages, args.batch))
            rates["bk_con"].append(await consume_rate(broker, queue, args.messages, args.batch))
            await raw.delete(stream)
            await broker.delete_queue(queue)
            print(round_line(round_no, rates))
    await raw.aclose()
    ratios = [("publish", "bk_pub", "raw_pub"), ("consume+ack", "bk_con", "raw_con")]
    title = f"{args.rounds} rounds, {args.messages} x {args.size} B messages"
    print("\n" + summary(rates, ratios, title=title))


if __name__ == "__main__":
    asyncio.run(main())
