"""``memory://[name]``: the in-process reference backend. It passes the whole contract.

Every connection to the same URL in one process sees the same broker;
``memory://other`` is a separate one. Nothing survives the process.

How the contract maps:

* queue -> a log of entries; each consumer group keeps its own view of it
  (fan-out: every group receives every message published while it exists,
  plus whatever the log still retains when the group is created);
* ack -> the entry leaves the group's view (and the log once every group is done);
* nack(delay) -> the entry is due again ``delay`` seconds later; attempt + 1 at redelivery;
* lease -> a deadline per delivery; an expired lease makes the entry due at once;
* attempt -> counted per (group, entry) at each delivery, in the shared state,
  so it survives consumer restarts;
* DLQ -> a second log per queue; the move is one synchronous step (atomic);
* dedup -> ``DedupWindow`` per queue, ``?dedup_window=SECONDS`` (default 300);
* leases, nack delays and FIFO groups -> the core's ``LeaseBook`` per group (a
  ``GroupGate`` inside: only a group's head is ever due, one at a time).

Fault injection, for tests only (so failure paths are driven, not hoped for):
``fail_publishes`` makes the next publish calls to a queue (or its DLQ) fail with
BrokerUnavailable, ``lose_lease`` ends a delivery's lease now, as a broker that lost
it would.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from pydantic import Field

from brokerkit.backends import (
    Backend,
    BrokerUnavailable,
    BrokerURL,
    Capabilities,
    ConfigError,
    DedupWindow,
    Delivery,
    LeaseBook,
    Leased,
    Options,
    Outgoing,
    PublishCopy,
    PublishResult,
    QueueRef,
    QueueStats,
    Receiver,
    ReceiverSettings,
    parse_options,
    str_headers,
)

__all__ = ["MemoryBackend", "MemoryOptions", "fail_publishes", "inject_raw", "lose_lease"]


class MemoryOptions(Options):
    dedup_window: float = Field(300.0, gt=0)
    """Seconds a dedup id is remembered."""
    max_message_bytes: int = Field(4 * 1024 * 1024, ge=256 * 1024)


@dataclass(slots=True)
class _Entry:
    seq: int
    born: float
    id: str
    body: bytes
    headers: Mapping[str, str]
    fifo_group: str | None
    dedup_id: str | None
    refs: int = 0
    defect: str | None = None  # set only by inject_raw


@dataclass(eq=False)
class _Group:
    """One consumer group's view of a log: its leases and its attempt counts."""

    book: LeaseBook[int] = field(default_factory=LeaseBook)
    attempts: dict[int, int] = field(default_factory=dict)
    receipts: dict[int, Leased[int]] = field(default_factory=dict)
    """The last receipt handed out per entry (for ``lose_lease``)."""

    def add(self, entry: _Entry, now: float) -> None:
        entry.refs += 1
        self.book.add(entry.seq, entry.fifo_group, now)


class _Log:
    """A queue or a DLQ: entries plus each consumer group's view."""

    def __init__(self, hub: _Hub) -> None:
        self._hub = hub
        self.entries: dict[int, _Entry] = {}
        self.groups: dict[str, _Group] = {}

    def append(self, entry: _Entry) -> None:
        now = time.monotonic()
        self.entries[entry.seq] = entry
        for group in self.groups.values():
            group.add(entry, now)
        self._hub.wake()

    def group(self, name: str) -> _Group:
        group = self.groups.get(name)
        if group is None:
            group = self.groups[name] = _Group()
            now = time.monotonic()
            for entry in self.entries.values():
                group.add(entry, now)
        return group

    def release_entry(self, entry: _Entry) -> None:
        entry.refs -= 1
        if entry.refs <= 0:
            self.entries.pop(entry.seq, None)


class _Queue:
    def __init__(self, hub: _Hub, dedup_window: float) -> None:
        self.main = _Log(hub)
        self.dlq = _Log(hub)
        self.dedup = DedupWindow(dedup_window)

    def log(self, ref: QueueRef) -> _Log:
        return self.dlq if ref.dead_letters else self.main


class _Hub:
    """One named in-process broker, shared by every connection to its URL."""

    _hubs: ClassVar[dict[str, _Hub]] = {}

    def __init__(self) -> None:
        self.queues: dict[str, _Queue] = {}
        self._seq = itertools.count(1)
        self._waiters: list[asyncio.Future[None]] = []
        self.faults: dict[QueueRef, int] = {}
        """Publish calls still to fail per queue (``fail_publishes``)."""

    @classmethod
    def named(cls, name: str) -> _Hub:
        hub = cls._hubs.get(name)
        if hub is None:
            hub = cls._hubs[name] = _Hub()
        return hub

    def queue(self, name: str, dedup_window: float) -> _Queue:
        queue = self.queues.get(name)
        if queue is None:
            queue = self.queues[name] = _Queue(self, dedup_window)
        return queue

    def new_entry(self, msg: Outgoing) -> _Entry:
        seq = next(self._seq)
        headers = MappingProxyType(dict(msg.headers))  # handed out read-only, never copied
        return _Entry(
            seq, time.monotonic(), str(seq), msg.body, headers, msg.fifo_group, msg.dedup_id
        )

    def injected_fault(self, queue: QueueRef) -> None:
        """BrokerUnavailable if ``fail_publishes`` said so for ``queue`` (counting it)."""
        left = self.faults.get(queue, 0)
        if left > 0:
            if left == 1:
                del self.faults[queue]
            else:
                self.faults[queue] = left - 1
            raise BrokerUnavailable(f"memory://: publish to {queue} failed (injected)")

    def wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                loop = fut.get_loop()
                if loop.is_closed():
                    continue
                loop.call_soon_threadsafe(_resolve, fut)

    async def wait(self, timeout: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            pass
        finally:
            if fut in self._waiters:
                self._waiters.remove(fut)


def inject_raw(
    name: str, queue: str, body: bytes, headers: Mapping[Any, Any], defect: str | None = None
) -> None:
    """For tests only: write an entry into queue ``queue`` of ``memory://name`` as a foreign
    producer would (the queue must exist), bypassing the facade's validation. memory://
    has no wire format, so what a real broker's decoder finds is given here: ``headers``
    may hold values of any type (a pair that is not ``str -> str`` makes it corrupt, as a
    receiver finds it), ``defect`` names any other damage."""
    hub = _Hub.named(name)
    entry = hub.new_entry(Outgoing(body, None, None, {}))
    good, wrong = str_headers(headers)
    entry.headers, entry.defect = MappingProxyType(good), defect or wrong
    hub.queues[queue].main.append(entry)


def fail_publishes(name: str, queue: str, count: int = 1, *, dead_letters: bool = False) -> None:
    """For tests only: the next ``count`` publish calls to ``queue`` (its DLQ with
    ``dead_letters``) of ``memory://name`` raise BrokerUnavailable and store nothing, as a
    broker that refused them would. ``count=0`` ends it."""
    ref = QueueRef(queue, dead_letters)
    faults = _Hub.named(name).faults
    if count > 0:
        faults[ref] = count
    else:
        faults.pop(ref, None)


def lose_lease(
    name: str, queue: str, group: str, message_id: str, *, dead_letters: bool = False
) -> bool:
    """For tests only: end the live lease of message ``message_id`` of consumer ``group``
    on ``queue`` (its DLQ with ``dead_letters``) of ``memory://name`` now, as a broker
    that lost it would: the message is due again at once, a settle of the old delivery
    raises LeaseExpired. False when no such lease is live."""
    hub = _Hub.named(name)
    q = hub.queues.get(queue)
    view = q.log(QueueRef(queue, dead_letters)).groups.get(group) if q is not None else None
    seq = int(message_id) if message_id.isdigit() else -1
    leased = view.receipts.get(seq) if view is not None else None
    now = time.monotonic()
    if view is None or leased is None or not view.book.holds(seq, leased.token, now):
        return False
    view.book.extend(seq, leased.token, now - 1e-6, now)  # ended: due at the next take
    hub.wake()
    return True


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class MemoryBackend(Backend):
    """The reference backend; see the module docstring for how the contract maps."""

    schemes = ("memory",)

    def __init__(self, name: str, options: MemoryOptions) -> None:
        self.name = name
        self.options = options
        self.capabilities = Capabilities(
            max_message_bytes=options.max_message_bytes,
            dedup_window=options.dedup_window,
            dedup_window_configurable=True,
            fan_out=True,
            redelivery_slack=0.05,
            browse=True,
        )
        self._hub = _Hub.named(name)

    @classmethod
    def from_url(cls, url: BrokerURL) -> MemoryBackend:
        if len(url.hosts) > 1 or url.path not in ("", "/") or url.username or url.password:
            raise ConfigError("memory:// URL takes only a broker name: memory://[name]")
        options = parse_options(url, MemoryOptions)
        name = url.hosts[0].host if url.hosts else ""
        return cls(name, options)

    async def publish(self, queue: QueueRef, messages: Sequence[Outgoing]) -> list[PublishResult]:
        if self._hub.faults:
            self._hub.injected_fault(queue)
        q = self._hub.queue(queue.name, self.options.dedup_window)
        log = q.log(queue)
        results = []
        for msg in messages:
            entry = self._hub.new_entry(msg)
            if msg.dedup_id is not None and not queue.dead_letters:
                earlier = q.dedup.claim(msg.dedup_id, entry.id)
                if earlier is not None:
                    results.append(PublishResult(earlier, duplicate=True))
                    continue
            log.append(entry)
            results.append(PublishResult(entry.id, duplicate=False))
        return results

    async def declare(self, queue: QueueRef, group: str | None = None) -> None:
        q = self._hub.queue(queue.name, self.options.dedup_window)
        if group is not None:
            q.log(queue).group(group)

    async def browse(self, queue: QueueRef, limit: int) -> list[Delivery[None]]:
        log = self._hub.queue(queue.name, self.options.dedup_window).log(queue)
        entries = sorted(log.entries.values(), key=lambda e: e.seq)[:limit]
        return [
            Delivery(e.id, e.body, e.headers, e.fifo_group, e.dedup_id, 0, None, defect=e.defect)
            for e in entries
        ]

    async def stats(self, queue: QueueRef, group: str | None) -> QueueStats:
        log = self._hub.queue(queue.name, self.options.dedup_window).log(queue)
        now = time.monotonic()
        oldest = min((e.born for e in log.entries.values()), default=None)
        age = None if oldest is None else now - oldest
        view = log.groups.get(group) if group is not None else None
        if view is None:  # no such group (yet): everything retained is ready for it
            return QueueStats(len(log.entries), 0, 0, None, age)
        ready, leased, delayed = view.book.counts(now)
        return QueueStats(ready, leased, delayed, None, age)

    async def delete_queue(self, queue: str) -> None:
        """Forget the queue (its log, DLQ, groups, dedup memory); the next use starts anew."""
        self._hub.queues.pop(queue, None)

    async def subscribe(
        self, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> _MemoryReceiver:
        q = self._hub.queue(queue.name, self.options.dedup_window)
        log = q.log(queue)
        return _MemoryReceiver(self._hub, queue, q, log, log.group(group), settings)


_POLL = 0.1
"""Longest a receive waits for a first message before it answers empty (the seam allows an
empty answer at any time; the caller asks again). A publish, settle or due time wakes a
waiting receive at once, so this bounds only how long an idle receive keeps its caller."""


class _MemoryReceiver(Receiver[Leased[int]]):
    def __init__(
        self,
        hub: _Hub,
        ref: QueueRef,
        queue: _Queue,
        log: _Log,
        group: _Group,
        settings: ReceiverSettings,
    ) -> None:
        self._hub = hub
        self._ref = ref
        self._queue = queue
        self._log = log
        self._group = group
        self._lease = settings.ack_timeout

    def _take(self, max_messages: int, now: float) -> list[Delivery[Leased[int]]]:
        group = self._group
        entries = self._log.entries
        out: list[Delivery[Leased[int]]] = []
        for leased in group.book.take(max_messages, now, self._lease):
            seq = leased.key
            attempt = group.attempts[seq] = group.attempts.get(seq, 0) + 1
            entry = entries[seq]
            group.receipts[seq] = leased
            out.append(
                Delivery(
                    id=entry.id,
                    body=entry.body,
                    headers=entry.headers,
                    fifo_group=entry.fifo_group,
                    dedup_id=entry.dedup_id,
                    attempt=attempt,
                    receipt=leased,
                    defect=entry.defect,
                )
            )
        return out

    async def receive(self, max_messages: int, wait: float) -> list[Delivery[Leased[int]]]:
        # at most _POLL: nothing is in flight here, so an empty answer is final at once,
        # and a caller that waits its fetch out (a closing consumer, redrive) waits no longer
        end = time.monotonic() + min(wait, _POLL)
        while True:
            now = time.monotonic()
            out = self._take(max_messages, now)
            if out or now >= end:
                return out
            wake = self._group.book.next_wake()
            timeout = end - now if wake is None else min(end, wake) - now
            await self._hub.wait(max(timeout, 0.001))

    def _settle(self, delivery: Delivery[Leased[int]]) -> None:
        leased = delivery.receipt
        group = self._group
        group.book.settle(leased.key, leased.token, time.monotonic())  # LeaseExpired if lost
        group.attempts.pop(leased.key, None)
        group.receipts.pop(leased.key, None)
        entry = self._log.entries.get(leased.key)
        if entry is not None:
            self._log.release_entry(entry)
        self._hub.wake()

    async def ack(self, delivery: Delivery[Leased[int]]) -> None:
        self._settle(delivery)

    async def nack(self, delivery: Delivery[Leased[int]], delay: float) -> None:
        leased = delivery.receipt
        now = time.monotonic()
        self._group.book.requeue(leased.key, leased.token, now + delay, now)
        self._hub.wake()

    async def release(self, deliveries: Sequence[Delivery[Leased[int]]]) -> None:
        """Give back deliveries the caller never saw, without counting an attempt."""
        now = time.monotonic()
        for delivery in deliveries:
            leased = delivery.receipt
            if not self._group.book.holds(leased.key, leased.token, now):
                continue
            self._group.attempts[leased.key] -= 1
            await self.nack(delivery, 0.0)

    async def dead_letter(
        self, delivery: Delivery[Leased[int]], copy: Outgoing, publish: PublishCopy
    ) -> None:
        """Atomic here: the copy is appended and the original settled in one step."""
        leased = delivery.receipt
        if not self._group.book.holds(leased.key, leased.token, time.monotonic()):
            self._settle(delivery)  # raises LeaseExpired
        if self._hub.faults:  # a DLQ refused by fail_publishes: the move fails whole
            self._hub.injected_fault(self._ref.dlq)
        self._queue.dlq.append(self._hub.new_entry(copy))  # no await between the two
        self._settle(delivery)

    async def extend(self, delivery: Delivery[Leased[int]], ack_timeout: float) -> None:
        leased = delivery.receipt
        now = time.monotonic()
        self._group.book.extend(leased.key, leased.token, now + ack_timeout, now)
