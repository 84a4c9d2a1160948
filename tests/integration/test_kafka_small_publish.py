"""A small Kafka publish with nothing else in flight goes at once, not after ``linger``.

librdkafka holds a record up to ``linger.ms`` for more to share its request. A publish of
fewer than 64 records made alone used to wait it out (2.5 ms per lone ``publish()`` with
the default 2 ms); the sender thread (``kafka/_sender.py``) now flushes for it without
blocking the loop. With ``?linger=5`` (seconds, the largest allowed) a publish that
waited out the linger would take 5 s; here it must be confirmed well before. Against the
shared broker (``BROKERKIT_KAFKA_URL``), on a fresh topic deleted after.
"""

from __future__ import annotations

import asyncio
import os

import pytest

pytest.importorskip("confluent_kafka")

import brokerkit
from contract_tests._helpers import fresh

URL = os.environ.get("BROKERKIT_KAFKA_URL", "kafka://127.0.0.1:9092")
LINGER = 5.0
WITHIN = LINGER / 2
"""Half the linger: a publish that waited it out cannot make it."""


async def test_a_lone_small_publish_is_confirmed_without_waiting_out_linger() -> None:
    queue = fresh("small")
    async with brokerkit.connect(f"{URL}?linger={LINGER}&publish_timeout=30") as broker:
        try:
            await broker.open()
        except brokerkit.BrokerUnavailable:
            pytest.fail(f"no Kafka at {URL}", pytrace=False)  # mandatory: never a skip
        try:
            await asyncio.wait_for(broker.declare(queue), 30)  # topic creation: not timed
            for body in (b"one", b"two"):
                result = await asyncio.wait_for(broker.publish(queue, body), WITHIN)
                assert result.id
            several = [brokerkit.Outgoing(b"x%d" % i) for i in range(3)]
            results = await asyncio.wait_for(broker.publish_many(queue, several), WITHIN)
            assert len(results) == 3
        finally:
            await broker.delete_queue(queue)
