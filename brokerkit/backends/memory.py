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
* FIFO groups -> ``GroupGate``: only a group's head is ever due, one at a time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import Field

from brokerkit._dedup import DedupWindow
from brokerkit._errors import ConfigError, LeaseExpired
from brokerkit._fifo import GroupGate
from brokerkit._message import Outgoing, PublishResult
from brokerkit._options import Options, parse_options
from brokerkit._url import BrokerURL
from brokerkit.backends.base import Backend, Capabilities, Delivery, Receiver, ReceiverSettings

__all__ = ["MemoryBackend", "MemoryOptions"]


class MemoryOptions(Options):
    dedup_window: float = Field(300.0, gt=0)
    """Seconds a dedup id is remembered."""
    max_message_bytes: int = Field(4 * 1024 * 1024, ge=256 * 1024)


@dataclass(slots=True)
class _Entry:
    seq: int
    id: str
    body: bytes
    headers: dict[str, str]
    fifo_group: str | None
    dedup_id: str | None
    refs: int = 0


@dataclass(slots=True)
class _Slot:
    entry: _Entry
    attempts: int = 0
    token: int = 0  # nonzero while leased
    deadline: float = 0.0


@dataclass(eq=False)
class _Group:
    """One consumer group's view of a log."""

    slots: dict[int, _Slot] = field(default_factory=dict)
    ready: list[tuple[float, int]] = field(default_factory=list)  # (due, seq), heap
    leases: list[tuple[float, int, int]] = field(default_factory=list)  # (deadline, seq, token)
    gate: GroupGate[int] = field(default_factory=GroupGate)

    def add(self, entry: _Entry, now: float) -> None:
        entry.refs += 1
        self.slots[entry.seq] = _Slot(entry)
        group = entry.fifo_group
        if group is None or self.gate.push(group, entry.seq):
            heapq.heappush(self.ready, (now, entry.seq))

    def next_wake(self) -> float | None:
        times = [h[0][0] for h in (self.ready, self.leases) if h]
        return min(times) if times else None


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


class _Hub:
    """One named in-process broker, shared by every connection to its URL."""

    _hubs: ClassVar[dict[str, _Hub]] = {}

    def __init__(self) -> None:
        self.queues: dict[str, _Queue] = {}
        self._seq = itertools.count(1)
        self._waiters: list[asyncio.Future[None]] = []

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

    def new_entry(self, msg: Outgoing, headers: Mapping[str, str] | None = None) -> _Entry:
        seq = next(self._seq)
        return _Entry(
            seq, str(seq), msg.body, dict(headers or msg.headers), msg.fifo_group, msg.dedup_id
        )

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
        )
        self._hub = _Hub.named(name)

    @classmethod
    def from_url(cls, url: BrokerURL) -> MemoryBackend:
        if len(url.hosts) > 1 or url.path not in ("", "/") or url.username or url.password:
            raise ConfigError("memory:// URL takes only a broker name: memory://[name]")
        options = parse_options(url, MemoryOptions)
        name = url.hosts[0].host if url.hosts else ""
        return cls(name, options)

    async def open(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def publish(self, queue: str, messages: Sequence[Outgoing]) -> list[PublishResult]:
        q = self._hub.queue(queue, self.options.dedup_window)
        results = []
        for msg in messages:
            entry = self._hub.new_entry(msg)
            if msg.dedup_id is not None:
                earlier = q.dedup.claim(msg.dedup_id, entry.id)
                if earlier is not None:
                    results.append(PublishResult(earlier, duplicate=True))
                    continue
            q.main.append(entry)
            results.append(PublishResult(entry.id, duplicate=False))
        return results

    async def delete_queue(self, queue: str) -> None:
        """Forget the queue (its log, DLQ, groups, dedup memory); the next use starts anew."""
        self._hub.queues.pop(queue, None)

    async def subscribe(
        self, queue: str, group: str, settings: ReceiverSettings, *, dead_letters: bool = False
    ) -> Receiver:
        q = self._hub.queue(queue, self.options.dedup_window)
        log = q.dlq if dead_letters else q.main
        return _MemoryReceiver(self._hub, q, log, log.group(group), settings)


class _MemoryReceiver(Receiver):
    def __init__(
        self, hub: _Hub, queue: _Queue, log: _Log, group: _Group, settings: ReceiverSettings
    ) -> None:
        self._hub = hub
        self._queue = queue
        self._log = log
        self._group = group
        self._settings = settings
        self._tokens = itertools.count(1)

    def _reclaim(self, now: float) -> None:
        group = self._group
        while group.leases and group.leases[0][0] <= now:
            _, seq, token = heapq.heappop(group.leases)
            slot = group.slots.get(seq)
            if slot is None or slot.token != token or slot.deadline > now:
                continue
            slot.token = 0
            fifo = slot.entry.fifo_group
            if fifo is not None:
                group.gate.give_back(fifo)
            heapq.heappush(group.ready, (now, seq))

    def _take(self, max_messages: int, now: float) -> list[Delivery]:
        group = self._group
        out: list[Delivery] = []
        while group.ready and group.ready[0][0] <= now and len(out) < max_messages:
            _, seq = heapq.heappop(group.ready)
            slot = group.slots.get(seq)
            if slot is None or slot.token:
                continue
            fifo = slot.entry.fifo_group
            if fifo is not None:
                if group.gate.is_busy(fifo) or group.gate.head(fifo) != seq:
                    continue
                group.gate.take(fifo)
            slot.attempts += 1
            slot.token = next(self._tokens)
            slot.deadline = now + self._settings.ack_timeout
            heapq.heappush(group.leases, (slot.deadline, seq, slot.token))
            entry = slot.entry
            out.append(
                Delivery(
                    id=entry.id,
                    body=entry.body,
                    headers=dict(entry.headers),
                    fifo_group=entry.fifo_group,
                    dedup_id=entry.dedup_id,
                    attempt=slot.attempts,
                    receipt=(seq, slot.token),
                )
            )
        return out

    async def receive(self, max_messages: int, wait: float) -> list[Delivery]:
        end = time.monotonic() + wait
        while True:
            now = time.monotonic()
            self._reclaim(now)
            out = self._take(max_messages, now)
            if out or now >= end:
                return out
            wake = self._group.next_wake()
            timeout = end - now if wake is None else min(end, wake) - now
            await self._hub.wait(max(timeout, 0.001))

    def _held_slot(self, delivery: Delivery) -> _Slot:
        seq, token = delivery.receipt
        slot = self._group.slots.get(seq)
        if slot is None or slot.token != token or slot.deadline < time.monotonic():
            raise LeaseExpired(f"the lease on message {delivery.id!r} was lost")
        return slot

    def _settle(self, slot: _Slot) -> None:
        group = self._group
        entry = slot.entry
        del group.slots[entry.seq]
        if entry.fifo_group is not None:
            nxt = group.gate.done(entry.fifo_group)
            if nxt is not None:
                heapq.heappush(group.ready, (time.monotonic(), nxt))
        self._log.release_entry(entry)
        self._hub.wake()

    async def ack(self, delivery: Delivery) -> None:
        self._settle(self._held_slot(delivery))

    async def nack(self, delivery: Delivery, delay: float) -> None:
        slot = self._held_slot(delivery)
        slot.token = 0
        if slot.entry.fifo_group is not None:
            self._group.gate.give_back(slot.entry.fifo_group)
        heapq.heappush(self._group.ready, (time.monotonic() + delay, slot.entry.seq))
        self._hub.wake()

    async def release(self, deliveries: Sequence[Delivery]) -> None:
        """Give back deliveries the caller never saw, without counting an attempt."""
        for delivery in deliveries:
            try:
                slot = self._held_slot(delivery)
            except LeaseExpired:
                continue
            slot.attempts -= 1
            await self.nack(delivery, 0.0)

    async def dead_letter(self, delivery: Delivery, envelope: Mapping[str, str]) -> None:
        slot = self._held_slot(delivery)
        entry = slot.entry
        copy = self._hub.new_entry(
            Outgoing(entry.body, entry.fifo_group, None), {**entry.headers, **envelope}
        )
        self._queue.dlq.append(copy)  # same step as the settle below: no await in between
        self._settle(slot)

    async def extend(self, delivery: Delivery, ack_timeout: float) -> None:
        slot = self._held_slot(delivery)
        slot.deadline = time.monotonic() + ack_timeout
        heapq.heappush(self._group.leases, (slot.deadline, slot.entry.seq, slot.token))

    async def aclose(self) -> None:
        return None
