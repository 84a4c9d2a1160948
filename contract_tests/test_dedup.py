"""Deduplication (CONTRACT section 6)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

import brokerkit

from ._helpers import (
    WAIT,
    Child,
    eventually,
    in_process,
    nothing_within,
    quiet_for,
    receive,
    receive_n,
    with_param,
)
from .conftest import Connect


@pytest.mark.behaviour("dedup")
async def test_dedup_same_id_is_delivered_once_even_after_ack(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    first = await broker.publish(queue, b"event", dedup_id="order-42")
    again = await broker.publish(queue, b"event", dedup_id="order-42")
    assert first.duplicate in (False, None)
    assert again.duplicate in (True, None)
    if again.duplicate:
        assert again.id == first.id
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        assert (msg.id, msg.dedup_id) == (first.id, "order-42")
        await msg.ack()
        late = await broker.publish(queue, b"event", dedup_id="order-42")  # after the ack
        assert late.duplicate in (True, None)
        await broker.publish(queue, b"sentinel")
        nxt = await receive(consumer)
        assert nxt.body == b"sentinel", f"duplicate delivered: {nxt!r}"
        await nxt.ack()
        assert await nothing_within(consumer, quiet_for(broker, 1.0)) is None


@pytest.mark.behaviour("dedup")
async def test_dedup_ids_are_per_queue_and_absent_ids_never_dedup(
    broker: brokerkit.Broker, queue: str, group: str, new_queue: Callable[[str | None], str]
) -> None:
    other = new_queue(queue + "-other")  # a name that starts with the other's
    await broker.publish(queue, b"a", dedup_id="same")
    await broker.publish(other, b"b", dedup_id="same")
    await broker.publish(queue, b"plain")
    await broker.publish(queue, b"plain")
    async with broker.consumer(other, group) as consumer:
        msg = await receive(consumer)
        assert msg.body == b"b"
        await msg.ack()
    async with broker.consumer(queue, group) as consumer:
        bodies = sorted(m.body for m in await receive_n(consumer, 3))
        assert bodies == [b"a", b"plain", b"plain"]


SHORT_WINDOW = 2.0
"""The window the suite configures where ``dedup_window_configurable``."""


def _expiry_margin(window: float) -> float:
    """How long after its end the suite waits before it expects a window to be over.

    A broker may forget expired ids in a periodic sweep rather than at the exact instant
    (ElasticMQ, the SQS emulator, sweeps once a second): 1 % of the window, at least 0.5 s.
    The window is measured from the moment the first publish *returned* (the broker
    started it no later than that), so a slow publish cannot make the test early.
    """
    return max(0.5, window * 0.01)


async def _windowed(
    request: pytest.FixtureRequest, broker_url: str, connect: Connect
) -> tuple[brokerkit.Broker, float]:
    """A connection with a short dedup window where it is configurable, else the broker's own.

    The broker's own (fixed) window is long (SQS: 300 s): such a test is slow and runs with
    ``--run-slow``, which ``brokerkit check`` and ``scripts/test-all`` always pass.
    """
    probe = await connect()
    if probe.capabilities.dedup_window_configurable:
        broker = await connect(with_param(broker_url, "dedup_window", f"{SHORT_WINDOW:g}"))
        assert broker.capabilities.dedup_window == SHORT_WINDOW
        return broker, SHORT_WINDOW
    if not request.config.getoption("--run-slow"):
        pytest.skip("slow: the broker fixes its dedup window; pass --run-slow")
    return probe, probe.capabilities.dedup_window


@pytest.mark.behaviour("dedup window")
async def test_dedup_window_expires_and_the_id_is_delivered_again(
    request: pytest.FixtureRequest, broker_url: str, connect: Connect, queue: str, group: str
) -> None:
    broker, window = await _windowed(request, broker_url, connect)
    await broker.publish(queue, b"one", dedup_id="tick")
    published = time.monotonic()  # the window began before this
    await broker.publish(queue, b"dup", dedup_id="tick")  # inside the window
    await _expect_redelivery_after(broker, queue, group, published, window)


@pytest.mark.behaviour("dedup window")
async def test_dedup_window_is_fixed_from_the_first_publish_not_sliding(
    request: pytest.FixtureRequest, broker_url: str, connect: Connect, queue: str, group: str
) -> None:
    """Repeats inside the window do not extend it; many ids expiring at once all expire."""
    broker, window = await _windowed(request, broker_url, connect)
    ids = [f"exp-{i}" for i in range(6)]
    started = time.monotonic()  # no window began before this
    for dedup_id in ids:
        await broker.publish(queue, b"one", dedup_id=dedup_id)
    published = time.monotonic()  # every window began before this
    await eventually(
        lambda: time.monotonic() > started + window * 0.6,
        timeout=window + WAIT,
        what="0.6 window",
    )
    repeated = await broker.publish(queue, b"dup", dedup_id=ids[0])  # would slide a sliding window
    assert repeated.duplicate in (True, None)
    await eventually(
        lambda: time.monotonic() > published + window + _expiry_margin(window),
        timeout=window + WAIT,
        what="window",
    )
    async with broker.consumer(queue, group) as consumer:
        first = sorted(m.dedup_id or "" for m in await receive_n(consumer, len(ids)))
        assert first == sorted(ids)
        for dedup_id in reversed(ids):  # last in first: expiry must not stop at the oldest
            again = await broker.publish(queue, b"two", dedup_id=dedup_id)
            assert again.duplicate in (False, None), f"{dedup_id} outlived its window"
        second = await receive_n(consumer, len(ids))
        assert sorted(m.dedup_id or "" for m in second) == sorted(ids)
        assert {m.body for m in second} == {b"two"}, "a repeat inside the window was delivered"


async def _expect_redelivery_after(
    broker: brokerkit.Broker, queue: str, group: str, published: float, window: float
) -> None:
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        assert msg.body == b"one"
        await msg.ack()
        # the condition is the clock itself: the window must have passed
        await eventually(
            lambda: time.monotonic() > published + window + _expiry_margin(window),
            timeout=window + WAIT,
            what="the dedup window to pass",
        )
        again = await broker.publish(queue, b"two", dedup_id="tick")
        assert again.duplicate in (False, None)
        msg = await receive(consumer)
        assert msg.body == b"two" and msg.dedup_id == "tick"
        await msg.ack()


@pytest.mark.behaviour("dedup race")
async def test_dedup_race_concurrent_publishers_give_one_delivery(
    connect: Connect, queue: str, group: str
) -> None:
    conns = [await connect() for _ in range(3)]
    tasks = [
        conns[i % 3].publish(queue, b"raced", dedup_id="race-1", headers={"n": str(i)})
        for i in range(12)
    ]
    results = await asyncio.gather(*tasks)
    assert sum(1 for r in results if r.duplicate is False) <= 1
    await _exactly_one_raced(conns[0], queue, group)


@pytest.mark.behaviour("dedup race")
async def test_dedup_race_from_several_processes_gives_one_delivery(
    broker_url: str, broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """Four processes, each with its own connection, publish one dedup id at the same moment.

    ``memory://`` is in-process: no other process can reach its broker, so there four
    connections of this process race instead (one event loop: the coroutine race above
    is all the interleaving it can have).
    """
    if in_process(broker_url):
        conns = [brokerkit.connect(broker_url) for _ in range(4)]
        try:
            await asyncio.gather(*(c.open() for c in conns))
            await asyncio.gather(
                *(c.publish(queue, b"raced", dedup_id="race-p") for c in conns for _ in range(3))
            )
        finally:
            await asyncio.gather(*(c.aclose() for c in conns))
    else:
        children = [await Child.start("race", broker_url, queue, "race-p", "3") for _ in range(4)]
        try:
            for child in children:
                assert await child.line() == "ready"
            for child in children:
                child.send("go")
            said = [await child.line() for child in children]
        finally:
            for child in children:
                await child.reap()
        winners = sum(int(line.split()[1]) for line in said)
        assert winners <= 1, f"{winners} publishes said duplicate=False: {said}"
    await _exactly_one_raced(broker, queue, group)


async def _exactly_one_raced(broker: brokerkit.Broker, queue: str, group: str) -> None:
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        assert msg.body == b"raced"
        await msg.ack()
        await broker.publish(queue, b"sentinel")
        nxt = await receive(consumer)
        assert nxt.body == b"sentinel", f"a raced duplicate was delivered: {nxt!r}"
        await nxt.ack()
        assert await nothing_within(consumer, quiet_for(broker, 1.0)) is None
