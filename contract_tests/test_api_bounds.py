"""Every API bound at the bound and one past it (issue #41 item 2).

Names, fifo_group and dedup_id tokens, reserved header prefixes, consumer arguments,
``max_in_flight``, ``max_attempts`` and the ``limit`` of ``redrive``: the largest or
smallest legal value works end to end, the next one is refused with its specific error
before any I/O (a broker at a port nobody listens on refuses it at once). The bounds
``capabilities`` declares (body, headers, nack delay, times) are in ``test_bounds.py``.

A "nothing arrives within X" check here is a bounded wait by design.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Callable
from typing import Any

import pytest

import brokerkit

from ._helpers import WAIT, nothing_within, receive, receive_n, redelivery_deadline
from .test_bounds import _only, _refused_before_io, _unreachable


def _token(n: int) -> str:
    """A fresh string of exactly ``n`` characters (unique per call, n >= 8)."""
    head = uuid.uuid4().hex[:8]
    return head + "x" * (n - len(head))


@pytest.mark.behaviour("limits")
async def test_bound_reserved_header_prefix_in_any_case_and_its_neighbours(
    broker_url: str, broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """``x-brokerkit-`` is reserved in any letter case; a name merely like it is not."""
    reserved = [
        "x-brokerkit-dlq-reason",
        "X-Brokerkit-dlq-reason",
        "X-BROKERKIT-FIFO-GROUP",
        "x-BrokerKit-",
        "X-bRoKeRkIt-anything",
    ]
    allowed = ["x-brokerkit", "x-brokerkitx", "xx-brokerkit-a", "x_brokerkit-a", " x-brokerkit-"]
    await _refused_before_io(
        broker_url,
        brokerkit.InvalidMessage,
        *[lambda b, k=k: b.publish(queue, b"x", headers={k: "spoof"}) for k in reserved],
    )
    await broker.publish(queue, b"first")
    for key in reserved:
        with pytest.raises(brokerkit.InvalidMessage):
            await broker.publish(queue, b"x", headers={key: "spoof"})
    headers = {key: "mine" for key in allowed}
    await broker.publish(queue, b"near", headers=headers)
    async with broker.consumer(queue, group) as consumer:
        got = {m.body: m for m in await receive_n(consumer, 2)}
    assert dict(got[b"near"].headers) == headers
    await _only(broker, queue, group, [])


# -- names and tokens ------------------------------------------------------------------


@pytest.mark.behaviour("limits")
async def test_bound_names_of_64_characters_and_one_past(
    broker_url: str, broker: brokerkit.Broker, new_queue: Callable[[str | None], str]
) -> None:
    queue = new_queue(_token(64))
    group = "G" + _token(63)
    past_queue, past_group = queue + "a", group + "a"
    bad = [past_queue, "", "-" + queue[1:], "_a", "a.b", "é", "a b"]
    await _refused_before_io(
        broker_url,
        brokerkit.InvalidName,
        *[lambda b, n=n: b.publish(n, b"x") for n in bad],
        *[lambda b, n=n: b.consumer(n) for n in bad],
        *[lambda b, n=n: b.consumer(queue, group=n) for n in [past_group, *bad]],
        *[lambda b, n=n: b.dead_letters(n) for n in bad],
        *[lambda b, n=n: b.redrive(n) for n in bad],
    )
    await broker.publish(queue, b"at-64")
    with pytest.raises(brokerkit.InvalidName):
        broker.consumer(queue, group=past_group)
    async with broker.consumer(queue, group) as consumer:  # both names at 64
        msg = await receive(consumer)
        assert msg.body == b"at-64" and msg.queue == queue
        await msg.ack()
    one = new_queue("9")  # the shortest names, a digit first: accepted (carrying is above)
    assert (await broker.publish(one, b"at-1")).id
    await broker.consumer(one, "Z").aclose()


@pytest.mark.behaviour("limits")
async def test_bound_fifo_group_and_dedup_id_of_1_to_128_printable_ascii(
    broker_url: str, broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """1-128 characters from ``!`` (0x21) to ``~`` (0x7e); one past on every side fails."""
    at = ["!" + _token(126) + "~", "~", "!"]
    past = [_token(129), "", "a b", "\x7f", "a\x1f", "é", "\t", "a\n"]
    await _refused_before_io(
        broker_url,
        brokerkit.InvalidName,
        *[lambda b, t=t: b.publish(queue, b"x", fifo_group=t) for t in past],
        *[lambda b, t=t: b.publish(queue, b"x", dedup_id=t) for t in past],
        *[lambda b, t=t: b.publish_many(queue, [brokerkit.Outgoing(b"x", t)]) for t in past],
    )
    for i, token in enumerate(at):
        await broker.publish(queue, f"{i}".encode(), fifo_group=token, dedup_id=token)
    for token in past:  # later publishes: the same bound
        with pytest.raises(brokerkit.InvalidName):
            await broker.publish(queue, b"x", fifo_group=token)
        with pytest.raises(brokerkit.InvalidName):
            await broker.publish(queue, b"x", dedup_id=token)
    async with broker.consumer(queue, group) as consumer:
        got = {m.body: m for m in await receive_n(consumer, len(at))}
    for i, token in enumerate(at):
        assert (got[f"{i}".encode()].fifo_group, got[f"{i}".encode()].dedup_id) == (token, token)
    await _only(broker, queue, group, [])


# -- consumer arguments ----------------------------------------------------------------


@pytest.mark.behaviour("errors")
async def test_bound_consumer_arguments_at_their_minimum_and_one_past(
    broker_url: str, queue: str
) -> None:
    """max_in_flight, prefetch, max_attempts >= 1 (integers); ack_timeout > 0;
    close_timeout >= 0: refused when the consumer is made, before any I/O."""
    tiny = math.nextafter(0.0, 1.0)
    past: list[dict[str, object]] = [
        {"max_in_flight": 0},
        {"max_in_flight": -1},
        {"max_in_flight": True},
        {"max_in_flight": 1.0},
        {"prefetch": 0},
        {"prefetch": True},
        {"max_attempts": 0},
        {"max_attempts": 1.5},
        {"ack_timeout": 0},
        {"ack_timeout": -tiny},
        {"ack_timeout": math.inf},
        {"ack_timeout": math.nan},
        {"close_timeout": -tiny},
        {"close_timeout": math.inf},
    ]
    at: list[dict[str, object]] = [
        {"max_in_flight": 1, "prefetch": 1, "max_attempts": 1},
        {"ack_timeout": tiny, "close_timeout": 0},
    ]
    broker = _unreachable(broker_url)
    try:
        for kwargs in past:
            with pytest.raises(brokerkit.InvalidArgument):
                broker.consumer(queue, **kwargs)  # type: ignore[arg-type]
            if "max_attempts" not in kwargs:
                with pytest.raises(brokerkit.InvalidArgument):
                    broker.dead_letters(queue, **kwargs)  # type: ignore[arg-type]
        for kwargs in at:
            broker.consumer(queue, **kwargs)  # type: ignore[arg-type]
    finally:
        await asyncio.wait_for(broker.aclose(), WAIT)


@pytest.mark.behaviour("ack")
async def test_bound_max_in_flight_of_one_holds_one_message_at_a_time(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    await broker.publish_many(queue, [brokerkit.Outgoing(b"a"), brokerkit.Outgoing(b"b")])
    async with broker.consumer(queue, group, max_in_flight=1, prefetch=2) as consumer:
        first = await receive(consumer)
        assert consumer.in_flight == 1
        # bounded by design: while one is held, the iterator must wait, not hand out more
        more = await nothing_within(consumer, 0.5)
        assert more is None, f"a second message while max_in_flight=1 was full: {more!r}"
        await first.ack()
        second = await receive(consumer)
        assert {first.body, second.body} == {b"a", b"b"}
        await second.ack()


@pytest.mark.behaviour("DLQ")
async def test_bound_max_attempts_of_one_dead_letters_on_the_first_nack(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    await broker.publish(queue, b"once")
    async with broker.consumer(queue, group, max_attempts=1) as consumer:
        msg = await receive(consumer)
        assert msg.attempt == 1
        await msg.nack()
        async with broker.dead_letters(queue) as dead:
            corpse = await receive(dead)
            assert corpse.body == b"once" and corpse.dead_letter_info is not None
            assert corpse.dead_letter_info.reason == "max_attempts"
            assert corpse.dead_letter_info.attempts == 1
            await corpse.ack()
    async with broker.consumer(queue, group, max_attempts=2, ack_timeout=1.0) as consumer:
        msg2 = await broker.publish(queue, b"twice")
        first = await receive(consumer)
        assert (first.id, first.attempt) == (msg2.id, 1)
        await first.nack()  # attempt 1 of 2: redelivered, not dead
        again = await receive(consumer, redelivery_deadline(broker, 0))
        assert (again.id, again.attempt) == (msg2.id, 2)
        await again.ack()


@pytest.mark.behaviour("redrive")
async def test_bound_redrive_limit_at_zero_one_and_one_past(
    broker_url: str, broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """``redrive(limit=0)`` moves none, ``limit=1`` exactly the oldest, ``limit=-1`` is
    refused before any I/O; the rest stay dead."""
    bad: tuple[Any, ...] = (-1, True, 1.0)
    await _refused_before_io(
        broker_url,
        brokerkit.InvalidArgument,
        *[lambda b, n=n: b.redrive(queue, limit=n) for n in bad],
    )
    await broker.publish_many(queue, [brokerkit.Outgoing(b"d0"), brokerkit.Outgoing(b"d1")])
    async with broker.consumer(queue, group) as consumer:
        for msg in await receive_n(consumer, 2, ack=False):
            await msg.dead_letter(f"test {msg.body!r}")
        assert await broker.redrive(queue, limit=0) == 0
        assert await broker.redrive(queue, limit=1) == 1
        back = await receive(consumer)
        assert back.body in (b"d0", b"d1") and back.dead_letter_info is None
        await back.ack()
        # bounded by design: only one was moved
        more = await nothing_within(consumer, 0.5)
        assert more is None, f"redrive(limit=1) moved more than one: {more!r}"
        assert await broker.redrive(queue) == 1
        rest = await receive(consumer)
        assert {back.body, rest.body} == {b"d0", b"d1"}
        await rest.ack()
