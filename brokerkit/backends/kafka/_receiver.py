"""KafkaReceiver: per-message settling on top of a consumer group's cumulative offsets.

One ``confluent_kafka.Consumer`` per receiver lives in its own thread, which makes
every Consumer call (consume, commit, assign, pause); the asyncio side keeps the
state of each owned partition and sends the thread commands.

* receive -> records fetched with ``consume()`` are handed out per record; within
  a partition, different fifo_groups (and records without one) go out
  concurrently, one record per group at a time (``GroupGate``). Before a record is
  handed out its new delivery count is committed (``commit(asynchronous=False)``
  with the partition's state in the commit metadata), so ``attempt`` is durable.
* ack -> the record is settled in memory; the partition's commit offset moves to
  the lowest unsettled offset and the settled offsets above it go into the
  metadata; an asynchronous commit follows within ``ack_flush_interval``.
* nack(delay) -> the record stays in memory, due ``delay`` s later; its group
  stays blocked (it is the group's head), other groups flow; the due time is
  committed in the metadata so a new owner honours it.
* lease -> a deadline per handed-out record; past it the record is due again
  (attempt + 1 at the next hand-out) and a late settle raises LeaseExpired.
* dead_letter -> the copy is produced to the DLQ topic and its delivery report
  awaited, then the original is settled like an ack.
* rebalance -> on revoke the thread waits (bounded) until the partition's
  handed-out records are settled or their leases ran out, then commits the
  state; the new owner reads the committed offset and metadata and replays the
  partition from there (plus the dedup window before it, to rebuild the dedup memory).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition

from brokerkit._errors import LeaseExpired
from brokerkit._fifo import GroupGate
from brokerkit.backends.base import Delivery, Receiver, ReceiverSettings
from brokerkit.backends.kafka._backend import DEDUP_HEADER, GROUP_HEADER
from brokerkit.backends.kafka._errors import map_error
from brokerkit.backends.kafka._offsets import (
    SETTLED,
    DedupMemory,
    OffsetState,
    decode_metadata,
    encode_metadata,
)
from brokerkit.backends.kafka._options import LOG

if TYPE_CHECKING:
    from brokerkit.backends.kafka._backend import KafkaBackend

__all__ = ["KafkaReceiver"]

WINDOW = 200
"""Records are handed out only below commit point + WINDOW (bounds the commit metadata)."""
PAUSE_SPAN, RESUME_SPAN = 1000, 500
"""Fetching of a partition pauses when this many offsets are held above its commit point."""
PAUSE_BYTES, RESUME_BYTES = 16 << 20, 8 << 20
FLUSH_DELAY = 0.05
"""Acks are coalesced this long before the commit (capabilities.ack_flush_interval = 0.1)."""
REVOKE_WAIT = 120.0
"""Longest a rebalance waits for handed-out records of a revoked partition to settle."""
_CONSUME_TIMEOUT = 0.02
_BATCH = 500

Key = tuple[str, int]
Snapshot = tuple[str, int, int, str]  # topic, partition, commit offset, metadata
_Command = tuple[Callable[[Consumer], Any], concurrent.futures.Future[Any]]


@dataclass(slots=True, eq=False)
class _Record:
    part: _Part
    offset: int
    body: bytes
    headers: dict[str, str]
    fifo_group: str | None
    dedup_id: str | None
    timestamp: int
    count: int = 0
    """Deliveries so far (the attempt of the current/last hand-out)."""
    due: float = 0.0
    """Wall-clock time before which it is not handed out again."""
    token: int = 0
    """Nonzero while leased."""
    deadline: float = 0.0
    qseq: int = 0
    """Sequence of its live entry in the ready heap (older entries are stale)."""


@dataclass(eq=False)
class _Part:
    """One owned partition."""

    topic: str
    partition: int
    commit_from: int
    """The committed offset at assignment: everything below was settled."""
    next_offset: int
    """The offset after the last record read."""
    restored: dict[int, OffsetState]
    dedup: DedupMemory
    records: dict[int, _Record] = field(default_factory=dict)
    """Unsettled records read, in offset order."""
    gate: GroupGate[int] = field(default_factory=GroupGate)
    parked: list[_Record] = field(default_factory=list)
    leased: int = 0
    held_bytes: int = 0
    revoking: bool = False
    gone: bool = False
    dirty: bool = False

    @property
    def key(self) -> Key:
        return (self.topic, self.partition)

    def commit_point(self) -> int:
        for offset in self.records:
            return offset
        return max(self.next_offset, self.commit_from)

    def snapshot(self) -> Snapshot:
        """The commit offset and the metadata describing the offsets above it."""
        commit = self.commit_point()
        now_ms = int(time.time() * 1000)

        def states() -> Any:
            records = self.records
            for offset in range(commit, self.next_offset):
                rec = records.get(offset)
                if rec is None:
                    yield offset, OffsetState(SETTLED)
                else:
                    due = int(rec.due * 1000)
                    yield offset, OffsetState(rec.count, due if due > now_ms else 0)
            for offset in sorted(self.restored):
                if offset >= self.next_offset:
                    yield offset, self.restored[offset]

        return (self.topic, self.partition, commit, encode_metadata(commit, states()))


class KafkaReceiver(Receiver):
    """One consumer of a topic in one Kafka consumer group; see the module docstring."""

    def __init__(
        self,
        backend: KafkaBackend,
        queue_name: str,
        topic: str,
        group_id: str,
        settings: ReceiverSettings,
    ) -> None:
        self._backend = backend
        self._queue_name = queue_name
        self._topic = topic
        self._dlq_topic = backend.topic(queue_name, dead_letters=True)
        self._is_dlq = topic == self._dlq_topic
        self._group_id = group_id
        self._settings = settings
        self._loop = asyncio.get_running_loop()
        self._parts: dict[Key, _Part] = {}
        self._ready: list[tuple[float, int, _Record]] = []
        self._leases: list[tuple[float, int, _Record]] = []
        self._seq = itertools.count(1)
        self._tokens = itertools.count(1)
        self._wake = asyncio.Event()
        self._flush_handle: asyncio.TimerHandle | None = None
        self._closed = False
        # shared with the consumer thread
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._assigned: set[Key] = set()  # thread-side
        self._backlog: dict[Key, tuple[int, int]] = {}  # written by the loop, read by the thread
        self._thread = threading.Thread(
            target=self._run, name=f"brokerkit-kafka-{group_id}", daemon=True
        )

    def __repr__(self) -> str:
        return f"<KafkaReceiver topic={self._topic!r} group={self._group_id!r}>"

    # ================================================================ consumer thread

    async def start(self) -> None:
        self._thread.start()
        await asyncio.wrap_future(self._started)

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is gone: nobody will settle anything
            self._stop.set()

    def _run(self) -> None:
        try:
            consumer = Consumer(self._backend.consumer_config(self._group_id))
            consumer.subscribe(
                [self._topic],
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
        except Exception as exc:
            self._started.set_exception(map_error(exc, self._backend.hosts))
            self._finished.set_result(None)
            return
        self._started.set_result(None)
        paused: set[Key] = set()
        try:
            while not self._stop.is_set():
                self._run_commands(consumer)
                self._flow_control(consumer, paused)
                try:
                    msgs = consumer.consume(_BATCH, _CONSUME_TIMEOUT)
                except (KafkaException, RuntimeError) as exc:
                    LOG.warning("kafka consume failed: %s", exc)
                    time.sleep(0.1)
                    continue
                good = []
                for msg in msgs:
                    err = msg.error()
                    if err is None:
                        good.append(msg)
                    else:
                        LOG.debug("kafka consume error: %s", err)
                if good:
                    self._post(self._ingest, good)
        finally:
            self._run_commands(consumer)
            try:
                consumer.close()
            except Exception as exc:
                LOG.debug("kafka consumer close: %s", exc)
            while True:  # anything sent after the loop stopped fails instead of hanging
                try:
                    _, fut = self._commands.get_nowait()
                except queue.Empty:
                    break
                if not fut.done():
                    fut.set_exception(LeaseExpired("the consumer is closed"))
            self._finished.set_result(None)

    def _run_commands(self, consumer: Consumer) -> None:
        while True:
            try:
                fn, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(consumer))
            except BaseException as exc:
                fut.set_exception(exc)

    def _flow_control(self, consumer: Consumer, paused: set[Key]) -> None:
        to_pause, to_resume = [], []
        for key in self._assigned:
            span, size = self._backlog.get(key, (0, 0))
            if key in paused:
                if span < RESUME_SPAN and size < RESUME_BYTES:
                    to_resume.append(key)
            elif span >= PAUSE_SPAN or size >= PAUSE_BYTES:
                to_pause.append(key)
        for key in list(paused):
            if key not in self._assigned:
                paused.discard(key)
        try:
            if to_pause:
                consumer.pause([TopicPartition(t, p) for t, p in to_pause])
                paused.update(to_pause)
            if to_resume:
                consumer.resume([TopicPartition(t, p) for t, p in to_resume])
                paused.difference_update(to_resume)
        except KafkaException as exc:
            LOG.debug("kafka pause/resume: %s", exc)

    def _commit(self, consumer: Consumer, snaps: Sequence[Snapshot], sync: bool) -> set[Key]:
        """Commit snapshots of partitions this member still owns; return the keys committed."""
        tps = [
            TopicPartition(t, p, offset, meta)
            for t, p, offset, meta in snaps
            if (t, p) in self._assigned
        ]
        if not tps:
            return set()
        try:
            if not sync:
                consumer.commit(offsets=tps, asynchronous=True)
                return {(tp.topic, tp.partition) for tp in tps}
            result = consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            LOG.debug("kafka commit failed: %s", exc)
            return set()
        return {(tp.topic, tp.partition) for tp in result if tp.error is None}

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Read committed offset + metadata; start at the dedup window before it (rebuild)."""
        if not partitions:
            return
        asked = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        try:
            committed = consumer.committed(asked, timeout=10)
        except KafkaException as exc:
            LOG.warning("kafka committed() failed: %s", exc)
            committed = [TopicPartition(tp.topic, tp.partition, OFFSET_INVALID) for tp in asked]
        window_ms = int(self._backend.options.dedup_window * 1000)
        since = int(time.time() * 1000) - window_ms - 1000
        times: dict[Key, int] = {}
        if not self._is_dlq:
            try:
                found = consumer.offsets_for_times(
                    [TopicPartition(tp.topic, tp.partition, since) for tp in asked], timeout=10
                )
                times = {(tp.topic, tp.partition): tp.offset for tp in found}
            except KafkaException as exc:
                LOG.warning("kafka offsets_for_times failed: %s", exc)
        infos = []
        starts = []
        for tp in committed:
            key = (tp.topic, tp.partition)
            try:
                low, _ = consumer.get_watermark_offsets(
                    TopicPartition(tp.topic, tp.partition), timeout=10, cached=False
                )
            except KafkaException:
                low = 0
            commit = max(tp.offset if tp.offset >= 0 else low, low)
            start = commit
            t = times.get(key, -1)
            if t >= 0:
                start = max(min(t, commit), low)
            infos.append((key, commit, start, tp.metadata))
            starts.append(TopicPartition(tp.topic, tp.partition, start))
        self._assigned.update(k for k, *_ in infos)
        self._post(self._assigned_on_loop, infos)
        consumer.incremental_assign(starts)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Wait for handed-out records to settle (bounded), then commit the final state."""
        keys = [(tp.topic, tp.partition) for tp in partitions]
        snaps: list[Snapshot] = []
        try:
            fut = asyncio.run_coroutine_threadsafe(self._revoke_on_loop(keys), self._loop)
            snaps = fut.result(REVOKE_WAIT + 10.0)
        except Exception as exc:
            LOG.warning("kafka revoke: could not collect the partition state: %s", exc)
        self._commit(consumer, snaps, True)
        self._assigned.difference_update(keys)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self._assigned.difference_update(keys)
        self._post(self._lost_on_loop, keys)

    async def _call(self, fn: Callable[[Consumer], Any]) -> Any:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self._finished.done():
            raise LeaseExpired("the consumer is closed")
        self._commands.put((fn, fut))
        return await asyncio.wrap_future(fut)

    # ================================================================ event-loop side

    def _assigned_on_loop(self, infos: list[tuple[Key, int, int, str | None]]) -> None:
        window = self._backend.options.dedup_window
        for key, commit, start, meta in infos:
            old = self._parts.pop(key, None)
            if old is not None:
                old.gone = True
            restored = {o: s for o, s in decode_metadata(commit, meta).items() if o >= commit}
            self._parts[key] = _Part(key[0], key[1], commit, start, restored, DedupMemory(window))
            self._backlog[key] = (0, 0)
        self._wake.set()

    async def _revoke_on_loop(self, keys: list[Key]) -> list[Snapshot]:
        parts = [p for k in keys if (p := self._parts.get(k)) is not None]
        for part in parts:
            part.revoking = True
        deadline = time.monotonic() + REVOKE_WAIT
        while any(p.leased for p in parts) and time.monotonic() < deadline:
            self._expire_leases(time.monotonic())
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), 0.05)
            except TimeoutError:
                pass
        snaps = [p.snapshot() for p in parts]
        self._drop(parts)
        return snaps

    def _lost_on_loop(self, keys: list[Key]) -> None:
        self._drop([p for k in keys if (p := self._parts.get(k)) is not None])

    def _drop(self, parts: list[_Part]) -> None:
        for part in parts:
            part.gone = True
            if self._parts.get(part.key) is part:
                del self._parts[part.key]
                self._backlog.pop(part.key, None)
        self._wake.set()

    def _ingest(self, msgs: list[Any]) -> None:
        touched: set[_Part] = set()
        for msg in msgs:
            part = self._parts.get((msg.topic(), msg.partition()))
            if part is None or part.gone:
                continue
            offset = msg.offset()
            if offset < part.next_offset:
                continue
            part.next_offset = offset + 1
            headers = {k: (v or b"").decode("utf-8", "replace") for k, v in msg.headers() or ()}
            group = headers.pop(GROUP_HEADER, None)
            dedup = headers.pop(DEDUP_HEADER, None)
            timestamp = msg.timestamp()[1]
            touched.add(part)
            if dedup is not None and part.dedup.is_duplicate(dedup, timestamp):
                continue  # a duplicate: settled without delivery
            if offset < part.commit_from:
                continue  # read only to rebuild the dedup memory
            state = part.restored.pop(offset, None)
            if state is not None and state.count == SETTLED:
                continue
            body = msg.value() or b""
            rec = _Record(part, offset, body, headers, group, dedup, timestamp)
            if state is not None:
                rec.count = state.count
                rec.due = state.due_ms / 1000.0
            part.records[offset] = rec
            part.held_bytes += len(body)
            if group is None or part.gate.push(group, offset):
                self._push(rec, rec.due)
        for part in touched:
            self._update_backlog(part)
            part.dirty = True
        if touched:
            self._schedule_flush()
            self._wake.set()

    def _update_backlog(self, part: _Part) -> None:
        span = max(0, part.next_offset - part.commit_point())
        self._backlog[part.key] = (span, part.held_bytes)

    def _push(self, rec: _Record, due: float) -> None:
        rec.qseq = next(self._seq)
        heapq.heappush(self._ready, (due, rec.qseq, rec))

    def _expire_leases(self, now: float) -> None:
        leases = self._leases
        while leases and leases[0][0] <= now:
            _, token, rec = heapq.heappop(leases)
            if rec.token != token or rec.deadline > now:
                continue
            self._unlease(rec)
            self._push(rec, 0.0)

    def _unlease(self, rec: _Record) -> None:
        rec.token = 0
        rec.part.leased -= 1
        if rec.fifo_group is not None:
            rec.part.gate.give_back(rec.fifo_group)
        self._wake.set()

    def _take(self, max_messages: int) -> list[_Record]:
        out: list[_Record] = []
        ready = self._ready
        now = time.time()
        deadline = time.monotonic() + self._settings.ack_timeout
        while ready and ready[0][0] <= now and len(out) < max_messages:
            _, qseq, rec = heapq.heappop(ready)
            part = rec.part
            if rec.qseq != qseq or rec.token or part.gone or part.revoking:
                continue
            if part.records.get(rec.offset) is not rec:
                continue
            group = rec.fifo_group
            gate = part.gate
            if group is not None and (gate.is_busy(group) or gate.head(group) != rec.offset):
                continue
            if rec.offset >= part.commit_point() + WINDOW:
                part.parked.append(rec)
                continue
            if group is not None:
                part.gate.take(group)
            rec.qseq = 0
            rec.count += 1
            rec.due = 0.0
            rec.token = next(self._tokens)
            rec.deadline = deadline
            part.leased += 1
            heapq.heappush(self._leases, (deadline, rec.token, rec))
            out.append(rec)
        return out

    def _next_wake(self, end: float) -> float:
        now = time.monotonic()
        timeout = end - now
        if self._ready:
            timeout = min(timeout, self._ready[0][0] - time.time())
        if self._leases:
            timeout = min(timeout, self._leases[0][0] - now)
        return max(timeout, 0.001)

    async def receive(self, max_messages: int, wait: float) -> list[Delivery]:
        """Hand out due records; commit their new delivery counts first (durable attempt)."""
        # Give up slightly before ``wait``: a receive that ends in the same loop iteration as
        # a caller's equally long timeout can starve the facade's done-callback (see docs).
        end = time.monotonic() + wait - min(0.05, wait / 10)
        while True:
            self._expire_leases(time.monotonic())
            taken = self._take(max_messages)
            if taken:
                delivered = await self._persist(taken)
                if delivered:
                    return [self._delivery(rec) for rec in delivered]
            if time.monotonic() >= end:
                return []
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self._next_wake(end))
            except TimeoutError:
                pass

    async def _persist(self, taken: list[_Record]) -> list[_Record]:
        parts = {rec.part for rec in taken}
        snaps = [part.snapshot() for part in parts]
        try:
            ok: set[Key] = await self._call(lambda c: self._commit(c, snaps, True))
        except LeaseExpired:
            ok = set()
        delivered = []
        failed = False
        for rec in taken:
            part = rec.part
            if part.key in ok and not part.gone:
                part.dirty = False
                delivered.append(rec)
            elif not part.gone and rec.token:
                # not recorded: give it back uncounted and try again later
                failed = True
                rec.count -= 1
                self._unlease(rec)
                self._push(rec, 0.0)
        if failed and not delivered:
            await asyncio.sleep(0.1)
        return delivered

    def _delivery(self, rec: _Record) -> Delivery:
        part = rec.part
        return Delivery(
            id=f"{part.partition}-{rec.offset}",
            body=rec.body,
            headers=dict(rec.headers),
            fifo_group=rec.fifo_group,
            dedup_id=rec.dedup_id,
            attempt=rec.count,
            receipt=(rec, rec.token),
            extras={
                "topic": part.topic,
                "partition": part.partition,
                "offset": rec.offset,
                "timestamp_ms": rec.timestamp,
            },
        )

    def _held(self, delivery: Delivery) -> _Record:
        rec, token = delivery.receipt
        if not isinstance(rec, _Record) or rec.token != token or rec.part.gone:
            raise LeaseExpired(f"the lease on message {delivery.id!r} was lost")
        if time.monotonic() > rec.deadline:
            raise LeaseExpired(f"the lease on message {delivery.id!r} ran out")
        return rec

    def _settle(self, rec: _Record) -> None:
        part = rec.part
        rec.token = 0
        part.leased -= 1
        before = part.commit_point()
        del part.records[rec.offset]
        part.held_bytes -= len(rec.body)
        if rec.fifo_group is not None:
            nxt = part.gate.done(rec.fifo_group)
            if nxt is not None:
                self._push(part.records[nxt], part.records[nxt].due)
        if part.parked and part.commit_point() != before:
            parked, part.parked = part.parked, []
            for other in parked:
                self._push(other, other.due)
        self._update_backlog(part)
        self._mark_dirty(part)

    def _mark_dirty(self, part: _Part) -> None:
        part.dirty = True
        self._schedule_flush()
        self._wake.set()

    def _schedule_flush(self) -> None:
        if self._flush_handle is None and not self._closed:
            self._flush_handle = self._loop.call_later(FLUSH_DELAY, self._flush)

    def _flush(self) -> None:
        """Commit the state of every changed partition (asynchronous commit)."""
        self._flush_handle = None
        snaps = []
        for part in self._parts.values():
            if part.dirty and not part.gone and not part.revoking:
                part.dirty = False
                snaps.append(part.snapshot())
        if snaps and not self._finished.done():
            fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
            self._commands.put((lambda c: self._commit(c, snaps, False), fut))

    async def ack(self, delivery: Delivery) -> None:
        """ack -> settled in memory; the commit follows within ack_flush_interval."""
        self._settle(self._held(delivery))

    async def nack(self, delivery: Delivery, delay: float) -> None:
        """nack -> held in memory until due; the group stays blocked; due time committed."""
        rec = self._held(delivery)
        self._unlease(rec)
        rec.due = time.time() + delay
        self._push(rec, rec.due)
        self._mark_dirty(rec.part)

    async def release(self, deliveries: Sequence[Delivery]) -> None:
        """Give back unseen deliveries without counting the attempt."""
        for delivery in deliveries:
            try:
                rec = self._held(delivery)
            except LeaseExpired:
                continue
            rec.count -= 1
            self._unlease(rec)
            rec.due = 0.0
            self._push(rec, 0.0)
            self._mark_dirty(rec.part)

    async def extend(self, delivery: Delivery, ack_timeout: float) -> None:
        rec = self._held(delivery)
        rec.deadline = time.monotonic() + ack_timeout
        heapq.heappush(self._leases, (rec.deadline, rec.token, rec))

    async def dead_letter(self, delivery: Delivery, envelope: Mapping[str, str]) -> None:
        """dead_letter -> produce the copy to the DLQ topic, await its report, then settle."""
        rec = self._held(delivery)
        token = rec.token
        rec.deadline = max(rec.deadline, time.monotonic() + 60.0)  # keep it while producing
        headers = {**rec.headers, **envelope}
        if rec.fifo_group is not None:
            headers[GROUP_HEADER] = rec.fifo_group
        fut = await self._backend.produce(self._dlq_topic, rec.body, rec.fifo_group, headers)
        await fut
        if rec.token != token or rec.part.gone:
            raise LeaseExpired(f"message {delivery.id!r}: lease lost while dead-lettering")
        self._settle(rec)

    async def aclose(self) -> None:
        """Commit the final state, leave the group (close()), stop the thread."""
        if self._closed:
            return
        self._closed = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        snaps = [p.snapshot() for p in self._parts.values() if not p.gone]
        if snaps and not self._finished.done():
            try:
                await self._call(lambda c: self._commit(c, snaps, True))
            except LeaseExpired:
                pass
        self._stop.set()
        try:
            await asyncio.wait_for(asyncio.wrap_future(self._finished), 60.0)
        except TimeoutError:
            LOG.warning("kafka consumer thread did not stop in time")
        self._drop(list(self._parts.values()))
        self._backend.forget(self)
