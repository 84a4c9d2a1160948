"""The Redis backend on the shared test Redis (``BROKERKIT_REDIS_URL``, default
127.0.0.1:6379/0), for tests that drive it directly."""

from __future__ import annotations

import os

import pytest

import brokerkit
from brokerkit.backends.redis_streams import RedisBackend

BASE_URL = os.environ.get("BROKERKIT_REDIS_URL", "redis://127.0.0.1:6379/0")


def url_with(query: str) -> brokerkit.BrokerURL:
    """``BASE_URL`` with the options ``query`` (``name=value&…``) added."""
    sep = "&" if "?" in BASE_URL else "?"
    return brokerkit.BrokerURL.parse(f"{BASE_URL}{sep}{query}" if query else BASE_URL)


async def opened_backend(url: brokerkit.BrokerURL) -> RedisBackend:
    """An open backend on ``url``; the test fails (never skips) when no Redis answers."""
    backend = RedisBackend.from_url(url)
    try:
        await backend.open()
    except brokerkit.BrokerUnavailable:
        await backend.aclose()
        pytest.fail(f"no Redis at {url.redacted()}", pytrace=False)  # mandatory: never a skip
    return backend
