"""A Kafka publish of plain records: ``produce_batch`` calls (``produce_plain``).

Their delivery reports carry no index, so each chunk of ``MESSAGE_SET`` records goes to
one partition (``PartitionTurn``) and the reports are matched to them by offset.
Here every result id must name the record that was published with it (read back by
id), for single calls, concurrent ones, and a call that librdkafka's queue could take
only part of (the rest go one by one). Against the shared broker
(``BROKERKIT_KAFKA_URL``), on fresh topics deleted after.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

import pytest

pytest.importorskip("confluent_kafka")

import brokerkit
from brokerkit.backends.kafka import KafkaBackend
from brokerkit.backends.kafka._produce import MESSAGE_SET
from contract_tests._helpers import fresh, receive_n

URL = os.environ.get("BROKERKIT_KAFKA_URL", "kafka://127.0.0.1:9092")


def _bodies(tag: str, n: int) -> list[brokerkit.Outgoing]:
    return [brokerkit.Outgoing(f"{tag}-{i}".encode()) for i in range(n)]


async def _check_ids(
    broker: brokerkit.Broker,
    queue: str,
    calls: Sequence[tuple[list[brokerkit.Outgoing], list[brokerkit.PublishResult]]],
) -> None:
    """Every result's id is the id its own record is delivered with."""
    want = {}
    for messages, results in calls:
        assert len(results) == len(messages)
        for message, result in zip(messages, results, strict=True):
            want[result.id] = message.body
    total = sum(len(m) for m, _ in calls)
    assert len(want) == total, "two records got the same id"
    async with broker.consumer(queue, fresh("g")) as consumer:
        got = {m.id: m.body for m in await receive_n(consumer, total, timeout=60)}
    wrong = [i for i, body in want.items() if got.get(i) != body]
    assert not wrong, f"{len(wrong)} ids name another record, e.g. {wrong[:3]}"


async def test_each_plain_call_gets_the_ids_of_its_own_records() -> None:
    queue = fresh("plain")
    async with brokerkit.connect(URL) as broker:
        try:
            await broker.open()
        except brokerkit.BrokerUnavailable:
            pytest.fail(f"no Kafka at {URL}", pytrace=False)  # mandatory: never a skip
        try:
            calls = []
            for tag, n in (("one", 1), ("big", 1200)):
                messages = _bodies(tag, n)
                calls.append((messages, await broker.publish_many(queue, messages)))
            concurrent = [_bodies(f"c{k}", 500) for k in range(4)]
            results = await asyncio.gather(*(broker.publish_many(queue, m) for m in concurrent))
            calls += list(zip(concurrent, results, strict=True))
            for _, call_results in calls:  # one partition per MESSAGE_SET records
                chunks = (len(call_results) + MESSAGE_SET - 1) // MESSAGE_SET
                assert len({r.id.split("-")[0] for r in call_results}) == chunks
            await _check_ids(broker, queue, calls)
        finally:
            await broker.delete_queue(queue)


async def test_records_a_full_queue_did_not_take_follow_one_by_one_with_their_own_ids() -> None:
    servers = URL.removeprefix("kafka://").split("?")[0]
    # librdkafka's queue holds 100 records: produce_batch (one C loop) takes at most 100
    # of a call of 500, the rest wait for room and go one by one
    backend = KafkaBackend.from_client(
        {"bootstrap.servers": servers, "queue.buffering.max.messages": 100}
    )
    queue = fresh("full")
    async with brokerkit.from_backend(backend) as broker:
        try:
            messages = _bodies("full", 500)
            results = await asyncio.wait_for(broker.publish_many(queue, messages), 60)
            await _check_ids(broker, queue, [(messages, results)])
        finally:
            await broker.delete_queue(queue)
