"""Fixtures of the contract suite: one parametrized ``broker_url``, connections, fresh names."""

from __future__ import annotations

import os
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio

import brokerkit
from contract_tests._faults import add_fault_options
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
    add_fault_options(parser)  # --restart-cmd, --proxy, --cut-seconds, --soak-long, ...


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


@pytest_asyncio.fixture(autouse=True)
async def made_queues(request: pytest.FixtureRequest) -> AsyncIterator[list[str]]:
    """The queues a test made (``queue``, ``new_queue``): deleted on its broker afterwards.

    Autouse, so it is set up first and torn down last: after ``connect`` closed every
    connection (and consumer) of the test. A broker the check runs against keeps no
    topics, streams or keys of ours. A failed delete is a warning, not a failed behaviour.
    """
    made: list[str] = []
    yield made
    if not made or "broker_url" not in request.fixturenames:
        return
    url = request.getfixturevalue("broker_url")
    try:
        async with brokerkit.connect(url) as broker:
            for name in made:
                await broker.delete_queue(name)
    except brokerkit.UnsupportedFeature:
        pass  # a backend without delete_queue: nothing to clean up with
    except Exception as exc:
        warnings.warn(f"could not delete the test queues {made} on {url}: {exc!r}", stacklevel=1)


@pytest.fixture
def new_queue(made_queues: list[str]) -> Callable[[str | None], str]:
    """``new_queue(name=None)``: one more queue for the test (a fresh name unless given)."""

    def make(name: str | None = None) -> str:
        made_queues.append(name or fresh("q"))
        return made_queues[-1]

    return make


@pytest.fixture
def queue(new_queue: Callable[[str | None], str]) -> str:
    return new_queue(None)


@pytest.fixture
def group() -> str:
    return fresh("g")
