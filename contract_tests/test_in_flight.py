"""Bounded in-flight (CONTRACT section 4): ``broker.consumer(..., max_in_flight=N)``.

The obvious concurrent pattern, one task per message, must never hold more than N
unsettled messages of a consumer, however large the backlog: otherwise leases expire en
masse and a redelivery storm follows. Every message still arrives exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

import pytest

import brokerkit

from ._helpers import SCALE, WAIT, eventually, redelivery_deadline

BACKLOG = 3_000


REACH_RATE = 10.0
"""The declared figures of the exact-bound tests: with fewer than ``max_in_flight`` held and
more available, a consumer is handed at least this many messages a second after the first
``WAIT`` (a broker whose receive slows with every message in flight climbs slowest), and
never goes ``STALL`` seconds without one once the first came."""

STALL = 10.0 * SCALE

QUIET = 2.0 * SCALE
"""Seconds the bound must hold, nothing more handed out, once it is reached."""


def reach_deadline(bound: int) -> float:
    return WAIT + bound / REACH_RATE * SCALE


async def _backlog(
    broker: brokerkit.Broker, queue: str, count: int = BACKLOG, *, grouped: bool = False
) -> list[bytes]:
    bodies = [b"f-%05d" % i for i in range(count)]
    for start in range(0, count, 500):
        chunk = range(start, min(start + 500, count))
        await broker.publish_many(
            queue,
            [brokerkit.Outgoing(bodies[i], fifo_group=f"g{i}" if grouped else None) for i in chunk],
        )
    return bodies


class _Holder:
    """Takes every message the consumer hands out and holds it, as handlers that never
    finish do; counts what is handed out and not yet settled by the caller (``unsettled``,
    and its highest value ``peak``, checked at each hand-out)."""

    def __init__(self, consumer: brokerkit.Consumer) -> None:
        self.consumer = consumer
        self.held: list[brokerkit.Message] = []
        self.handed = self.unsettled = self.peak = 0
        self.last_at = 0.0
        self._task = asyncio.ensure_future(self._take())

    async def _take(self) -> None:
        async for msg in self.consumer:
            self.handed += 1
            self.unsettled += 1
            self.peak = max(self.peak, self.unsettled)
            self.last_at = time.monotonic()
            self.held.append(msg)

    async def settle_all(self, *, lease_ran_out: bool | None = False) -> None:
        """Ack every held message: each must raise LeaseExpired (``lease_ran_out``), must
        not (False), or either (None)."""
        held, self.held = self.held, []
        for msg in held:
            if lease_ran_out is None:
                with contextlib.suppress(brokerkit.LeaseExpired):
                    await msg.ack()
            elif lease_ran_out:
                with pytest.raises(brokerkit.LeaseExpired):
                    await msg.ack()
            else:
                await msg.ack()
            self.unsettled -= 1

    async def stop(self) -> None:
        self._task.cancel()  # cancel-safe iteration: the wait for a slot loses nothing
        with pytest.raises(asyncio.CancelledError):
            await self._task

    async def reach(self, bound: int) -> None:
        """Poll until ``bound`` are held (deadline: ``reach_deadline``), then watch QUIET
        seconds for one more."""
        started = time.monotonic()
        deadline, seen, moved = started + reach_deadline(bound), 0, started
        while self.handed < bound and not self._task.done():
            now = time.monotonic()
            if self.handed != seen:
                seen, moved = self.handed, now
            stalled = seen > 0 and now - moved > STALL
            if stalled or now > deadline:
                why = f"none for {STALL:.0f}s" if stalled else f"{now - started:.0f}s"
                raise AssertionError(
                    f"{seen} of {bound} handed out ({why}; max_in_flight={bound}, nothing "
                    "settled, more available)"
                )
            await asyncio.sleep(0.05)
        if self._task.done():
            self._task.result()  # the iteration failed: its error
        await asyncio.sleep(QUIET)  # an absence check: nothing more within QUIET
        assert self.peak <= bound, f"{self.peak} handed out unsettled with max_in_flight={bound}"
        assert self.handed == bound, f"{self.handed} handed out with max_in_flight={bound}"
        assert self.consumer.in_flight == bound


async def _task_per_message(
    consumer: brokerkit.Consumer, count: int, bound: int
) -> tuple[list[bytes], int]:
    """Spawn one handler task per message, as a naive service does; the highest number of
    messages handed out and not yet settled, seen at each hand-out, and the bodies.

    The handlers hold their messages until ``bound`` are unsettled at once (so the bound is
    reached on a broker that delivers slower than handlers finish, too), then settle in
    random order and time."""
    unsettled = peak = 0
    bodies: list[bytes] = []
    tasks: set[asyncio.Task[None]] = set()
    rng = random.Random(17)
    full = asyncio.Event()
    errors: list[Exception] = []

    async def handle(msg: brokerkit.Message) -> None:
        nonlocal unsettled
        await full.wait()
        await asyncio.sleep(rng.random() * 0.004)  # out-of-order completion
        try:
            await msg.ack()
        except Exception as exc:
            errors.append(exc)
        finally:
            unsettled -= 1  # settled (or lost): no other task has run since the consumer saw it

    async def run() -> None:
        nonlocal unsettled, peak
        async for msg in consumer:
            unsettled += 1
            peak = max(peak, unsettled)
            if unsettled >= bound:
                full.set()
            bodies.append(msg.body)
            task = asyncio.ensure_future(handle(msg))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            if len(bodies) == count:
                break
        await asyncio.gather(*tasks)

    await asyncio.wait_for(run(), WAIT * 6)
    assert not errors, f"{len(errors)} acks failed, the first: {errors[0]!r}"
    return bodies, peak


@pytest.mark.behaviour("ack")
async def test_ack_max_in_flight_bounds_unsettled_messages_over_a_backlog(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    bodies = await _backlog(broker, queue)
    async with broker.consumer(queue, group, prefetch=32, max_in_flight=20) as consumer:
        got, peak = await _task_per_message(consumer, BACKLOG, 20)
    assert peak <= 20, f"{peak} unsettled messages with max_in_flight=20"
    assert peak == 20, f"the bound was never reached (peak {peak}): the test proved nothing"
    assert sorted(got) == bodies  # each exactly once


@pytest.mark.behaviour("ack")
async def test_ack_default_in_flight_bound_is_max_of_prefetch_and_100(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    bodies = await _backlog(broker, queue)
    async with broker.consumer(queue, group, prefetch=32) as consumer:
        got, peak = await _task_per_message(consumer, BACKLOG, 100)
    assert peak <= 100, f"{peak} unsettled messages with the default bound"
    assert peak == 100, f"the bound was never reached (peak {peak}): the test proved nothing"
    assert sorted(got) == bodies


@pytest.mark.behaviour("ack")
async def test_ack_a_sequential_loop_is_unchanged_by_max_in_flight_1(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    await broker.publish_many(queue, [brokerkit.Outgoing(b"s-%d" % i) for i in range(50)])
    got = []
    async with broker.consumer(queue, group, max_in_flight=1) as consumer:
        async for msg in consumer:
            got.append(msg.body)
            await msg.ack()
            if len(got) == 50:
                break
    assert sorted(got) == sorted(b"s-%d" % i for i in range(50))


@pytest.mark.behaviour("ack")
@pytest.mark.parametrize(("bound", "prefetch"), [(1000, 32), (1200, 500)])
async def test_ack_max_in_flight_is_reached_exactly_and_never_passed(
    broker: brokerkit.Broker, queue: str, group: str, bound: int, prefetch: int
) -> None:
    """Nothing settled: exactly max_in_flight handed out, whatever the broker's own windows
    (a prefetch count, an unacked cap, a commit-metadata window, a receive size)."""
    bodies = await _backlog(broker, queue, bound + 300)
    async with broker.consumer(
        queue, group, prefetch=prefetch, max_in_flight=bound, ack_timeout=300.0
    ) as consumer:
        holder = _Holder(consumer)
        await holder.reach(bound)
        await holder.stop()
        await holder.settle_all()
        rest = []
        async for msg in consumer:  # the backlog's rest, each once
            rest.append(msg.body)
            await msg.ack()
            if len(rest) == 300:
                break
    assert holder.peak == bound
    assert len(set(rest)) == 300 and len(rest) + bound == len(bodies)


@pytest.mark.behaviour("FIFO parallelism")
async def test_fifo_max_in_flight_is_reached_exactly_over_many_groups(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """One message per fifo group, more groups than the bound: each group's head is
    available, so exactly max_in_flight are handed out."""
    bound = 1000
    await _backlog(broker, queue, bound + 200, grouped=True)
    async with broker.consumer(
        queue, group, prefetch=32, max_in_flight=bound, ack_timeout=300.0
    ) as consumer:
        holder = _Holder(consumer)
        await holder.reach(bound)
        await holder.stop()
        assert len({m.fifo_group for m in holder.held}) == bound
        await holder.settle_all()


@pytest.mark.behaviour("lease expiry")
async def test_lease_max_in_flight_still_bounds_held_messages_whose_leases_ran_out(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    """Handlers hold their messages past their leases: the broker redelivers them, but a
    message the caller holds and has not settled still counts, so never more than the
    bound are handed out and unsettled; a settle (LeaseExpired) frees its slot."""
    bound, ack_timeout = 100, 1.0
    await _backlog(broker, queue, bound * 3)
    async with broker.consumer(
        queue, group, prefetch=32, max_in_flight=bound, ack_timeout=ack_timeout
    ) as consumer:
        holder = _Holder(consumer)
        await holder.reach(bound)
        # every held lease runs out, and the broker had the time to redeliver each
        ran_out = holder.last_at + redelivery_deadline(broker, ack_timeout)
        await eventually(lambda: time.monotonic() > ran_out, timeout=ran_out - time.monotonic() + 1)
        assert holder.handed == bound, f"{holder.handed} handed out with {bound} held"
        await holder.settle_all(lease_ran_out=True)  # each raises LeaseExpired
        await eventually(
            lambda: holder.handed == 2 * bound,
            timeout=reach_deadline(bound),
            what="the freed slots filled again",
        )
        await asyncio.sleep(QUIET)
        assert holder.peak <= bound, f"{holder.peak} unsettled at once, max_in_flight={bound}"
        assert holder.handed == 2 * bound and consumer.in_flight == bound
        await holder.stop()
        await holder.settle_all(lease_ran_out=None)
