"""Raw nats-py vs brokerkit on NATS JetStream, in one run: publish and consume+ack.

    python benchmarks/bench_nats.py [--url nats://127.0.0.1:4222] [--messages 20000]
                                    [--rounds 5] [--size 100] [--batch 500]

Raw publish: ``js.publish_async`` for each message of a batch of ``--batch``, then one
wait for the batch's PubAcks (what ``publish_many`` gets: the same batches). Raw
consume+ack: a durable pull consumer, ``fetch(batch)`` then ``ack()`` per message.
brokerkit: ``brokerkit._bench`` (the loops ``brokerkit bench`` runs) with
``prefetch=batch``. Rounds alternate raw and brokerkit on fresh streams (file
storage, like brokerkit's default), deleted after; medians and ratios are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

import brokerkit
from brokerkit._bench import consume_rate, publish_rate, round_line, summary


async def raw_publish(
    js: JetStreamContext, subject: str, count: int, body: bytes, batch: int
) -> float:
    started = time.perf_counter()
    sent = 0
    while sent < count:
        n = min(batch, count - sent)
        futures = [await js.publish_async(subject, body) for _ in range(n)]
        await asyncio.gather(*futures)
        sent += n
    return count / (time.perf_counter() - started)


async def raw_consume(
    js: JetStreamContext, stream: str, subject: str, count: int, batch: int
) -> float:
    config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=10_000)
    sub = await js.pull_subscribe(subject, durable="bench", stream=stream, config=config)
    got = 0
    started = 0.0
    while got < count:
        try:
            msgs = await sub.fetch(batch, timeout=1.0)
        except nats.errors.TimeoutError:
            continue
        if not started:
            started = time.perf_counter()
        for msg in msgs:
            await msg.ack()
        got += len(msgs)
    await sub.unsubscribe()
    return (count - 1) / (time.perf_counter() - started)


async def raw_connect(url: str) -> NATS:
    """A nats-py connection to ``url``'s servers (and user/password)."""
    parsed = brokerkit.BrokerURL.parse(url)
    servers = [f"{parsed.scheme}://{h}" for h in parsed.hosts] or ["nats://127.0.0.1:4222"]
    auth = {"user": parsed.username, "password": parsed.password} if parsed.password else {}
    return await nats.connect(servers=servers, **auth)


async def raw_round(url: str, messages: int, size: int, batch: int) -> dict[str, float]:
    """One raw round on a fresh stream, deleted after: what ``brokerkit bench --raw`` shows."""
    nc = await raw_connect(url)
    js = nc.jetstream()
    tag = uuid.uuid4().hex[:12]
    stream, subject = f"benchraw_{tag}", f"benchraw.{tag}"
    try:
        await js.add_stream(StreamConfig(name=stream, subjects=[subject]))
        publish = await raw_publish(js, subject, messages, b"x" * size, batch)
        consume = await raw_consume(js, stream, subject, messages, batch)
        await js.delete_stream(stream)
    finally:
        await nc.close()
    return {"publish": publish, "consume+ack": consume}


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default="nats://127.0.0.1:4222")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    body = b"x" * args.size
    nc = await raw_connect(args.url)
    js = nc.jetstream()
    rates: dict[str, list[float]] = {k: [] for k in ("raw_pub", "bk_pub", "raw_con", "bk_con")}
    async with brokerkit.connect(args.url) as broker:
        for round_no in range(args.rounds):
            tag = uuid.uuid4().hex[:12]
            stream, subject, queue = f"benchraw_{tag}", f"benchraw.{tag}", f"bench-{tag}"
            await js.add_stream(StreamConfig(name=stream, subjects=[subject]))
            rates["raw_pub"].append(await raw_publish(js, subject, args.messages, body, args.batch))
            rates["bk_pub"].append(await publish_rate(broker, queue, args.messages, body))
            rates["raw_con"].append(
                await raw_consume(js, stream, subject, args.messages, args.batch)
            )
            rates["bk_con"].append(await consume_rate(broker, queue, args.messages, args.batch))
            await js.delete_stream(stream)
            await broker.delete_queue(queue)
            print(round_line(round_no, rates))
    await nc.close()
    ratios = [("publish", "bk_pub", "raw_pub"), ("consume+ack", "bk_con", "raw_con")]
    title = f"{args.rounds} rounds, {args.messages} x {args.size} B messages"
    print("\n" + summary(rates, ratios, title=title))


if __name__ == "__main__":
    asyncio.run(main())
