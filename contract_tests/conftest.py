"""Fixtures of the contract suite: one parametrized ``broker_url``, connections, fresh names.

``broker_url`` is a :class:`~contract_tests._helpers.SecretURL`: a ``str`` whose
``repr``, ``str()`` and formatting are redacted, so the password shows nowhere pytest
prints it (test ids, tracebacks' locals, assertion messages), while tests hand it to
``brokerkit.connect`` as it is. What pytest prints from other frames (a driver's
locals, strings made from the URL, captured output and logs) is redacted by the hooks
at the end of this file.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import brokerkit

from ._faults import add_fault_options
from ._helpers import SecretURL, fresh

Connect = Callable[..., Awaitable[brokerkit.Broker]]
_Factory = Callable[..., logging.LogRecord]
_FACTORY = pytest.StashKey[_Factory]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("brokerkit")
    group.addoption(
        "--broker-url",
        action="append",
        default=[],
        help="broker URL to run the contract against (repeatable; env BROKERKIT_URLS)",
    )
    group.addoption("--run-slow", action="store_true", help="also run slow tests (long windows)")
    group.addoption(
        "--no-env-urls",
        action="store_true",
        help="ignore BROKERKIT_URLS: only the --broker-url URLs (brokerkit check URL checks URL)",
    )
    add_fault_options(parser)  # --restart-cmd, --proxy, --cut-seconds, --soak-long, ...


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "behaviour(name): the CONTRACT.md behaviour a test proves")
    config.addinivalue_line("markers", "slow: long windows, run with --run-slow")
    try:
        urls = _urls(config)
    except brokerkit.BrokerkitError:
        urls = []  # a bad URL: reported, redacted, when the tests are collected
    config.stash[_FACTORY] = logging.getLogRecordFactory()
    logging.setLogRecordFactory(_redacting_factory(urls, config.stash[_FACTORY]))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _FACTORY in config.stash:  # ``brokerkit check`` runs the suite in its own process
        logging.setLogRecordFactory(config.stash[_FACTORY])


def _urls(config: pytest.Config) -> list[SecretURL]:
    urls: list[str] = list(config.getoption("--broker-url"))
    if not config.getoption("--no-env-urls"):
        env = os.environ.get("BROKERKIT_URLS", "")
        urls += [u.strip() for u in env.split(",") if u.strip()]
    return [SecretURL(u) for u in urls or ["memory://"]]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "broker_url" in metafunc.fixturenames:
        urls = _urls(metafunc.config)
        ids = [u.redacted() for u in urls]
        metafunc.parametrize("broker_url", urls, ids=ids, scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _mark_known_failures(items)
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: pass --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def _mark_known_failures(items: list[pytest.Item]) -> None:
    """Our CI's list of open defects (``BROKERKIT_KNOWN_FAILURES``, e.g. .ci/known-failures):
    each listed test is an expected failure *there*, and nowhere else: ``brokerkit check``
    never reads it, so a user's run reports every failure as it is.

    A line is ``strict|flaky SCHEME TEST-ID-PART  # why, and the issue`` (``*`` in the part
    separates pieces that must all appear in the test's id): ``strict`` makes
    an unexpected pass fail the run (the defect is fixed: take the line out), ``flaky``
    allows either outcome (a defect that shows in some runs only).
    """
    path = os.environ.get("BROKERKIT_KNOWN_FAILURES")
    if not path:
        return
    rules = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        fields = line.split("#", 1)[0].split()
        if fields:
            mode, scheme, part = fields
            rules.append((mode == "strict", scheme, part, line.split("#", 1)[-1].strip()))
    for item in items:
        callspec = getattr(item, "callspec", None)
        url = str(callspec.params.get("broker_url", "")) if callspec is not None else ""
        scheme = url.partition("://")[0]
        for strict, rule_scheme, part, why in rules:
            if rule_scheme == scheme and all(piece in item.nodeid for piece in part.split("*")):
                item.add_marker(pytest.mark.xfail(strict=strict, reason=f"known defect: {why}"))


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
    url: SecretURL = request.getfixturevalue("broker_url")
    try:
        async with brokerkit.connect(url) as broker:
            for name in made:
                await broker.delete_queue(name)
    except brokerkit.UnsupportedFeature:
        pass  # a backend without delete_queue: nothing to clean up with
    except Exception as exc:
        # ``url`` formats redacted; the error's text may come from a driver: redact it too
        problem = url.redact(f"{type(exc).__name__}: {exc}")
        warnings.warn(f"could not delete the test queues {made} on {url}: {problem}", stacklevel=1)


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


def _redact_all(urls: list[SecretURL], text: str) -> str:
    for url in urls:
        text = url.redact(text)
    return text


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Redact what a report prints: the traceback (other frames' locals), captured output."""
    report = yield
    urls = _urls(item.config)
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        report.longrepr = (*longrepr[:2], _redact_all(urls, str(longrepr[2])))
    elif longrepr is not None:
        text = str(longrepr)
        clean = _redact_all(urls, text)
        if clean != text:  # keep pytest's own rendering when there is nothing to hide
            report.longrepr = clean
    report.sections = [(title, _redact_all(urls, body)) for title, body in report.sections]
    return report


def _redacting_factory(urls: list[SecretURL], make: _Factory) -> _Factory:
    """A log record factory whose records' messages are redacted when made.

    So no handler sees a secret: live logging (``--log-cli-level``) and captured logs
    print records as they are, and a client library may log its settings at DEBUG.
    """

    def redacting(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: logging reports it when it is handled
            return record
        clean = _redact_all(urls, message)
        if clean != message:
            record.msg, record.args = clean, None
        return record

    return redacting
