"""Fault behaviour ``soak``: a long busy hour, compressed.

Messages over many fifo groups plus ungrouped ones, published in chunks while four
consumers on two connections handle them: 10 % are nacked on their first delivery
(half with a delay), 1 % are poison and dead-lettered. Then: nothing lost (every other
message acked), nothing acked delivered again, the DLQ holds exactly the poison (with
its reason), each group's deliveries in publish order (a nacked one again before any
later one) and never two of a group unsettled at once. Throughput is reported.

Short by default (sized for CI: well under a minute per broker on 2 cores);
``--soak-long`` runs 50 000 messages over 50 groups. Runs on every URL, memory:// too.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from dataclasses import dataclass, field

import pytest

import brokerkit

from ._faults import record
from ._helpers import SCALE, eventually, nothing_within, receive
from .conftest import Connect

SHORT = (3_000, 20)
LONG = (50_000, 50)
CHUNK = 250
POISON_REASON = "soak: poison"


@dataclass
class Plan:
    """What the handlers do with each message, decided up front (seeded)."""

    messages: list[brokerkit.Outgoing]
    poison: set[str]
    nack: dict[str, float]  # body -> delay of its one nack (0: none)

    @classmethod
    def make(cls, n: int, groups: int, seed: int) -> Plan:
        rnd = random.Random(seed)
        messages, poison, nack = [], set(), {}
        for i in range(n):
            group = f"g{rnd.randrange(groups)}" if rnd.random() < 0.6 else None
            body = f"{group or '-'}:{i:06d}"
            messages.append(brokerkit.Outgoing(body.encode(), fifo_group=group))
            r = rnd.random()
            if r < 0.01:
                poison.add(body)
            elif r < 0.11:
                nack[body] = 0.0 if r < 0.06 else round(rnd.uniform(0.05, 0.3), 3)
        return cls(messages, poison, nack)


@dataclass
class Tally:
    deliveries: dict[str, list[int]] = field(default_factory=dict)  # body -> attempts
    acked: dict[str, int] = field(default_factory=dict)  # body -> times acked
    dead: set[str] = field(default_factory=set)
    group_seq: dict[str, list[int]] = field(default_factory=dict)
    in_flight: dict[str, str] = field(default_factory=dict)  # group -> body
    violations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def _handle(consumer: brokerkit.Consumer, plan: Plan, tally: Tally) -> None:
    try:
        async for msg in consumer:
            body = msg.body.decode()
            group = msg.fifo_group
            tally.deliveries.setdefault(body, []).append(msg.attempt)
            if body in tally.acked:
                tally.violations.append(f"{body} delivered again after it was acked")
            if group is not None:
                holder = tally.in_flight.get(group)
                if holder is not None:
                    tally.violations.append(f"group {group}: {body} while {holder} unsettled")
                tally.in_flight[group] = body
                tally.group_seq.setdefault(group, []).append(int(body.rsplit(":", 1)[1]))
                await asyncio.sleep(0.001)  # the handler's work: the group is held meanwhile
                del tally.in_flight[group]  # settling: from here the broker may move on
            if body in plan.poison:
                await msg.dead_letter(POISON_REASON)
                tally.dead.add(body)
            elif body in plan.nack and msg.attempt == 1:
                delay = plan.nack[body]
                await msg.nack(delay=delay or None)
            else:
                await msg.ack()
                tally.acked[body] = tally.acked.get(body, 0) + 1
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        tally.errors.append(f"{type(exc).__name__}: {exc}")


@pytest.mark.behaviour("soak")
async def test_soak_nacks_poison_groups_and_throughput(
    connect: Connect, queue: str, group: str, request: pytest.FixtureRequest
) -> None:
    n, groups = LONG if request.config.getoption("--soak-long") else SHORT
    plan = Plan.make(n, groups, seed=16)
    want_acked = {m.body.decode() for m in plan.messages} - plan.poison
    deadline = (120.0 if n == SHORT[0] else 1800.0) * SCALE
    producer = await connect()
    connections = [await connect(), await connect()]
    tally = Tally()
    consumers = [
        conn.consumer(queue, group, max_attempts=5, ack_timeout=30.0, close_timeout=5.0)
        for conn in connections
        for _ in range(2)
    ]
    for consumer in consumers:
        await consumer.open()
    started = time.monotonic()
    tasks = [asyncio.ensure_future(_handle(c, plan, tally)) for c in consumers]
    try:
        for i in range(0, n, CHUNK):
            await producer.publish_many(queue, plan.messages[i : i + CHUNK])
        published_s = time.monotonic() - started
        try:
            await eventually(
                lambda: (
                    (want_acked <= tally.acked.keys() and plan.poison <= tally.dead)
                    or bool(tally.errors)
                ),
                timeout=deadline,
                interval=0.2,
                what=f"all {len(want_acked)} messages acked and {len(plan.poison)} dead-lettered",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {_missing(want_acked, plan, tally)}") from None
        consumed_s = time.monotonic() - started
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for consumer in consumers:
            await asyncio.wait_for(consumer.aclose(), 30)
    assert not tally.errors, tally.errors
    # the DLQ holds exactly the poison
    dead_bodies: dict[str, str] = {}
    async with producer.dead_letters(queue) as dlq:
        while len(dead_bodies) < len(plan.poison):
            corpse = await receive(dlq)
            info = corpse.dead_letter_info
            assert info is not None
            dead_bodies[corpse.body.decode()] = info.reason
            await corpse.ack()
        extra = await nothing_within(dlq, 1.0 + producer.capabilities.redelivery_slack)
    assert extra is None, f"the DLQ holds more than the poison: {extra.body!r}"
    assert set(dead_bodies) == plan.poison, set(dead_bodies) ^ plan.poison
    assert set(dead_bodies.values()) == {POISON_REASON}, set(dead_bodies.values())
    order_breaks = [
        g for g, seq in tally.group_seq.items() if any(b < a for a, b in itertools.pairwise(seq))
    ]
    figures = {
        "scheme": _scheme(request),
        "messages": n,
        "groups": groups,
        "consumers": len(consumers),
        "connections": len(connections),
        "poison": len(plan.poison),
        "nacked": len(plan.nack),
        "lost": len(want_acked - tally.acked.keys()),
        "acked_twice": sum(1 for c in tally.acked.values() if c > 1),
        "dlq": len(dead_bodies),
        "redeliveries": sum(len(a) - 1 for a in tally.deliveries.values()),
        "order_breaks": len(order_breaks),
        "exclusivity_breaks": sum(1 for v in tally.violations if v.startswith("group ")),
        "publish_s": round(published_s, 2),
        "total_s": round(consumed_s, 2),
        "throughput_msgs_s": round(n / consumed_s),
    }
    record(request, "soak", figures)
    assert not order_breaks, f"FIFO order broken in groups {order_breaks[:5]}"
    assert not tally.violations, tally.violations[:10]
    assert figures["lost"] == 0


def _missing(want_acked: set[str], plan: Plan, tally: Tally) -> str:
    """What a timed-out soak still waits for: counts, and a sample of the missing bodies
    (``group:index``) with the attempts each was delivered with (``[]``: never)."""
    unacked = sorted(want_acked - tally.acked.keys())
    undead = sorted(plan.poison - tally.dead)
    sample = {b: tally.deliveries.get(b, []) for b in (unacked + undead)[:12]}
    return (
        f"acked {len(want_acked) - len(unacked)}/{len(want_acked)}, "
        f"dead-lettered {len(plan.poison) - len(undead)}/{len(plan.poison)}, "
        f"held by a group: {sorted(tally.in_flight.items())[:5]}, "
        f"missing (attempts delivered): {sample}"
    )


def _scheme(request: pytest.FixtureRequest) -> str:
    url = request.getfixturevalue("broker_url")
    return str(url).split(":", 1)[0]
