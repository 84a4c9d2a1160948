"""A consumer's fetch buffer: what was fetched and not yet handed out, and the fetch in flight.

Deliveries arrive in batches, one per receive; each batch carries the time its leases run
out (``ack_timeout`` after it arrived). ``take`` hands them out in order. At most one
receive is in flight; its deliveries join the buffer when it finishes (``collect``, which
runs once per fetch, from its done callback or from whoever awaited it first).

Shared by ``Consumer`` (hand-out, read-ahead, close) and the last-attempt policy in
``_alone`` (put back, give back): neither reaches into the other's state.

What is still buffered shortly before its lease runs out (``GIVE_BACK_MARGIN``, at most a
quarter of ``ack_timeout``) is taken out and passed to ``give_back`` (the consumer
releases it: uncounted where the receiver can), instead of running out in the buffer
and coming back with an attempt counted that no handler saw: a handler that takes long,
or hangs until its process is killed, would otherwise count an attempt for every message
fetched ahead of it, again and again (innocents dead-lettered beside a poison message).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from brokerkit._errors import BrokerUnavailable
from brokerkit._outage import Outage
from brokerkit.backends.base import Delivery

_now = time.monotonic  # the lease clock: the event loop's

GIVE_BACK_MARGIN = 1.0
"""Buffered deliveries are given back this long (s) before their leases run out."""


class FetchBuffer:
    """Fetched deliveries in arrival order, each batch with its lease end; one fetch at a time."""

    __slots__ = (
        "_ack_timeout",
        "_batch",
        "_batches",
        "_due",
        "_give_back",
        "_last_attempt",
        "_last_waiting",
        "_margin",
        "_outage",
        "_pos",
        "_timer",
        "count",
        "fetch",
        "lease_end",
    )

    def __init__(
        self,
        ack_timeout: float,
        give_back: Callable[[list[Delivery[Any]]], None] | None = None,
        last_attempt: int = 0,
        where: str = "consumer",
    ) -> None:
        self._ack_timeout = ack_timeout
        self._outage = Outage(where)
        self._last_attempt = max(last_attempt, 2) if last_attempt else 0
        """A redelivery with ``attempt >= last_attempt`` (0: none) goes out before what is
        buffered ahead of it (``_bring_last_forward``)."""
        self._last_waiting = False
        self._give_back = give_back
        self._margin = min(GIVE_BACK_MARGIN, ack_timeout / 4)
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0  # when the timer fires (the lease clock)
        self._batch: list[Delivery[Any]] = []  # the batch being handed out, from _pos on
        self._pos = 0
        self._batches: deque[tuple[float, list[Delivery[Any]]]] = deque()  # then these
        self.count = 0
        """Deliveries buffered and not yet taken (none of its batches is empty)."""
        self.lease_end = 0.0
        """When the leases of the batch ``take`` last took from run out."""
        self.fetch: asyncio.Task[list[Delivery[Any]]] | None = None
        """The receive in flight, if any."""

    def take(self) -> Delivery[Any] | None:
        """The next delivery (its lease end is then ``lease_end``), or None when empty."""
        if self._last_waiting:
            self._bring_last_forward()
        pos = self._pos
        batch = self._batch
        while pos >= len(batch):
            if not self._batches:
                return None
            self.lease_end, batch = self._batches.popleft()
            self._batch = batch
            pos = 0
        self._pos = pos + 1
        self.count -= 1
        return batch[pos]

    def buffered(self) -> list[Delivery[Any]]:
        """What is buffered and not yet taken, in order (nothing moves)."""
        out = self._batch[self._pos :]
        for _, batch in self._batches:
            out += batch
        return out

    def _bring_last_forward(self) -> None:
        """Make the first buffered last attempt the next delivery, unless a delivery of its
        fifo_group is buffered ahead of it (group order holds; ungrouped ones have none).

        A last attempt must not wait behind another message in the buffer: if that one
        kills the process (a poison), the last attempt is counted unseen and goes to the
        DLQ without its last try. Handed out, it goes alone (``_alone``)."""
        last, groups, ahead = self._last_attempt, set(), 0
        rest = self._batch[self._pos :]
        for index, (lease_end, batch) in enumerate([(self.lease_end, rest), *self._batches]):
            for i, delivery in enumerate(batch):
                group = delivery.fifo_group
                if delivery.attempt >= last and (group is None or group not in groups):
                    if not ahead:
                        return  # it is next already
                    if index == 0:
                        rest = rest[:i] + rest[i + 1 :]
                    elif len(batch) > 1:
                        self._batches[index - 1] = (lease_end, batch[:i] + batch[i + 1 :])
                    else:
                        del self._batches[index - 1]
                    if rest:
                        self._batches.appendleft((self.lease_end, rest))
                    self._batches.appendleft((lease_end, [delivery]))
                    self._batch, self._pos = [], 0
                    return
                ahead += 1
                if group is not None:
                    groups.add(group)
        self._last_waiting = False

    def put_back_front(self, delivery: Delivery[Any], lease_end: float) -> None:
        """Hand ``delivery`` out again next, after the batch being handed out."""
        self._batches.appendleft((lease_end, [delivery]))
        self.count += 1
        self._arm(lease_end)

    def drain(self, now: float) -> tuple[list[Delivery[Any]], list[Delivery[Any]]]:
        """Empty the buffer; return what it held, split into (still leased at ``now``, ran
        out). Both are the caller's to give back: a receiver that counted a delivery when
        it took it (NATS's attempt book) takes the count back on a release even after the
        lease ran out (a receiver that cannot, ignores it); dropped, it would come back
        with an attempt counted that no handler saw."""
        leased: list[Delivery[Any]] = []
        ran_out: list[Delivery[Any]] = []
        (leased if self.lease_end > now else ran_out).extend(self._batch[self._pos :])
        for lease_end, batch in self._batches:
            (leased if lease_end > now else ran_out).extend(batch)
        self._batch, self._pos, self.count = [], 0, 0
        self._batches.clear()
        return leased, ran_out

    def stop_giving_back(self) -> None:
        """No more give-backs (close): what is buffered then is the closer's to handle."""
        self._give_back = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, lease_end: float) -> None:
        """Make sure a give-back runs shortly before ``lease_end`` (or earlier)."""
        timer = self._timer
        due = lease_end - self._margin
        if self._give_back is None or (timer is not None and self._due <= due):
            return
        if timer is not None:
            timer.cancel()
        self._due = due
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(max(due - _now(), 0.0), self.give_back_stale)

    def give_back_stale(self) -> None:
        """Take out what runs out within the margin (or ran out: a loop that lagged past
        the timer); give it back; arm for the next. The timer calls it, and the consumer
        when it meets a delivery whose lease ran out."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        give_back = self._give_back
        if give_back is None:
            return
        before = _now() + self._margin
        stale: list[Delivery[Any]] = []
        if self.lease_end <= before and self._pos < len(self._batch):
            stale = self._batch[self._pos :]
            self._batch, self._pos = [], 0
        keep: deque[tuple[float, list[Delivery[Any]]]] = deque()
        for lease_end, batch in self._batches:
            if lease_end <= before:
                stale += batch
            else:
                keep.append((lease_end, batch))
        self._batches = keep
        self.count -= len(stale)
        if stale:
            give_back(stale)
        if keep:
            self._arm(min(lease_end for lease_end, _ in keep))

    def start(self, receive: Coroutine[Any, Any, list[Delivery[Any]]]) -> None:
        """Run ``receive`` (a receiver's ``receive(...)``) as the fetch in flight."""
        task = asyncio.ensure_future(receive)
        task.add_done_callback(self.collect)
        self.fetch = task

    def collect(self, task: asyncio.Task[list[Delivery[Any]]]) -> None:
        """Keep a finished fetch's deliveries; runs once per fetch (callback or caller)."""
        if self.fetch is not task:
            return
        self.fetch = None
        if task.cancelled() or task.exception() is not None:
            return
        deliveries = task.result()
        if deliveries:
            lease_end = _now() + self._ack_timeout
            if self._last_attempt and not self._last_waiting:
                self._last_waiting = max(d.attempt for d in deliveries) >= self._last_attempt
            self._batches.append((lease_end, deliveries))
            self.count += len(deliveries)
            self._arm(lease_end)

    async def wait_fetch(self) -> None:
        """Wait for the fetch in flight (shielded: a cancelled caller leaves it running and
        the buffer keeps what it brings) and keep what it brought. A fetch that raised
        BrokerUnavailable is ridden out (``_outage``): this returns after a pause, with no
        fetch in flight, and the caller fetches again."""
        task = self.fetch
        assert task is not None
        try:
            await asyncio.shield(task)
        except BrokerUnavailable as exc:
            self.collect(task)
            await self._outage.failed(exc)
            return
        if self._outage.failures:
            self._outage.ended()
        # awaiting a done task does not yield to the loop, so its done callback may not
        # have run yet: collect here rather than spin
        self.collect(task)

    async def finish_fetch(self) -> None:
        """Wait for the fetch in flight, if any, and keep what it brought."""
        fetch = self.fetch
        if fetch is not None:
            await asyncio.wait([fetch])
            self.collect(fetch)
