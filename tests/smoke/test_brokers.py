"""Smoke tests: one real round trip per broker, with each broker's own Python client.

Select brokers with BROKERKIT_SMOKE, a comma list of names (or "all"):

    scripts/services up
    BROKERKIT_SMOKE=redis,rabbitmq,nats,kafka,sqs pytest tests/smoke -q

A broker that is not listed is skipped; a listed broker that does not answer
fails.  URLs default to those printed by `scripts/services urls` and can be
overridden per broker with BROKERKIT_<NAME>_URL (e.g. BROKERKIT_KAFKA_URL).
Every wait is bounded by a deadline.

Clients: redis (redis.asyncio), aio-pika, nats-py (JetStream), confluent-kafka,
boto3.
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.parse
import uuid

import pytest

NAMES = ("redis", "rabbitmq", "nats", "kafka", "sqs")
DEFAULT_URLS = {
    "redis": "redis://127.0.0.1:6379/0",
    "rabbitmq": "amqp://guest:guest@127.0.0.1:5672/",
    "nats": "nats://127.0.0.1:4222",
    "kafka": "kafka://127.0.0.1:9092",
    "sqs": "sqs://?endpoint=http://127.0.0.1:4566&region=us-east-1",
}
TIMEOUT = 30.0  # seconds, per test


def _selected() -> set[str]:
    raw = os.environ.get("BROKERKIT_SMOKE", "")
    names = {n.strip().lower() for n in raw.split(",") if n.strip()}
    if "all" in names:
        return set(NAMES)
    unknown = names - set(NAMES)
    if unknown:
        raise pytest.UsageError(
            f"BROKERKIT_SMOKE: unknown broker(s) {sorted(unknown)}; choose from {NAMES}"
        )
    return names


def _url(name: str) -> str:
    return os.environ.get(f"BROKERKIT_{name.upper()}_URL") or DEFAULT_URLS[name]


def _need(name: str) -> str:
    if name not in _selected():
        pytest.skip(f"{name} not in BROKERKIT_SMOKE={os.environ.get('BROKERKIT_SMOKE', '')!r}")
    return _url(name)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def test_redis_stream_round_trip() -> None:
    url = _need("redis")
    import redis.asyncio as aioredis

    async def go() -> None:
        r = aioredis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        stream = _unique("smoke:stream")
        try:
            assert await r.ping()
            await r.xgroup_create(stream, "g", id="0", mkstream=True)
            sent = await r.xadd(stream, {"body": b"hello"})
            got = await r.xreadgroup("g", "c1", {stream: ">"}, count=1, block=5000)
            assert got, "XREADGROUP returned nothing within 5 s"
            ((_key, entries),) = got
            entry_id, fields = entries[0]
            assert entry_id == sent and fields[b"body"] == b"hello"
            assert await r.xack(stream, "g", entry_id) == 1
        finally:
            await r.delete(stream)
            await r.aclose()

    asyncio.run(asyncio.wait_for(go(), TIMEOUT))


def test_rabbitmq_publish_confirm_consume() -> None:
    url = _need("rabbitmq")
    import aio_pika

    async def go() -> None:
        conn = await aio_pika.connect(url, timeout=10)
        try:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(_unique("smoke"), exclusive=True, auto_delete=True)
            body = uuid.uuid4().bytes
            await ch.default_exchange.publish(
                aio_pika.Message(body), routing_key=q.name
            )  # waits for the confirm
            deadline = time.monotonic() + 10
            msg = None
            while msg is None and time.monotonic() < deadline:
                msg = await q.get(no_ack=False, fail=False, timeout=5)
                if msg is None:
                    await asyncio.sleep(0.05)
            assert msg is not None, "message not delivered within 10 s"
            assert msg.body == body
            await msg.ack()
            # the project relies on this plugin; scripts/services enables it offline
            ex = await ch.declare_exchange(
                _unique("smoke-chash"), "x-consistent-hash", auto_delete=True
            )
            await ex.delete()
        finally:
            await conn.close()

    asyncio.run(asyncio.wait_for(go(), TIMEOUT))


def test_nats_jetstream_publish_dedup_fetch_ack() -> None:
    url = _need("nats")
    import nats
    from nats.js.api import StreamConfig

    async def go() -> None:
        nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
        js = nc.jetstream(timeout=5)
        name = _unique("SMOKE").replace("-", "_")
        subject = f"smoke.{name}"
        try:
            await js.add_stream(StreamConfig(name=name, subjects=[subject]))
            ack = await js.publish(subject, b"hello", headers={"Nats-Msg-Id": "m1"})
            dup = await js.publish(subject, b"hello", headers={"Nats-Msg-Id": "m1"})
            assert not ack.duplicate and dup.duplicate and dup.seq == ack.seq
            sub = await js.pull_subscribe(subject, durable="smoke")
            msgs = await sub.fetch(1, timeout=5)
            assert [m.data for m in msgs] == [b"hello"]
            assert msgs[0].metadata.num_delivered == 1
            await msgs[0].ack_sync()
        finally:
            try:
                await js.delete_stream(name)
            finally:
                await nc.close()

    asyncio.run(asyncio.wait_for(go(), TIMEOUT))


def test_kafka_produce_consume_fresh_topic() -> None:
    url = _need("kafka")
    from confluent_kafka import Consumer, KafkaException, Producer
    from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

    bootstrap = urllib.parse.urlsplit(url).netloc
    deadline = time.monotonic() + TIMEOUT
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})
    topic = _unique("smoke")
    admin.create_topics(
        [NewTopic(topic, num_partitions=1, replication_factor=1)],
        operation_timeout=15,
        request_timeout=15,
    )[topic].result(timeout=20)
    try:
        # the broker must not invent topics on first use (the project creates them explicitly)
        res = ConfigResource(ConfigResource.Type.BROKER, "1")
        cfg = admin.describe_configs([res], request_timeout=10)[res].result(timeout=15)
        assert cfg["auto.create.topics.enable"].value == "false"

        producer = Producer(
            {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
        )
        errors: list = []
        producer.produce(
            topic,
            key=b"k",
            value=b"hello",
            headers=[("h", b"1")],
            on_delivery=lambda err, _msg: errors.append(err),
        )
        assert producer.flush(15) == 0, "produce not delivered within 15 s"
        assert errors == [None]

        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": _unique("smoke-group"),
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        try:
            consumer.subscribe([topic])
            msg = None
            while msg is None and time.monotonic() < deadline:
                m = consumer.poll(0.5)
                if m is not None:
                    if m.error():
                        raise KafkaException(m.error())
                    msg = m
            assert msg is not None, "nothing consumed before the deadline"
            assert (msg.key(), msg.value(), msg.headers()) == (b"k", b"hello", [("h", b"1")])
            consumer.commit(message=msg, asynchronous=False)
        finally:
            consumer.close()
    finally:
        admin.delete_topics([topic], operation_timeout=10)[topic].result(timeout=15)


def test_sqs_fifo_send_receive_delete() -> None:
    url = _need("sqs")
    import boto3
    from botocore.config import Config

    q = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)
    sqs = boto3.client(
        "sqs",
        endpoint_url=q["endpoint"][0],
        region_name=q.get("region", ["us-east-1"])[0],
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(connect_timeout=5, read_timeout=10, retries={"max_attempts": 2}),
    )
    qurl = sqs.create_queue(
        QueueName=_unique("smoke") + ".fifo",
        Attributes={"FifoQueue": "true", "VisibilityTimeout": "30"},
    )["QueueUrl"]
    try:
        for body in ("first", "second"):
            sqs.send_message(
                QueueUrl=qurl, MessageBody=body, MessageGroupId="g", MessageDeduplicationId=body
            )
        # a duplicate within the 5-minute window is accepted but not delivered
        sqs.send_message(
            QueueUrl=qurl, MessageBody="first", MessageGroupId="g", MessageDeduplicationId="first"
        )
        bodies: list[str] = []
        deadline = time.monotonic() + TIMEOUT - 5
        while len(bodies) < 2 and time.monotonic() < deadline:
            resp = sqs.receive_message(
                QueueUrl=qurl, MaxNumberOfMessages=1, WaitTimeSeconds=1, AttributeNames=["All"]
            )
            for m in resp.get("Messages", []):
                assert m["Attributes"]["MessageGroupId"] == "g"
                bodies.append(m["Body"])
                sqs.delete_message(QueueUrl=qurl, ReceiptHandle=m["ReceiptHandle"])
        assert bodies == ["first", "second"]
        extra = sqs.receive_message(QueueUrl=qurl, MaxNumberOfMessages=10, WaitTimeSeconds=1).get(
            "Messages", []
        )
        assert extra == [], "the duplicate was delivered"
    finally:
        sqs.delete_queue(QueueUrl=qurl)
