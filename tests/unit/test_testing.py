"""brokerkit.testing, used as docs/service.md shows it."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

import brokerkit
from brokerkit.testing import (
    assert_dead_lettered,
    fresh_broker,
    memory_url,
    run_until_idle,
    take_one,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


async def test_a_blocked_recipient_goes_to_the_dlq() -> None:  # the docs' example, verbatim
    from examples.email_worker import app

    url = memory_url()
    async with brokerkit.connect(url) as broker:
        await broker.publish("emails", b'{"to": "x@blocked.example", "name": "x"}')
        await run_until_idle(app, url=url)
        await assert_dead_lettered(broker, "emails", reason="recipient blocked")


async def test_fresh_brokers_are_isolated_and_take_one_takes_exactly_one() -> None:
    async with fresh_broker() as one, fresh_broker() as other:
        await one.publish("q", b"a")
        await one.publish("q", b"b")
        assert (await take_one(one, "q")).body == b"a"
        assert (await take_one(one, "q")).body == b"b"
        with pytest.raises(AssertionError, match="no message"):
            await take_one(other, "q", timeout=0.2)


async def test_assert_dead_lettered_fails_clearly() -> None:
    async with fresh_broker() as broker:
        with pytest.raises(AssertionError, match="no dead letter"):
            await assert_dead_lettered(broker, "q", timeout=0.2)
        await broker.publish("q", b"x")
        async with broker.consumer("q") as consumer:
            msg = await consumer.__anext__()
            await msg.dead_letter("because")
        with pytest.raises(AssertionError, match="does not contain"):
            await assert_dead_lettered(broker, "q", reason="something else")


async def test_run_until_idle_fails_when_the_app_never_settles() -> None:
    url = memory_url()
    app = brokerkit.App(url)

    @app.handler("q")
    async def forever(body: bytes) -> None:
        await asyncio.sleep(30)

    await app.publish("q", b"x")
    with pytest.raises(AssertionError, match="still busy"):
        await run_until_idle(app, timeout=0.5)
