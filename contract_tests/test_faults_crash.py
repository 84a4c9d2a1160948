"""Fault behaviour ``crash``: a consumer process SIGKILLed mid-handler, again and again.

Consumers run in child processes (``contract_tests._crash_child``). A poison message makes
its handler hang; the test SIGKILLs that process while it holds the message and starts
a replacement, so the group always has another live consumer. Each time the message
must come back to a consumer of the group with attempt + 1 within ``ack_timeout`` +
``capabilities.redelivery_slack`` (the lateness is measured and reported), and after
``max_attempts`` deliveries it must be in the DLQ with reason ``max_attempts``. The
innocent messages published around it are all acked, none twice (beyond the
ack-coalescing window before a kill), and none is dead-lettered.

memory:// is in-process (a child process cannot share it): reported "not run".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

import brokerkit

from ._crash_pool import START_WAIT, Child, Pool
from ._faults import NOT_RUN, in_process, record
from ._helpers import SCALE, WAIT, nothing_within, receive
from .conftest import Connect

ACK_TIMEOUT = 2.0
MAX_ATTEMPTS = 3
JITTER = 0.5 * SCALE
"""Allowance on top of the declared slack for the child's pipe and the parent's loop."""
MEASURE = 30.0 * SCALE
"""How long past the declared slack a redelivery is still waited for (to report it)."""
GROUPS = 5
"""The grouped case: every message in one of 5 fifo groups, the poison's group included."""


@pytest.mark.behaviour("crash")
@pytest.mark.parametrize(
    ("prefetch", "groups"),
    [(1, 0), (32, 0), (32, GROUPS)],
    ids=["prefetch=1", "prefetch=32", f"prefetch=32-{GROUPS}-fifo-groups"],
)
async def test_consumer_killed_mid_handler_redelivers_then_dead_letters_only_the_poison(
    broker_url: object,
    connect: Connect,
    queue: str,
    group: str,
    prefetch: int,
    groups: int,
    request: pytest.FixtureRequest,
) -> None:
    if in_process(broker_url):
        pytest.skip(NOT_RUN + "memory:// is in-process: no other process can consume from it")
    started = time.monotonic()
    broker = await connect()
    slack = broker.capabilities.redelivery_slack
    flush = broker.capabilities.ack_flush_interval
    poison = "POISON"
    before = [f"n{i:03d}" for i in range(5)]
    after = [f"n{i:03d}" for i in range(5, 25)]
    innocents = set(before) | set(after)
    pool = Pool(
        broker_url,
        {
            "queue": queue,
            "group": group,
            "max_attempts": MAX_ATTEMPTS,
            "ack_timeout": ACK_TIMEOUT,
            "prefetch": prefetch,
            "poison": [poison],
            "lifetime": 600.0,
        },
    )
    acks: dict[str, list[tuple[Child, float, int]]] = {}  # body -> (child, time, attempt)
    got: dict[str, list[tuple[Child, float, int]]] = {}  # body -> each delivery, in order
    holds: list[tuple[float, int]] = []  # (time, attempt) of each delivery of the poison
    lateness: list[float] = []
    errors: list[str] = []
    dead_innocents: list[str] = []
    dlq_after: float | None = None
    failure = ""
    try:
        first, second = await pool.spawn(), await pool.spawn()
        await pool.ready(first)
        await pool.ready(second)
        bodies = [*before, poison, *after]
        sent = await broker.publish_many(
            queue,
            [
                brokerkit.Outgoing(b.encode(), fifo_group=f"g{i % groups}" if groups else None)
                for i, b in enumerate(bodies)
            ],
        )
        poison_id = sent[len(before)].id

        def handle(child: Child, event: dict[str, Any]) -> None:
            kind = event["ev"]
            if kind == "got":
                got.setdefault(event["body"], []).append((child, event["t"], event["attempt"]))
            elif kind == "ack":
                acks.setdefault(event["body"], []).append((child, event["t"], event["attempt"]))
            elif kind in ("ack_error", "error"):
                errors.append(f"{child.name}: {kind} {event.get('type')}")
            elif kind == "exit" and child.killed_at is None:
                errors.append(f"{child.name} exited by itself")

        # kill whoever holds the poison, max_attempts times; a replacement joins each time
        while len(holds) < MAX_ATTEMPTS:
            due = holds[-1][0] + ACK_TIMEOUT if holds else time.monotonic() + WAIT
            # waits past the declared slack too: how late it comes is measured, judged below
            limit = due - time.monotonic() + slack + JITTER + (START_WAIT if not holds else MEASURE)
            child, event = await pool.next(
                max(limit, 0.1), f"delivery {len(holds) + 1} of the poison message"
            )
            handle(child, event)
            assert not errors, errors
            if event["ev"] != "hold":
                continue
            assert event["id"] == poison_id, event
            assert event["attempt"] == len(holds) + 1, (
                f"the poison came back with attempt {event['attempt']}, "
                f"expected {len(holds) + 1} (deliveries so far: {holds})"
            )
            if holds:
                lateness.append(event["t"] - (holds[-1][0] + ACK_TIMEOUT))
            holds.append((event["t"], event["attempt"]))
            pool.kill(child)
            await pool.spawn()  # a replacement: the group keeps two live consumers

        # the next delivery (attempt max_attempts + 1) is dead-lettered by the facade
        async with broker.dead_letters(queue) as dead:
            deadline = holds[-1][0] + ACK_TIMEOUT + slack + JITTER + MEASURE
            corpse = await receive(dead, max(deadline - time.monotonic(), 0.1))
            dlq_after = time.monotonic() - (holds[-1][0] + ACK_TIMEOUT)
            info = corpse.dead_letter_info
            assert info is not None
            assert (corpse.body, info.original_id) == (poison.encode(), poison_id), (
                f"an innocent message was dead-lettered: {corpse.body!r} {info!r}"
            )
            assert (info.reason, info.attempts) == ("max_attempts", MAX_ATTEMPTS), info
            await corpse.ack()

            # every innocent acked (the survivors redeliver what the killed ones held)
            end = time.monotonic() + WAIT + ACK_TIMEOUT + slack
            try:
                while not innocents <= set(acks):
                    missing = sorted(innocents - set(acks))
                    child, event = await pool.next(
                        max(end - time.monotonic(), 0.1), f"the innocent messages {missing}"
                    )
                    handle(child, event)
                    assert event["ev"] != "hold", f"the poison was delivered again: {event}"
                    assert not errors, errors
            finally:  # whatever else reached the DLQ: an innocent dead-lettered
                while extra := await nothing_within(dead, ACK_TIMEOUT + slack + JITTER):
                    extra_info = extra.dead_letter_info
                    why = (extra_info.reason, extra_info.attempts) if extra_info else None
                    dead_innocents.append(f"{extra.body.decode()} {why}")
                    await extra.ack()
            assert not dead_innocents, f"innocent messages dead-lettered: {dead_innocents}"
        # drain stray events (a late duplicate would show here)
        with contextlib.suppress(TimeoutError):
            while True:
                child, event = await asyncio.wait_for(pool.events.get(), 0.2)
                handle(child, event)
    except AssertionError as exc:
        failure = str(exc)
    finally:
        await pool.close()

    duplicates, excused = [], []
    for body, seen in acks.items():
        for child, t, _ in seen[:-1]:  # every ack but the last was followed by a redelivery
            killed = child.killed_at
            if killed is not None and killed - flush - 0.05 <= t <= killed:
                excused.append(body)  # acked within the coalescing window before SIGKILL
            else:
                duplicates.append(body)

    def story(body: str) -> list[str]:
        """Its hand-outs and acks, in that order (was an ack lost in a kill?)."""
        return [
            *(_delivery(c, t, attempt, started) for c, t, attempt in got.get(body, [])),
            *("acked: " + _delivery(c, t, a, started) for c, t, a in acks.get(body, [])),
        ]

    figures = {
        "url_scheme": brokerkit.BrokerURL.parse(str(broker_url)).scheme,
        "prefetch": prefetch,
        "fifo_groups": groups,
        "ack_timeout": ACK_TIMEOUT,
        "redelivery_slack": slack,
        "kills": len(holds),
        "lateness_s": [round(x, 3) for x in lateness],
        "dlq_after_lease_s": None if dlq_after is None else round(dlq_after, 3),
        "innocents_dead_lettered": dead_innocents,
        "innocents": len(innocents),
        "acked": len(set(acks) & innocents),
        "innocents_not_acked": len(innocents - set(acks)),
        "duplicates": len(duplicates),
        "acked_redelivered_in_window": len(excused),
        "max_innocent_attempt": max((a for seen in acks.values() for _, _, a in seen), default=0),
        # who got each innocent never acked, with what attempt, and whether it was killed
        # ([] for one never handed out at all)
        "not_acked_deliveries": {
            body: [_delivery(c, t, attempt, started) for c, t, attempt in got.get(body, [])]
            for body in sorted(innocents - set(acks))
        },
        # each dead-lettered innocent's hand-outs and acks (was an ack lost in a kill?)
        "dead_lettered_story": {
            body: story(body) for body in sorted({entry.split()[0] for entry in dead_innocents})
        },
        # the same for each one acked again after an ack in a kill's coalescing window
        "redelivered_in_window_story": {body: story(body) for body in sorted(set(excused))},
        "seconds": round(time.monotonic() - started, 1),
    }
    record(request, "crash", figures)
    assert not failure, f"{failure}; figures: {figures}"
    assert not duplicates, f"innocent messages acked twice: {sorted(duplicates)}"
    late = [x for x in lateness if x > slack + JITTER]
    assert not late, (
        f"redelivery after a crash came {max(late):.2f}s after the lease ran out; the "
        f"backend declares redelivery_slack={slack}s (+{JITTER}s allowance): {figures}"
    )


def _delivery(child: Child, t: float, attempt: int, started: float) -> str:
    """One delivery, for the figures: ``child-2 attempt 1 at 3.21s (killed at 3.40s)``."""
    killed = "" if child.killed_at is None else f" (killed at {child.killed_at - started:.2f}s)"
    return f"{child.name} attempt {attempt} at {t - started:.2f}s{killed}"


NACK_DELAY = 0.5


@pytest.mark.behaviour("crash")
async def test_a_last_attempt_fetched_beside_a_poison_is_not_dragged_into_the_dlq(
    broker_url: object, connect: Connect, queue: str, group: str
) -> None:
    """A message nacked to its last attempt and a fresh poison arrive in one fetch of a
    consumer (prefetch 32). The last attempt goes out first, alone, and its ack is on the
    broker before the poison goes out: the crash that the poison causes costs it nothing.
    Before: the poison went first (first-time messages went first) and the crash counted
    the last attempt unseen, or the last attempt went first but its coalesced ack died
    with the process: either way to the DLQ without its last try (all five brokers)."""
    if in_process(broker_url):
        pytest.skip(NOT_RUN + "memory:// is in-process: no other process can consume from it")
    broker = await connect()
    await broker.publish(queue, b"N")
    async with broker.consumer(queue, group, max_attempts=2, ack_timeout=ACK_TIMEOUT) as first:
        msg = await receive(first)
        assert (msg.body, msg.attempt) == (b"N", 1)
        await msg.nack(NACK_DELAY)
    await asyncio.sleep(NACK_DELAY * 2)  # the condition is the delay itself: N due again
    await broker.publish(queue, b"P")
    pool = Pool(
        broker_url,
        {
            "queue": queue,
            "group": group,
            "max_attempts": 2,
            "ack_timeout": ACK_TIMEOUT,
            "prefetch": 32,
            "poison": ["P"],
            "lifetime": 600.0,
        },
    )
    seen: list[tuple[str, str | None, int | None]] = []
    try:
        child = await pool.spawn()
        await pool.ready(child)
        while True:
            _, event = await pool.next(START_WAIT, "the child to hold the poison")
            seen.append((event["ev"], event.get("body"), event.get("attempt")))
            assert event["ev"] in ("ready", "got", "ack", "hold"), seen
            if event["ev"] == "hold":
                pool.kill(child)
                break
    finally:
        await pool.close()
    assert ("ack", "N", 2) in seen, f"the last attempt was not handled first: {seen}"
    # the poison comes back (attempt 2, its last) and is given up: only it reaches the DLQ
    async with broker.consumer(queue, group, max_attempts=2, ack_timeout=ACK_TIMEOUT) as rest:
        msg = await receive(rest, WAIT + ACK_TIMEOUT + broker.capabilities.redelivery_slack)
        assert (msg.body, msg.attempt) == (b"P", 2)
        await msg.nack()  # its last attempt: to the DLQ
        late = await nothing_within(rest, ACK_TIMEOUT + broker.capabilities.redelivery_slack)
        assert late is None, f"delivered again: {late!r}"
    async with broker.dead_letters(queue) as dead:
        corpse = await receive(dead)
        assert corpse.body == b"P", f"an innocent was dead-lettered: {corpse!r}"
        await corpse.ack()
        extra = await nothing_within(dead, 2.0)
        assert extra is None, f"an innocent was dead-lettered: {extra!r}"
