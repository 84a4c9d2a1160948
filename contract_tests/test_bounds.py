"""Every declared bound asserted: each ``capabilities`` figure and each API bound.

A figure of ``capabilities`` is a promise: each has a test here that fails when the
backend exceeds it by more than a stated margin (:data:`COVERS` names it, and
``tests/unit/test_bounds_listed.py`` fails on a field without one). Times are measured
from the moment a redelivery became due (the ``nack`` call, the lease's end), never
from the consumer's own poll, against ``redelivery_slack`` plus ``LATE`` (this
machine's scheduling and one round trip). Each API bound has a test at the bound
and one past it; one past raises its specific error before any I/O (a broker at a
port nobody listens on refuses it at once).

A "nothing arrives within X" check here is a bounded wait by design: the absence of a
delivery can only be watched for a while, and X is sized from ``capabilities``.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import brokerkit

from ._helpers import (
    EARLY,
    LATE,
    WAIT,
    absence_window,
    eventually,
    nothing_within,
    receive,
    receive_n,
    redelivery_deadline,
    with_param,
)
from .conftest import Connect
from .test_limits_errors import _dead_url

COVERS: dict[str, tuple[str, ...]] = {
    "max_message_bytes": ("test_bound_body_at_max_message_bytes_and_one_past",),
    "dedup_window": ("test_bound_dedup_window_holds_then_ends_within_its_margin",),
    "dedup_window_configurable": ("test_bound_dedup_window_option_is_honoured_or_refused",),
    "fan_out": ("test_bound_fan_out_copies_to_every_group_or_refuses_a_second",),
    "max_headers": ("test_bound_header_count_at_max_headers_and_one_past",),
    "max_header_bytes": ("test_bound_header_utf8_bytes_at_max_header_bytes_and_one_past",),
    "max_nack_delay": ("test_bound_nack_delay_at_max_nack_delay_and_one_past",),
    "redelivery_slack": (
        "test_bound_redelivery_after_nack_zero_within_slack",
        "test_bound_redelivery_after_nack_delay_within_slack",
        "test_bound_redelivery_after_lease_expiry_within_slack",
    ),
    "ack_flush_interval": ("test_bound_ack_is_recorded_within_ack_flush_interval",),
    "browse": ("test_bound_browse_limit_and_no_side_effects_or_refusal",),
}
"""Which test proves each ``Capabilities`` field (``extras`` is exempt: it holds
broker-specific read-outs that promise nothing the contract states)."""

EXEMPT = {"extras": "broker-specific read-outs, documented per backend; no contract bound"}

_Refused = Callable[[Awaitable[object]], Awaitable[None]]


def _unreachable(broker_url: str) -> brokerkit.Broker:
    """An unopened broker at a port nobody listens on (memory://: an unopened one).

    Whatever it refuses at once was refused before any I/O: any I/O would retry, then
    raise BrokerUnavailable instead of the error the test expects.
    """
    dead = _dead_url(broker_url)
    return brokerkit.connect(dead[0] if dead else broker_url)


async def _refused_before_io(
    broker_url: str, error: type[Exception], *calls: Callable[[brokerkit.Broker], object]
) -> None:
    """Each of ``calls`` raises ``error`` on a broker nobody listens for, within 5 s."""
    broker = _unreachable(broker_url)
    try:
        for call in calls:
            with pytest.raises(error):
                result = call(broker)
                if asyncio.iscoroutine(result):
                    await asyncio.wait_for(result, 5.0)
    finally:
        await broker.aclose()


async def _only(broker: brokerkit.Broker, queue: str, group: str, bodies: list[bytes]) -> None:
    """The queue holds exactly ``bodies`` (any order) and then a sentinel: nothing refused
    was published. The wait for "nothing more" is bounded by design."""
    await broker.publish(queue, b"sentinel")
    async with broker.consumer(queue, group) as consumer:
        got = [m.body for m in await receive_n(consumer, len(bodies) + 1)]
        assert sorted(got) == sorted([*bodies, b"sentinel"]), got
        extra = await nothing_within(consumer, 0.5)
        assert extra is None, f"a refused message was published: {extra!r}"


# -- sizes: body, headers --------------------------------------------------------------


@pytest.mark.behaviour("limits")
async def test_bound_body_at_max_message_bytes_and_one_past(
    broker_url: str, broker: brokerkit.Broker, queue: str, group: str
) -> None:
    limit = broker.capabilities.max_message_bytes
    assert limit >= 256 * 1024
    past = b"\0" * (limit + 1)
    await _refused_before_io(
        broker_url,
        brokerkit.MessageTooLarge,
        lambda b: b.publish(queue, past),
        lambda b: b.publish_many(queue, [brokerkit.Outgoing(past)]),
    )
    with pytest.raises(brokerkit.MessageTooLarge):  # the first publish to the queue
        await broker.publish(queue, past)
    at = os.urandom(limit)
    await broker.publish(queue, at)
    with pytest.raises(brokerkit.MessageTooLarge):  # a later one (the queue's fast path)
        await broker.publish(queue, past)
    with pytest.raises(brokerkit.MessageTooLarge):
        await broker.publish_many(queue, [brokerkit.Outgoing(b"ok"), brokerkit.Outgoing(past)])
    await broker.publish(queue, bytearray(at))  # type: ignore[arg-type]  # bytes-like: the same
    async with broker.consumer(queue, group) as consumer:
        got = await receive_n(consumer, 2)
    assert [m.body for m in got] == [at, at]


def _headers_of_bytes(total: int, count: int = 1) -> dict[str, str]:
    """``count`` headers of ``total`` UTF-8 bytes in all, mostly 2-byte characters, so
    the characters number far fewer than the bytes."""
    keys = [f"h-é{i:02d}" for i in range(count)]  # 'é' counts 2 bytes in a name too
    left = total - sum(len(k.encode()) for k in keys)
    headers = {}
    for i, key in enumerate(keys):
        share = left // count + (1 if i < left % count else 0)
        headers[key] = "é" * (share // 2) + "a" * (share % 2)
    assert sum(len(k.encode()) + len(v.encode()) for k, v in headers.items()) == total
    return headers


@pytest.mark.behaviour("limits")
async def test_bound_header_utf8_bytes_at_max_header_bytes_and_one_past(
    broker_url: str, broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """Header size is UTF-8 bytes of names and values, never characters."""
    limit = broker.capabilities.max_header_bytes
    assert limit >= 8192
    at = _headers_of_bytes(limit, count=4)
    past = _headers_of_bytes(limit + 1, count=4)
    # characters well under the bound, bytes one past it
    assert sum(len(k) + len(v) for k, v in past.items()) < limit * 0.6
    non_ascii_name = {"ключ" * 8: "é" * ((limit - len(("ключ" * 8).encode())) // 2 + 1)}
    cases = [past, non_ascii_name, _headers_of_bytes(limit + 1)]
    await _refused_before_io(
        broker_url,
        brokerkit.InvalidMessage,
        *[lambda b, h=h: b.publish(queue, b"x", headers=h) for h in cases],
    )
    for headers in cases:
        with pytest.raises(brokerkit.InvalidMessage):
            await broker.publish(queue, b"x", headers=headers)
    await broker.publish(queue, b"at", headers=at)
    for headers in cases:  # a later publish to the queue: the same bound
        with pytest.raises(brokerkit.InvalidMessage):
            await broker.publish(queue, b"x", headers=headers)
        with pytest.raises(brokerkit.InvalidMessage):
            await broker.publish_many(queue, [brokerkit.Outgoing(b"x", headers=headers)])
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        assert msg.body == b"at" and dict(msg.headers) == at
        await msg.ack()
    await _only(broker, queue, group, [])


@pytest.mark.behaviour("limits")
async def test_bound_header_count_at_max_headers_and_one_past(
    broker_url: str, broker: brokerkit.Broker, queue: str, group: str
) -> None:
    limit = broker.capabilities.max_headers
    assert limit >= 32
    at = {f"k{i}": str(i) for i in range(limit)}
    past = {f"k{i}": str(i) for i in range(limit + 1)}
    await _refused_before_io(
        broker_url, brokerkit.InvalidMessage, lambda b: b.publish(queue, b"x", headers=past)
    )
    with pytest.raises(brokerkit.InvalidMessage):
        await broker.publish(queue, b"x", headers=past)
    await broker.publish(queue, b"at", headers=at)
    with pytest.raises(brokerkit.InvalidMessage):
        await broker.publish(queue, b"x", headers=past)
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        assert msg.body == b"at" and dict(msg.headers) == at
        await msg.ack()
    await _only(broker, queue, group, [])


# -- nack delay and redelivery timing --------------------------------------------------


@pytest.mark.behaviour("nack delay")
async def test_bound_nack_delay_at_max_nack_delay_and_one_past(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """A delay of 0 up to ``max_nack_delay`` is accepted; the next float on either side is
    refused with InvalidArgument and settles nothing (the message is still ours)."""
    limit = broker.capabilities.max_nack_delay
    assert limit >= 900.0
    await broker.publish(queue, b"parked")
    async with broker.consumer(queue, group, ack_timeout=30.0) as consumer:
        msg = await receive(consumer)
        for bad in (math.nextafter(limit, math.inf), limit + 1, -math.nextafter(0.0, 1.0), -1):
            with pytest.raises(brokerkit.InvalidArgument):
                await msg.nack(delay=bad)
            assert not msg.settled
        for bad_type in (math.inf, math.nan, "1", True):
            with pytest.raises(brokerkit.InvalidArgument):
                await msg.nack(delay=bad_type)  # type: ignore[arg-type]
            assert not msg.settled
        await msg.nack(delay=limit)
        assert msg.settled
        # bounded by design: a message parked for max_nack_delay must not come back soon
        early = await nothing_within(consumer, 1.0 + broker.capabilities.redelivery_slack)
        assert early is None, f"a {limit}s nack delay redelivered at once: {early!r}"


def _late(waited: float, broker: brokerkit.Broker, due_in: float, what: str) -> str:
    slack = broker.capabilities.redelivery_slack
    return (
        f"{what}: redelivered {waited:.3f}s after it was due {due_in}s on; the declared "
        f"redelivery_slack is {slack}s (margin {LATE}s)"
    )


@pytest.mark.behaviour("nack")
async def test_bound_redelivery_after_nack_zero_within_slack(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """``nack()`` is due at once: each redelivery (three in a row, so a second step
    too) arrives within ``redelivery_slack`` + LATE of the nack call."""
    slack = broker.capabilities.redelivery_slack
    await broker.publish(queue, b"again")
    async with broker.consumer(queue, group, max_attempts=10, ack_timeout=30.0) as consumer:
        msg = await receive(consumer)
        for attempt in (2, 3, 4):
            nacked = time.monotonic()
            await msg.nack()
            msg = await receive(consumer, redelivery_deadline(broker, 0))
            waited = time.monotonic() - nacked
            assert msg.attempt == attempt
            assert waited <= slack + LATE, _late(waited, broker, 0, f"nack() #{attempt - 1}")
        await msg.ack()


@pytest.mark.behaviour("nack delay")
async def test_bound_redelivery_after_nack_delay_within_slack(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """``nack(d)`` is due ``d`` after the call: never before, and within the slack after;
    a second, shorter delay on the redelivery too."""
    slack = broker.capabilities.redelivery_slack
    await broker.publish(queue, b"later")
    async with broker.consumer(queue, group, max_attempts=10, ack_timeout=30.0) as consumer:
        msg = await receive(consumer)
        for attempt, delay in ((2, 1.0), (3, 0.5)):
            nacked = time.monotonic()
            await msg.nack(delay=delay)
            msg = await receive(consumer, redelivery_deadline(broker, delay))
            waited = time.monotonic() - nacked
            assert msg.attempt == attempt
            assert waited >= delay - EARLY, f"redelivered {waited:.3f}s into a {delay}s delay"
            assert waited <= delay + slack + LATE, _late(waited, broker, delay, f"nack({delay})")
        await msg.ack()


@pytest.mark.behaviour("lease expiry")
async def test_bound_redelivery_after_lease_expiry_within_slack(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """A lease is due to end ``ack_timeout`` after it began (no later than the receive
    returned) or after an ``extend`` returned: the redelivery comes within the slack of
    that, and not before the lease could have ended. Three leases: plain, after a
    redelivery, and extended."""
    ack_timeout = 1.0
    slack = broker.capabilities.redelivery_slack
    await broker.publish(queue, b"hung")
    opened = time.monotonic()  # no lease on it began before this
    async with broker.consumer(
        queue, group, max_attempts=10, ack_timeout=ack_timeout, prefetch=1, close_timeout=0
    ) as consumer:
        msg = await receive(consumer)
        leased = time.monotonic()
        for attempt in (2, 3):  # never settled: the lease runs out
            held = msg
            msg = await receive(consumer, redelivery_deadline(broker, ack_timeout))
            now = time.monotonic()
            assert (msg.id, msg.attempt) == (held.id, attempt)
            assert now - opened >= ack_timeout - EARLY, f"redelivered {now - opened:.3f}s in"
            waited = now - leased - ack_timeout
            assert waited <= slack + LATE, _late(waited, broker, 0, f"lease #{attempt - 1}")
            opened, leased = leased, now
        extending = time.monotonic()
        await eventually(
            lambda: time.monotonic() >= extending + ack_timeout / 2, what="half the lease"
        )
        before = time.monotonic()
        await msg.extend()
        extended = time.monotonic()
        again = await receive(consumer, redelivery_deadline(broker, ack_timeout))
        now = time.monotonic()
        assert (again.id, again.attempt) == (msg.id, 4)
        assert now - before >= ack_timeout - EARLY, (
            f"redelivered {now - before:.3f}s after an extend of a {ack_timeout}s lease"
        )
        waited = now - extended - ack_timeout
        assert waited <= slack + LATE, _late(waited, broker, 0, "extended lease")
        await again.ack()


@pytest.mark.behaviour("ack")
async def test_bound_ack_is_recorded_within_ack_flush_interval(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """An ack made ``ack_flush_interval`` + LATE before its lease ends is recorded before
    the lease ends, so the message never comes back (a flush held longer would let the
    lease run out first and the broker redeliver it)."""
    flush = broker.capabilities.ack_flush_interval
    assert 0.0 <= flush <= 0.1
    ack_timeout = 1.0
    await broker.publish(queue, b"acked-late")
    async with broker.consumer(
        queue, group, ack_timeout=ack_timeout, prefetch=1, close_timeout=0
    ) as consumer:
        msg = await receive(consumer)
        received = time.monotonic()  # the lease began before this
        await eventually(
            lambda: time.monotonic() >= received + ack_timeout - flush - LATE,
            interval=0.01,
            what="the lease's last moments",
        )
        await msg.ack()
        # bounded by design: past the lease and its slack, nothing may come back
        again = await nothing_within(consumer, absence_window(broker, ack_timeout))
        assert again is None, f"acked {flush + LATE}s before its lease ended, redelivered"


# -- dedup window ----------------------------------------------------------------------


@pytest.mark.behaviour("dedup window")
async def test_bound_dedup_window_option_is_honoured_or_refused(broker_url: str) -> None:
    url = with_param(broker_url, "dedup_window", "2")
    if brokerkit.connect(broker_url).capabilities.dedup_window_configurable:
        assert brokerkit.connect(url).capabilities.dedup_window == 2.0
        with pytest.raises(brokerkit.ConfigError):  # a window needs a positive length
            brokerkit.connect(with_param(broker_url, "dedup_window", "-1"))
    else:
        with pytest.raises(brokerkit.ConfigError, match="dedup_window"):
            brokerkit.connect(url)


_WINDOW = 2.0
"""The window configured where ``dedup_window_configurable`` (``_helpers`` has none)."""

_SWEEP = 0.5
"""How long past its end a window may linger (a broker forgets ids in a periodic sweep)."""


@pytest.mark.behaviour("dedup window")
async def test_bound_dedup_window_holds_then_ends_within_its_margin(
    broker_url: str, connect: Connect, queue: str, group: str
) -> None:
    """A repeat just inside the window is suppressed; one ``_SWEEP`` past it is delivered.

    Where the window is fixed (SQS: 300 s) only the first half runs here; its end is
    proven by ``test_dedup.py`` under ``--run-slow``."""
    probe = await connect()
    configurable = probe.capabilities.dedup_window_configurable
    broker = await connect(with_param(broker_url, "dedup_window", "2")) if configurable else probe
    window = broker.capabilities.dedup_window
    assert window == (_WINDOW if configurable else probe.capabilities.dedup_window)
    before = time.monotonic()  # the window begins after this
    await broker.publish(queue, b"one", dedup_id="w")
    published = time.monotonic()  # and no later than this
    inside = before + min(window - LATE, 1.5)
    await eventually(lambda: time.monotonic() >= inside, interval=0.01, what="inside the window")
    dup = await broker.publish(queue, b"dup", dedup_id="w")
    assert time.monotonic() < before + window, "the repeat was too slow to test the window"
    assert dup.duplicate in (True, None)
    async with broker.consumer(queue, group) as consumer:
        first = await receive(consumer)
        assert first.body == b"one"
        await first.ack()
        if not configurable:
            late = await nothing_within(consumer, 0.5)  # bounded by design
            assert late is None, f"a repeat inside the window was delivered: {late!r}"
            return
        await eventually(
            lambda: time.monotonic() >= published + window + _SWEEP,
            timeout=window + WAIT,
            what="the window's end",
        )
        fresh_copy = await broker.publish(queue, b"two", dedup_id="w")
        assert fresh_copy.duplicate in (False, None), "the window outlived its end + margin"
        msg = await receive(consumer)
        assert msg.body == b"two", f"a repeat inside the window was delivered: {msg!r}"
        await msg.ack()


# -- fan-out ---------------------------------------------------------------------------


@pytest.mark.behaviour("ack")
async def test_bound_fan_out_copies_to_every_group_or_refuses_a_second(
    broker: brokerkit.Broker, queue: str
) -> None:
    if broker.capabilities.fan_out:
        async with broker.consumer(queue, "fan-a") as a, broker.consumer(queue, "fan-b") as b:
            await a.open()
            await b.open()
            await broker.publish(queue, b"to-all")
            for consumer in (a, b):
                msg = await receive(consumer)
                assert msg.body == b"to-all"
                await msg.ack()
        return
    async with broker.consumer(queue, "only") as only:
        await only.open()
        second = broker.consumer(queue, "second")
        with pytest.raises(brokerkit.UnsupportedFeature):
            await second.open()
        await second.aclose()
        await broker.publish(queue, b"kept")
        msg = await receive(only)  # the refusal took nothing from the first group
        assert msg.body == b"kept"
        await msg.ack()


# -- browse and redrive limits ---------------------------------------------------------


async def _browsed(
    broker: brokerkit.Broker, queue: str, limit: int, *, dead: bool = False
) -> list[bytes]:
    return [m.body async for m in broker.browse(queue, dead_letters=dead, limit=limit)]


@pytest.mark.behaviour("browse")
async def test_bound_browse_limit_and_no_side_effects_or_refusal(
    broker_url: str, broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """``limit`` 0 shows nothing, n the n oldest, -1 is refused before any I/O; browsing
    takes no lease and counts no attempt. Where ``browse`` is False it is refused."""
    await broker.publish_many(queue, [brokerkit.Outgoing(f"{i}".encode()) for i in range(3)])
    if not broker.capabilities.browse:
        with pytest.raises(brokerkit.UnsupportedFeature):
            await _browsed(broker, queue, 1)
        await _only(broker, queue, group, [b"0", b"1", b"2"])
        return
    bad: tuple[Any, ...] = (-1, True, 1.0)
    await _refused_before_io(
        broker_url,
        brokerkit.InvalidArgument,
        *[lambda b, n=n: _browsed(b, queue, n) for n in bad],
    )
    await eventually(lambda: _has(broker, queue, 3), what="the three messages to be browsable")
    assert await _browsed(broker, queue, 0) == []
    assert await _browsed(broker, queue, 1) == [b"0"]
    assert await _browsed(broker, queue, 2) == [b"0", b"1"]
    assert await _browsed(broker, queue, 3) == [b"0", b"1", b"2"]
    async with broker.consumer(queue, group) as consumer:
        got = await receive_n(consumer, 3)
    assert sorted(m.body for m in got) == [b"0", b"1", b"2"]
    assert [m.attempt for m in got] == [1, 1, 1], "browsing counted an attempt"


async def _has(broker: brokerkit.Broker, queue: str, n: int) -> bool:
    return len(await _browsed(broker, queue, n)) == n
