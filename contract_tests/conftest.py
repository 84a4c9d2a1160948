"""Fixtures of the contract suite: one parametrized ``broker_url``, connections, fresh names."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

import brokerkit
from contract_tests._helpers import fresh

Connect = Callable[..., Awaitable[brokerkit.Broker]]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("brokerkit")
    group.addoption(
        "--broker-url",
        action="append",
        default=[],
        help="broker URL to run the contract against (repeatable; env BROKERKIT_URLS)",
    )
    group.addoption("--run-slow", action="store_true", help="also run slow tests (long windows)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "behaviour(name): the CONTRACT.md behaviour a test proves")
    config.addinivalue_line("markers", "slow: long windows, run with --run-slow")


def _urls(config: pytest.Config) -> list[str]:
    urls: list[str] = list(config.getoption("--broker-url"))
    env = os.environ.get("BROKERKIT_URLS", "")
    urls += [u.strip() for u in env.split(",") if u.strip()]
    return urls or ["memory://"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "broker_url" in metafunc.fixturenames:
        urls = _urls(metafunc.config)
        ids = [brokerkit.BrokerURL.parse(u).redacted() for u in urls]
        metafunc.parametrize("broker_url", urls, ids=ids, scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: pass --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest_asyncio.fixture
async def connect(broker_url: str) -> AsyncIterator[Connect]:
    """Open a new connection (to ``broker_url`` unless another URL is given); closed after."""
    opened: list[brokerkit.Broker] = []

    async def _connect(url: str | None = None) -> brokerkit.Broker:
        broker = brokerkit.connect(url or broker_url)
        opened.append(broker)
        await broker.open()
        return broker

    yield _connect
    for broker in reversed(opened):
        await broker.aclose()


@pytest_asyncio.fixture
async def broker(connect: Connect) -> brokerkit.Broker:
    return await connect()


@pytest.fixture
def queue() -> str:
    return fresh("q")


@pytest.fixture
def group() -> str:
    return fresh("g")
