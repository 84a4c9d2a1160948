"""Raw aio-pika vs brokerkit on RabbitMQ quorum queues, in one run: publish and consume+ack.

    python benchmarks/bench_rabbitmq.py [--url amqp://guest:guest@127.0.0.1:5672/]
                                        [--messages 20000] [--rounds 5] [--size 100]
                                        [--batch 500]

Raw aio-pika at best practice, on the queue type brokerkit uses (a quorum queue with the
same arguments): publish = a confirm channel, ``--batch`` persistent mandatory
``exchange.publish`` calls gathered at once (up to 500 confirms in flight), batch after
batch; consume+ack = ``set_qos(prefetch_count=--batch)``, a consumer callback that does
``await message.ack()`` per message. brokerkit: ``brokerkit._bench`` (the loops
``brokerkit bench`` runs: ``publish_many`` in batches of 500, ``async for msg`` +
``await msg.ack()`` with ``prefetch=--batch``). Rounds alternate raw and brokerkit on
fresh queues, deleted after; medians, spread and ratios are printed. When py-amqp
(Kombu's transport, ``pip install amqp``) is importable, a third consume series runs it
(synchronous, in a thread, ``basic_ack`` per message) on the same kind of queue.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import aio_pika

import brokerkit
from brokerkit._bench import consume_rate, publish_rate, round_line, summary
from brokerkit.backends.rabbitmq._topology import quorum_arguments


async def raw_publish(
    channel: aio_pika.abc.AbstractChannel, queue: str, count: int, body: bytes, batch: int
) -> float:
    exchange = channel.default_exchange
    started = time.perf_counter()
    sent = 0
    while sent < count:
        n = min(batch, count - sent)
        await asyncio.gather(
            *(
                exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=queue,
                    mandatory=True,
                )
                for _ in range(n)
            )
        )
        sent += n
    return count / (time.perf_counter() - started)


async def raw_consume(
    connection: aio_pika.abc.AbstractConnection, queue: str, count: int, batch: int
) -> float:
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=batch)
    q = await channel.get_queue(queue, ensure=False)
    done = asyncio.get_running_loop().create_future()
    got = 0
    started = 0.0

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        nonlocal got, started
        if not started:
            started = time.perf_counter()
        await message.ack()
        got += 1
        if got == count and not done.done():
            done.set_result(time.perf_counter())

    tag = await q.consume(on_message)
    ended = await done
    await q.cancel(tag)
    await channel.close()
    return float((count - 1) / (ended - started))


def pyamqp_consume(url: brokerkit.BrokerURL, queue: str, count: int, batch: int) -> float:
    """py-amqp (Kombu's transport), synchronous: basic_consume, basic_ack per message."""
    import amqp  # type: ignore[import-untyped]  # optional: pip install amqp

    host = url.hosts[0] if url.hosts else None
    conn = amqp.Connection(
        f"{host.host}:{host.port or 5672}" if host else "127.0.0.1:5672",
        userid=url.username or "guest",
        password=url.password or "guest",
    )
    conn.connect()
    channel = conn.channel()
    channel.basic_qos(0, batch, False)
    got = 0
    started = ended = 0.0

    def on_message(message: amqp.Message) -> None:
        nonlocal got, started, ended
        if not started:
            started = time.perf_counter()
        channel.basic_ack(message.delivery_tag)
        got += 1
        if got == count:
            ended = time.perf_counter()

    channel.basic_consume(queue, callback=on_message)
    while got < count:
        conn.drain_events(timeout=10)
    conn.close()
    return (count - 1) / (ended - started)


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    body = b"x" * args.size
    connection = await aio_pika.connect(brokerkit.BrokerURL.parse(args.url).render())
    channel = await connection.channel(publisher_confirms=True)
    try:
        import amqp  # noqa: F401 - does the py-amqp series run
    except ImportError:
        with_pyamqp = False
    else:
        with_pyamqp = True
    series = ["raw_pub", "bk_pub", "raw_con", "bk_con"] + (["pyamqp_con"] if with_pyamqp else [])
    rates: dict[str, list[float]] = {k: [] for k in series}
    parsed = brokerkit.BrokerURL.parse(args.url)
    async with brokerkit.connect(args.url) as broker:
        for round_no in range(args.rounds):
            tag = uuid.uuid4().hex[:12]
            raw_queue, queue = f"benchraw.{tag}", f"bench-{tag}"
            await channel.declare_queue(
                raw_queue, durable=True, arguments=quorum_arguments(single_active=False)
            )
            rates["raw_pub"].append(
                await raw_publish(channel, raw_queue, args.messages, body, args.batch)
            )
            rates["bk_pub"].append(await publish_rate(broker, queue, args.messages, body))
            rates["raw_con"].append(
                await raw_consume(connection, raw_queue, args.messages, args.batch)
            )
            rates["bk_con"].append(await consume_rate(broker, queue, args.messages, args.batch))
            if with_pyamqp:
                await raw_publish(channel, raw_queue, args.messages, body, args.batch)
                rates["pyamqp_con"].append(
                    await asyncio.to_thread(
                        pyamqp_consume, parsed, raw_queue, args.messages, args.batch
                    )
                )
            await channel.queue_delete(raw_queue)
            await broker.delete_queue(queue)
            print(round_line(round_no, rates), flush=True)
    await connection.close()
    ratios = [("publish", "bk_pub", "raw_pub"), ("consume+ack", "bk_con", "raw_con")]
    if with_pyamqp:
        ratios.append(("consume+ack vs py-amqp", "bk_con", "pyamqp_con"))
    title = f"{args.rounds} rounds, {args.messages} x {args.size} B messages"
    print("\n" + summary(rates, ratios, title=title))


if __name__ == "__main__":
    asyncio.run(main())
