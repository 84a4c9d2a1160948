"""KafkaReceiver: per-message settling on top of a consumer group's cumulative offsets.

One ``confluent_kafka.Consumer`` per receiver lives in its own thread, which makes
every Consumer call (consume, commit, assign, pause); the asyncio side keeps the
state of each owned partition and sends the thread commands.

* receive -> records fetched with ``consume()`` are handed out per record; within
  a partition, different fifo_groups (and records without one) go out
  concurrently, one record per group at a time (``GroupGate``). Before a record is
  handed out its new delivery count is committed (``commit(asynchronous=False)``
  with the partition's state in the commit metadata), so ``attempt`` is durable.
  A receive that returns a full batch stages the next one (taken and counted now,
  leased when the next receive hands it over), so that commit overlaps the caller's work.
  The thread runs commands between ``consume`` calls; after a command it stays hot
  (non-blocking ``consume`` + a wait on ``_kick``) so the next command starts at once.
  A count commit sent to a hot thread also hands it the GIL: the loop waits (at most
  ``_HAND_OVER_WAIT``) until the thread has started it, because a busy event loop
  otherwise keeps the GIL for up to a switch interval (5 ms) before the thread runs.
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
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition

from brokerkit._errors import LeaseExpired
from brokerkit._fifo import GroupGate
from brokerkit.backends.base import NO_HEADERS, Delivery, Receiver, ReceiverSettings
from brokerkit.backends.kafka._backend import DEDUP_HEADER, GROUP_HEADER
from brokerkit.backends.kafka._errors import map_error
from brokerkit.backends.kafka._offsets import (
    SETTLED,
    DedupMemory,
    OffsetState,
    decode_metadata,
    encode_runs,
    state_text,
)
from brokerkit.backends.kafka._options import LOG

if TYPE_CHECKING:
    from brokerkit.backends.kafka._backend import KafkaBackend

__all__ = ["KafkaReceiver"]

WINDOW = 200
"""Records are handed out only below commit point + WINDOW (bounds the commit metadata)."""
PAUSE_SPAN, RESUME_SPAN = 4000, 2000
"""Fetching of a partition pauses when this many offsets are held above its commit point."""
PAUSE_BYTES, RESUME_BYTES = 16 << 20, 8 << 20
FLUSH_DELAY = 0.05
"""Acks are coalesced this long before the commit (capabilities.ack_flush_interval = 0.1)."""
REVOKE_WAIT = 120.0
"""Longest a rebalance waits for handed-out records of a revoked partition to settle."""
_CONSUME_TIMEOUT = 0.02
"""consume() timeout of an idle consumer thread (the longest a first command waits)."""
_HOT_SPELL = 0.25
"""After a command, the thread stays hot this long: non-blocking consume + a kickable wait."""
_HOT_WAIT = 0.002
_HAND_OVER_WAIT = 0.001
"""Longest the loop waits for a hot consumer thread to start a count commit (``_call``)."""
_BATCH = 500

Key = tuple[str, int]
Snapshot = tuple[str, int, int, str]  # topic, partition, commit offset, metadata
_Command = tuple[Callable[[Consumer], Any], concurrent.futures.Future[Any]]


@dataclass(slots=True, eq=False)
class _Record:
    part: _Part
    offset: int
    body: bytes
    headers: Mapping[str, str]
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
    parked: list[tuple[int, int, _Record]] = field(default_factory=list)
    """Heap by offset of eligible records found beyond the hand-out window by ``_take``."""
    beyond: deque[_Record] = field(default_factory=deque)
    """Eligible records read beyond the hand-out window, in offset order (``_ingest``)."""
    leased: int = 0
    held_bytes: int = 0
    revoking: bool = False
    gone: bool = False
    dirty: bool = False
    low: int = -1
    """No unsettled record below this offset (walks up as records settle)."""
    top: int = -1
    """Highest offset whose state the metadata must carry (handed out, restored, skipped)."""
    span: int = 0
    """Offsets held above the commit point at the last backlog update (flow control)."""
    moved: bool = False
    """Its commit point may have moved since ``KafkaReceiver._apply_moved`` last ran."""
    key: Key = ("", -1)
    extras: dict[str, Any] = field(default_factory=dict)
    """The delivery extras every record of this partition shares (offset, timestamp added)."""

    def __post_init__(self) -> None:
        self.low = self.commit_from
        self.key = (self.topic, self.partition)
        self.extras = {"topic": self.topic, "partition": self.partition}

    def commit_point(self) -> int:
        """The lowest unsettled offset (amortised O(1): ``low`` only moves up)."""
        low, end, records = self.low, self.next_offset, self.records
        while low < end and low not in records:
            low += 1
        self.low = low
        return low if low < end else max(end, self.commit_from)

    def runs(self, commit: int) -> Iterator[tuple[int, int, str]]:
        """The metadata runs above ``commit``: settled offsets and delivery counts."""
        run_start = run_len = 0
        run_text = ""  # "" = never delivered (omitted)
        for offset, text in self._states(commit):
            if text == run_text and offset == run_start + run_len:
                run_len += 1
                continue
            if run_text:
                yield run_start, run_len, run_text
            run_start, run_len, run_text = offset, 1, text
        if run_text:
            yield run_start, run_len, run_text

    def _states(self, commit: int) -> Iterator[tuple[int, str]]:
        """(offset, state text) above ``commit`` in offset order: the records read so far,
        then the restored states of offsets not read back yet."""
        now_ms = int(time.time() * 1000)
        records = self.records
        for offset in range(commit, min(self.top + 1, self.next_offset)):
            rec = records.get(offset)
            if rec is None:
                yield offset, "s"
            elif rec.count == 0:
                yield offset, ""
            elif not rec.due:
                yield offset, "1" if rec.count == 1 else state_text(rec.count)
            else:
                due = int(rec.due * 1000)
                yield offset, state_text(rec.count, due if due > now_ms else 0)
        for offset in sorted(self.restored):
            if offset >= self.next_offset:
                state = self.restored[offset]
                yield offset, state_text(state.count, state.due_ms)

    def snapshot(self) -> Snapshot:
        """The commit offset and the metadata describing the offsets above it."""
        commit = self.commit_point()
        text, _ = encode_runs(commit, self.runs(commit))
        return (self.topic, self.partition, commit, text)


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
        self._ready: deque[tuple[int, _Record]] = deque()
        """Records due now, in push order: (qseq, record); older qseqs are stale entries."""
        self._later: list[tuple[float, int, _Record]] = []
        """Heap of records due later (nack delay): (due wall-clock time, qseq, record)."""
        self._leases: list[tuple[float, int, int, int]] = []
        """Heap of lease deadlines, one entry per hand-out: (deadline, seq, first token, end).

        A hand-out's tokens are consecutive; the entry names them, not the records,
        so a settled record (and its body) is freed at once, not at its old deadline."""
        self._leased: dict[int, _Record] = {}
        """Token -> record, for every leased (or staged) record: the settle receipts."""
        self._moved: list[_Part] = []
        """Partitions whose lowest held record was settled since ``_apply_moved`` last ran."""
        self._seq = itertools.count(1)
        self._next_token = 1
        self._wake = asyncio.Event()
        self._flush_handle: asyncio.TimerHandle | None = None
        self._staged: list[_Record] = []
        """Counted (committed) but not handed over yet: the next receive's batch."""
        self._staging: asyncio.Future[None] | None = None
        self._closed = False
        # shared with the consumer thread
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._commands_closed = False
        self._commands_lock = threading.Lock()
        self._picked = threading.Event()
        """Set by the consumer thread when it starts a command (GIL hand-over, ``_call``)."""
        self._kick = threading.Event()
        """Set with every command: wakes the consumer thread when it is hot."""
        self._hot_until = 0.0
        """Monotonic time until which the thread polls without blocking (commands expected)."""
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
                hot = time.monotonic() < self._hot_until
                try:
                    # hot: never block in consume (it cannot be woken); wait on the kick instead
                    msgs = consumer.consume(_BATCH, 0 if hot else _CONSUME_TIMEOUT)
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
                elif hot:
                    self._kick.wait(_HOT_WAIT)
                    self._kick.clear()
        finally:
            self._run_commands(consumer)
            try:
                consumer.close()
            except Exception as exc:
                LOG.debug("kafka consumer close: %s", exc)
            with self._commands_lock:  # anything sent after that fails instead of hanging
                self._commands_closed = True
                while True:
                    try:
                        command = self._commands.get_nowait()
                    except queue.Empty:
                        break
                    if not command[1].done():
                        command[1].set_exception(LeaseExpired("the consumer is closed"))
            self._finished.set_result(None)

    def _run_commands(self, consumer: Consumer) -> None:
        while True:
            try:
                fn, fut = self._commands.get_nowait()
            except queue.Empty:
                return
            self._picked.set()
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
        hot = time.monotonic() < self._hot_until
        self._picked.clear()
        self._send(fn, fut)
        if hot:
            # hand the GIL over (see the module docstring): blocks the loop until the
            # thread has picked the command up, typically well under 0.1 ms
            self._picked.wait(_HAND_OVER_WAIT)
        return await asyncio.wrap_future(fut)

    def _send(self, fn: Callable[[Consumer], Any], fut: concurrent.futures.Future[Any]) -> None:
        with self._commands_lock:
            if self._commands_closed:
                raise LeaseExpired("the consumer is closed")
            self._commands.put((fn, fut))
        self._hot_until = time.monotonic() + _HOT_SPELL
        self._kick.set()

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
        self._unstage(parts)
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
        if parts:  # their leases are lost: settles raise LeaseExpired
            for token, rec in list(self._leased.items()):
                if rec.part.gone:
                    del self._leased[token]
                    rec.token = 0
        self._wake.set()

    def _ingest(self, msgs: list[Any]) -> None:
        touched: set[_Part] = set()
        parts, topic = self._parts, self._topic
        seq, ready = self._seq, self._ready
        last_p = -1
        limit = 0
        part: _Part | None = None
        for msg in msgs:
            p = msg.partition()
            if p != last_p:  # a consume() batch comes in runs of one partition
                last_p, part = p, parts.get((topic, p))
                if part is None or part.gone:
                    continue
                touched.add(part)
                # records past the hand-out window wait in offset order (no _take pass)
                limit = -1 if part.beyond else part.commit_point() + WINDOW
            if part is None or part.gone:
                continue
            offset = msg.offset()
            if offset < part.next_offset:
                continue
            part.next_offset = offset + 1
            raw = msg.headers()
            headers: Mapping[str, str] = NO_HEADERS
            group = dedup = None
            if raw:
                decoded = {k: (v or b"").decode("utf-8", "replace") for k, v in raw}
                group = decoded.pop(GROUP_HEADER, None)
                dedup = decoded.pop(DEDUP_HEADER, None)
                headers = decoded
            timestamp = msg.timestamp()[1]
            if offset < part.commit_from:
                if dedup is not None:
                    part.dedup.is_duplicate(dedup, timestamp)
                continue  # read only to rebuild the dedup memory
            if dedup is not None and part.dedup.is_duplicate(dedup, timestamp):
                part.top = max(part.top, offset)
                continue  # a duplicate: settled without delivery
            state = part.restored.pop(offset, None) if part.restored else None
            if state is not None:
                part.top = max(part.top, offset)
                if state.count == SETTLED:
                    continue
            body = msg.value() or b""
            rec = _Record(part, offset, body, headers, group, dedup, timestamp)
            part.records[offset] = rec
            part.held_bytes += len(body)
            if state is not None:
                rec.count = state.count
                rec.due = state.due_ms / 1000.0
                if group is None or part.gate.push(group, offset):
                    self._push(rec, rec.due)
            elif group is None or part.gate.push(group, offset):
                if 0 <= offset < limit:
                    rec.qseq = qseq = next(seq)  # _push, inlined: due now
                    ready.append((qseq, rec))
                else:
                    limit = -1  # keep offset order: the rest of this run waits too
                    part.beyond.append(rec)
        for part in touched:
            if part.beyond:
                self._commit_moved(part)
            self._update_backlog(part)
            part.dirty = True  # the flush updates the backlog again as records settle
        if touched:
            self._schedule_flush()
            self._wake.set()

    def _update_backlog(self, part: _Part) -> None:
        part.span = span = max(0, part.next_offset - part.commit_point())
        self._backlog[part.key] = (span, part.held_bytes)

    def _push(self, rec: _Record, due: float) -> None:
        rec.qseq = qseq = next(self._seq)
        if due <= 0.0:
            self._ready.append((qseq, rec))
        else:
            heapq.heappush(self._later, (due, qseq, rec))

    def _expire_leases(self, now: float) -> None:
        leases, leased = self._leases, self._leased
        while leases and leases[0][0] <= now:
            _, _, first, end = heapq.heappop(leases)
            for token in range(first, end):
                rec = leased.get(token)
                if rec is None or rec.deadline > now:
                    continue  # settled, or extended (a later entry holds it)
                self._unlease(rec)
                self._push(rec, 0.0)

    def _unlease(self, rec: _Record) -> None:
        self._leased.pop(rec.token, None)
        rec.token = 0
        rec.part.leased -= 1
        if rec.fifo_group is not None:
            rec.part.gate.give_back(rec.fifo_group)
        self._wake.set()

    def _take(self, max_messages: int, *, staged: bool = False) -> list[_Record]:
        if self._moved:
            self._apply_moved()
        out: list[_Record] = []
        ready, later = self._ready, self._later
        if later:
            now = time.time()
            while later and later[0][0] <= now:
                _, qseq, rec = heapq.heappop(later)
                ready.append((qseq, rec))
        # a staged record has no lease (and no lease entry) until it is handed over
        deadline = math.inf if staged else time.monotonic() + self._settings.ack_timeout
        leased = self._leased
        first = token = self._next_token
        limit_part: _Part | None = None
        limit = 0  # limit_part's hand-out window end (no settle can move it meanwhile)
        while ready and len(out) < max_messages:
            qseq, rec = ready.popleft()
            part = rec.part
            if rec.qseq != qseq or rec.token or part.gone or part.revoking:
                continue
            if part.records.get(rec.offset) is not rec:
                continue
            group = rec.fifo_group
            gate = part.gate
            if group is not None and (gate.is_busy(group) or gate.head(group) != rec.offset):
                continue
            if part is not limit_part:
                limit_part, limit = part, part.commit_point() + WINDOW
            if rec.offset >= limit:
                heapq.heappush(part.parked, (rec.offset, rec.qseq, rec))
                continue
            if group is not None:
                part.gate.take(group)
            rec.qseq = 0
            if rec.offset > part.top:
                part.top = rec.offset
            rec.count += 1
            rec.due = 0.0
            rec.token = token
            leased[token] = rec
            token += 1
            rec.deadline = deadline
            part.leased += 1
            out.append(rec)
        self._next_token = token
        if out and not staged:
            heapq.heappush(self._leases, (deadline, next(self._seq), first, token))
        return out

    def _next_wake(self, end: float) -> float:
        now = time.monotonic()
        timeout = end - now
        if self._later:
            timeout = min(timeout, self._later[0][0] - time.time())
        if self._leases:
            timeout = min(timeout, self._leases[0][0] - now)
        return max(timeout, 0.001)

    async def receive(self, max_messages: int, wait: float) -> list[Delivery]:
        """Hand out due records; commit their new delivery counts first (durable attempt)."""
        end = time.monotonic() + wait
        if self._staging is not None:
            await asyncio.shield(self._staging)  # cancelled: the staged records stay staged
        while True:
            self._expire_leases(time.monotonic())
            delivered = self._hand_over_staged(max_messages)
            if not delivered:
                taken = self._take(max_messages)
                if taken:
                    delivered = await self._persist(taken)
            if delivered:
                if len(delivered) == max_messages:
                    self._stage_next(max_messages)
                return self._deliveries(delivered)
            if time.monotonic() >= end:
                return []
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self._next_wake(end))
            except TimeoutError:
                pass

    def _stage_next(self, max_messages: int) -> None:
        """Busy: take the next batch now and commit its counts while the caller works.

        Staged records are counted and hold their fifo_group, but their lease starts
        only when a receive hands them over; close and revocation give them back
        uncounted. (A crash meanwhile over-counts them by one, as for any crash
        between the count commit and the hand-out.)
        """
        if self._closed or self._staging is not None or self._staged:
            return
        if self._moved:
            self._apply_moved()
        if not self._ready and not self._later:
            return
        taken = self._take(max_messages, staged=True)
        if taken:
            self._staged = taken
            self._staging = asyncio.ensure_future(self._stage(taken))

    async def _stage(self, taken: list[_Record]) -> None:
        try:
            await self._persist(taken)  # a failure gives the records back (token 0)
        finally:
            self._staging = None

    def _hand_over_staged(self, max_messages: int) -> list[_Record]:
        """Start the lease of staged records the count commit covered.

        They keep the tokens ``_take`` gave them (consecutive, ascending in staging
        order), so one lease entry per run of consecutive tokens names them and the
        token -> record dict is not touched.
        """
        staged = self._staged
        if not staged:
            return []
        out: list[_Record] = []
        rest: list[_Record] = []
        for rec in staged:
            part = rec.part
            if not rec.token or part.gone or part.records.get(rec.offset) is not rec:
                continue
            (out if len(out) < max_messages else rest).append(rec)
        self._staged = rest
        if out:
            deadline = time.monotonic() + self._settings.ack_timeout
            leases, seq = self._leases, self._seq
            first = end = out[0].token
            for rec in out:
                rec.deadline = deadline
                token = rec.token
                if token != end:  # a gap (one given back meanwhile): a new run
                    heapq.heappush(leases, (deadline, next(seq), first, end))
                    first = token
                end = token + 1
            heapq.heappush(leases, (deadline, next(seq), first, end))
        return out

    def _unstage(self, parts: Sequence[_Part] | None = None) -> None:
        """Give staged records back uncounted (close, or their partition is revoked)."""
        keep: list[_Record] = []
        for rec in self._staged:
            if not rec.token or rec.part.gone:
                continue
            if parts is not None and rec.part not in parts:
                keep.append(rec)
                continue
            rec.count -= 1
            self._unlease(rec)
            rec.due = 0.0
            self._push(rec, 0.0)
            self._mark_dirty(rec.part)
        self._staged = keep

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
                # (part stays dirty: acks made while this commit was in flight are not in it)
                if rec.token:  # else given back meanwhile (lease ran out, unstaged)
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

    def _deliveries(self, recs: list[_Record]) -> list[Delivery]:
        """One ``Delivery`` per record (positional: this runs once per message)."""
        out: list[Delivery] = []
        append = out.append
        for rec in recs:
            part = rec.part
            offset = rec.offset
            extras = part.extras.copy()
            extras["offset"] = offset
            extras["timestamp_ms"] = rec.timestamp
            append(
                Delivery(
                    f"{part.partition}-{offset}",
                    rec.body,
                    dict(rec.headers) if rec.headers else NO_HEADERS,
                    rec.fifo_group,
                    rec.dedup_id,
                    rec.count,
                    rec.token,
                    extras,
                )
            )
        return out

    def _held(self, delivery: Delivery) -> _Record:
        rec = self._leased.get(delivery.receipt)
        if rec is None or rec.part.gone:
            raise LeaseExpired(f"the lease on message {delivery.id!r} was lost")
        if time.monotonic() > rec.deadline:
            raise LeaseExpired(f"the lease on message {delivery.id!r} ran out")
        return rec

    def _settle(self, rec: _Record) -> None:
        part = rec.part
        records = part.records
        del self._leased[rec.token]
        rec.token = 0
        part.leased -= 1
        del records[rec.offset]
        part.held_bytes -= len(rec.body)
        if rec.fifo_group is not None:
            nxt = part.gate.done(rec.fifo_group)
            if nxt is not None:
                self._push(records[nxt], records[nxt].due)
        if part.low not in records and not part.moved:  # the commit point may have moved up
            part.moved = True
            if not self._moved:
                self._loop.call_soon(self._apply_moved)
            self._moved.append(part)
        self._mark_dirty(part)

    def _apply_moved(self) -> None:
        """``_commit_moved`` for every partition whose commit point settles may have moved.

        A run of in-order acks moves the commit point on every ack: the window and
        flow-control checks run once per run instead, before the next ``_take`` or
        on the next loop iteration, whichever comes first.
        """
        moved, self._moved = self._moved, []
        for part in moved:
            part.moved = False
            if not part.gone:
                self._commit_moved(part)

    def _commit_moved(self, part: _Part) -> None:
        """Bring parked records into the window; tell the thread when it may resume fetching."""
        commit = part.commit_point()
        limit = commit + WINDOW
        beyond = part.beyond
        if beyond:
            records = part.records
            while beyond and beyond[0].offset < limit:
                other = beyond.popleft()
                if records.get(other.offset) is other:
                    self._push(other, 0.0)
        parked = part.parked
        if parked:
            records = part.records
            while parked and parked[0][0] < limit:
                other = heapq.heappop(parked)[2]
                if records.get(other.offset) is other:
                    self._push(other, other.due)
        if part.span >= RESUME_SPAN and part.next_offset - commit < RESUME_SPAN:
            # fetching may be paused: tell the thread as soon as it may resume
            self._update_backlog(part)
            self._kick.set()

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
                self._update_backlog(part)
        if snaps:
            fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
            try:
                self._send(lambda c: self._commit(c, snaps, False), fut)
            except LeaseExpired:
                pass

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
        heapq.heappush(self._leases, (rec.deadline, next(self._seq), rec.token, rec.token + 1))

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
        if self._staging is not None:
            await asyncio.wait([self._staging], timeout=30.0)
        self._unstage()
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
