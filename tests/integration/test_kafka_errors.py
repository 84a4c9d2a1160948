"""Kafka's one error shape against the shared broker: what the broker refuses comes out as
``BrokerRefused`` with Kafka's own error name, and the capabilities stay the object the
backend was built with. Fresh names; nothing is left behind (the refused topics are
never created).

    BROKERKIT_KAFKA_URL=kafka://127.0.0.1:9092 pytest tests/integration/test_kafka_errors.py
"""

from __future__ import annotations

import os
import uuid

import pytest

pytest.importorskip("confluent_kafka")

import brokerkit
from brokerkit.backends import BrokerRefused

URL = os.environ.get("BROKERKIT_KAFKA_URL", "kafka://127.0.0.1:9092")


async def test_a_topic_the_broker_cannot_create_is_refused_with_its_code() -> None:
    # one registered broker cannot hold three replicas: the broker answers no
    async with brokerkit.connect(f"{URL}?replication_factor=3") as broker:
        try:
            await broker.open()
        except brokerkit.BrokerUnavailable:
            pytest.fail(f"no Kafka at {URL}", pytrace=False)  # mandatory: never a skip
        capabilities = broker.capabilities
        with pytest.raises(BrokerRefused) as info:
            await broker.publish(f"refused-{uuid.uuid4().hex[:8]}", b"x")
        assert info.value.code == "INVALID_REPLICATION_FACTOR"
        assert isinstance(info.value.__cause__, Exception)  # the driver's error, kept
        assert broker.capabilities is capabilities  # fixed at construction
