"""The NATS backend on the shared test server (``BROKERKIT_NATS_URL``, default
nats://127.0.0.1:4222), for tests that drive it through the Receiver API."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

import brokerkit
from brokerkit.backends.nats import NatsBackend

URL = os.environ.get("BROKERKIT_NATS_URL", "nats://127.0.0.1:4222")


@pytest.fixture(name="backend")
async def nats_backend() -> AsyncIterator[NatsBackend]:
    """``backend``: an open backend; the test is skipped when no server answers at ``URL``."""
    b = NatsBackend.from_url(brokerkit.BrokerURL.parse(URL))
    try:
        await b.open()
    except brokerkit.BrokerUnavailable:
        await b.aclose()
        pytest.skip("no NATS server at the test URL")
    try:
        yield b
    finally:
        await b.aclose()
