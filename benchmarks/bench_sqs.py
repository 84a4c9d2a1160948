"""Raw boto3 vs brokerkit on SQS FIFO, in one run: publish and consume+ack.

    python benchmarks/bench_sqs.py [--url "sqs://?endpoint=http://127.0.0.1:4566&region=us-east-1"]
                                   [--messages 3000] [--rounds 7] [--size 100] [--inflight 16]

Raw publish, at best practice: ``SendMessageBatch`` of 10 entries, ``--inflight`` calls at
once (a thread pool of that size over one client; brokerkit's own pool, threads=, is 16 too), in
the same batches of 500 messages that brokerkit's ``publish_many`` gets, each entry with its own
MessageGroupId and MessageDeduplicationId (what any FIFO producer without ordering needs;
brokerkit makes the same ids for messages without a fifo_group). Raw consume+ack: one
loop of ``ReceiveMessage(MaxNumberOfMessages=10, WaitTimeSeconds=1)``, each batch deleted
with one ``DeleteMessageBatch`` handed to the pool (not awaited before the next receive),
every delete awaited at the end. brokerkit: ``publish_many`` in batches of 500 (the
``brokerkit bench`` loop) and ``async for msg in consumer: await msg.ack()``. Rounds
alternate raw and brokerkit, each on fresh queues, deleted after; medians and ratios are
printed. The emulator is slow: quote the absolute rates too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import boto3
from botocore.config import Config

import brokerkit
from brokerkit._bench import consume_rate, publish_rate, round_line, summary


def raw_client(url: str, threads: int) -> Any:
    parsed = brokerkit.BrokerURL.parse(url)
    params = parsed.params
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "brokerkit")  # an emulator takes any
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "brokerkit")
    config = Config(retries={"mode": "standard"}, max_pool_connections=threads + 2)
    return boto3.client(
        "sqs",
        region_name=params.get("region"),
        endpoint_url=params.get("endpoint"),
        config=config,
    )


def raw_publish(
    client: Any, pool: ThreadPoolExecutor, url: str, count: int, body: str, batch: int
) -> float:
    def send(n: int) -> None:
        entries = [
            {
                "Id": str(i),
                "MessageBody": body,
                "MessageGroupId": uuid.uuid4().hex,
                "MessageDeduplicationId": uuid.uuid4().hex,
            }
            for i in range(n)
        ]
        reply = client.send_message_batch(QueueUrl=url, Entries=entries)
        assert not reply.get("Failed"), reply.get("Failed")

    started = time.perf_counter()
    for first in range(0, count, batch):  # the same batches brokerkit's publish_many gets
        last = min(first + batch, count)
        futures = [pool.submit(send, min(10, last - sent)) for sent in range(first, last, 10)]
        for future in futures:
            future.result()
    return count / (time.perf_counter() - started)


def raw_consume(client: Any, pool: ThreadPoolExecutor, url: str, count: int) -> float:
    got = 0
    started = 0.0
    deletes: list[Future[Any]] = []
    while got < count:
        reply = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=30
        )
        messages = reply.get("Messages") or []
        if not messages:
            continue
        if not started:
            started = time.perf_counter()
        entries = [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
        ]
        deletes.append(pool.submit(client.delete_message_batch, QueueUrl=url, Entries=entries))
        got += len(messages)
    for future in deletes:
        assert not future.result().get("Failed")
    return (count - 1) / (time.perf_counter() - started)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="sqs://?endpoint=http://127.0.0.1:4566&region=us-east-1")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--inflight", type=int, default=16)
    parser.add_argument("--prefetch", type=int, default=32)
    args = parser.parse_args()
    body = "x" * args.size
    client = raw_client(args.url, args.inflight)
    pool = ThreadPoolExecutor(max_workers=args.inflight)
    loop = asyncio.get_running_loop()
    rates: dict[str, list[float]] = {k: [] for k in ("raw_pub", "bk_pub", "raw_con", "bk_con")}
    async with brokerkit.connect(args.url) as broker:
        for round_no in range(args.rounds):
            name = f"bench-raw-{uuid.uuid4().hex[:12]}.fifo"
            attrs = {"FifoQueue": "true", "ContentBasedDeduplication": "false"}
            url = client.create_queue(QueueName=name, Attributes=attrs)["QueueUrl"]
            queue = f"bench-{uuid.uuid4().hex[:12]}"
            n = args.messages
            rates["raw_pub"].append(
                await loop.run_in_executor(None, raw_publish, client, pool, url, n, body, 500)
            )
            rates["bk_pub"].append(await publish_rate(broker, queue, n, body.encode()))
            rates["raw_con"].append(
                await loop.run_in_executor(None, raw_consume, client, pool, url, n)
            )
            rates["bk_con"].append(await consume_rate(broker, queue, n, args.prefetch))
            client.delete_queue(QueueUrl=url)
            await broker.delete_queue(queue)
            print(round_line(round_no, rates), flush=True)
    pool.shutdown()
    ratios = [("publish", "bk_pub", "raw_pub"), ("consume+ack", "bk_con", "raw_con")]
    title = (
        f"{args.rounds} rounds, {args.messages} x {args.size} B messages, "
        f"{args.inflight} raw calls in flight, prefetch {args.prefetch}"
    )
    print("\n" + summary(rates, ratios, title=title))


if __name__ == "__main__":
    asyncio.run(main())
