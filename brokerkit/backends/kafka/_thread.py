"""The consumer thread: the one thread that makes every call on a receiver's Consumer.

It runs ``consume`` in a loop and, between calls, the commands the event loop sends
(count commits, ack flushes); it holds off or pauses fetching from the backlog the loop
publishes (``FlowControl``), and answers rebalances (``on_assign`` reads the committed offset and
metadata, ``on_revoke`` waits for the loop to give the partition up and commits its
final state). What it consumes and learns it posts to the loop through a ``Sink``.

After a command the thread stays *hot* for ``_HOT_SPELL``: non-blocking ``consume`` plus
a wait on ``kick`` that every new command sets, so the next command starts at once. A
count commit sent to a hot thread also hands it the GIL: the loop waits (at most
``_HAND_OVER_WAIT``) until the thread has started it, because a busy event loop
otherwise keeps the GIL for up to a switch interval (5 ms) before the thread runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Protocol

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition

from brokerkit.backends import BrokerUnavailable, ErrorMap, LeaseExpired, retry_unavailable_blocking
from brokerkit.backends.kafka._errors import is_transient
from brokerkit.backends.kafka._flow import FlowControl
from brokerkit.backends.kafka._options import hosts_from_servers
from brokerkit.backends.kafka._partition import Key, Snapshot

__all__ = ["REVOKE_WAIT", "Assigned", "ConsumerThread", "Sink"]

LOG = logging.getLogger(__name__)

REVOKE_WAIT = 120.0
"""Longest a rebalance waits for handed-out records of a revoked partition to settle."""
_CONSUME_TIMEOUT = 0.02
"""consume() timeout of an idle consumer thread (the longest a first command waits)."""
_HOT_SPELL = 0.25
"""After a command, the thread stays hot this long: non-blocking consume + a kickable wait."""
_HOT_WAIT = 0.002
_HAND_OVER_WAIT = 0.001
"""Longest the loop waits for a hot consumer thread to start a count commit (``call``)."""
_HOLD_WAIT = 0.005
"""Longest a held consumer thread waits for a kick before looking at the backlog again."""
_BATCH = 500

Assigned = tuple[Key, int, int, str | None]
"""An assigned partition: key, committed offset, first offset to read, commit metadata."""
_Command = tuple[Callable[[Consumer], Any], concurrent.futures.Future[Any]]


class Sink(Protocol):
    """What the thread tells the event loop (each called on the loop's thread)."""

    def records(self, msgs: list[Any]) -> None:
        """Consumed records (confluent-kafka ``Message``s without an error)."""

    def assigned(self, parts: list[Assigned]) -> None:
        """Partitions this member owns from now on."""

    def revoke(self, keys: list[Key]) -> Coroutine[Any, Any, list[Snapshot]]:
        """Give the partitions up: returns their final state once nothing is out."""

    def revoked(self, keys: list[Key], committed: set[Key]) -> None:
        """The final commit of a revoke is over: ``committed`` are the keys it recorded."""

    def lost(self, keys: list[Key]) -> None:
        """The partitions were taken away (no final commit)."""


class ConsumerThread:
    """One Consumer of ``topic`` in its own thread; see the module docstring."""

    def __init__(
        self,
        config: dict[str, Any],
        topic: str,
        *,
        name: str,
        dedup_window: float | None,
        loop: asyncio.AbstractEventLoop,
        sink: Sink,
        errors: ErrorMap,
    ) -> None:
        self._config = config
        self._hosts = hosts_from_servers(str(config.get("bootstrap.servers", "")))
        """For the errors of the rebalance callback's retried reads."""
        self._topic = topic
        self._dedup_window = dedup_window
        """Start reading this long before the commit point (rebuilds the dedup memory)."""
        self._loop = loop
        self._sink = sink
        self._errors = errors
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._commands_closed = False
        self._commands_lock = threading.Lock()
        self._picked = threading.Event()
        """Set by the thread when it starts a command (GIL hand-over, ``call``)."""
        self.kick = threading.Event()
        """Set with every command: wakes the thread when it is hot."""
        self._hot_until = 0.0
        """Monotonic time until which the thread polls without blocking (commands expected)."""
        self._stop = threading.Event()
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.finished: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._assigned: set[Key] = set()  # thread-side
        self._flow = FlowControl()
        self.backlog = self._flow.backlog
        """(offsets, bytes) held above each partition's commit point: written by the loop."""
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # -- the loop's side ----------------------------------------------------------------------

    async def start(self) -> None:
        self._thread.start()
        await asyncio.wrap_future(self._started)

    def stop(self) -> None:
        self._stop.set()

    async def call(self, fn: Callable[[Consumer], Any]) -> Any:
        """Run ``fn(consumer)`` on the thread; LeaseExpired once the consumer is closed."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        hot = time.monotonic() < self._hot_until
        self._picked.clear()
        self.send(fn, fut)
        if hot:
            # hand the GIL over (see the module docstring): blocks the loop until the
            # thread has picked the command up, typically well under 0.1 ms
            self._picked.wait(_HAND_OVER_WAIT)
        return await asyncio.wrap_future(fut)

    def send(self, fn: Callable[[Consumer], Any], fut: concurrent.futures.Future[Any]) -> None:
        with self._commands_lock:
            if self._commands_closed:
                raise LeaseExpired("the consumer is closed")
            self._commands.put((fn, fut))
        self._hot_until = time.monotonic() + _HOT_SPELL
        self.kick.set()

    async def commit(self, snaps: Sequence[Snapshot]) -> set[Key]:
        """Commit synchronously; the keys committed (empty once the consumer is closed)."""
        try:
            keys: set[Key] = await self.call(lambda c: self.commit_on_thread(c, snaps, True))
        except LeaseExpired:
            return set()
        return keys

    def commit_soon(self, snaps: Sequence[Snapshot]) -> None:
        """An asynchronous commit (the ack flush); nothing once the consumer is closed."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            self.send(lambda c: self.commit_on_thread(c, snaps, False), fut)
        except LeaseExpired:
            pass

    # -- the thread ---------------------------------------------------------------------------

    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is gone: nobody will settle anything
            self._stop.set()

    def _run(self) -> None:
        try:
            with self._errors:
                consumer = Consumer(self._config)
                consumer.subscribe(
                    [self._topic],
                    on_assign=self._on_assign,
                    on_revoke=self._on_revoke,
                    on_lost=self._on_lost,
                )
        except Exception as exc:
            self._started.set_exception(exc)
            self.finished.set_result(None)
            return
        self._started.set_result(None)
        flow = self._flow
        try:
            while not self._stop.is_set():
                self._run_commands(consumer)
                if flow.hold(consumer, self._assigned, time.monotonic()):
                    self.kick.wait(_HOLD_WAIT)  # the loop kicks as its backlog shrinks
                    self.kick.clear()
                    continue
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
                    self._post(self._sink.records, good)
                elif hot:
                    self.kick.wait(_HOT_WAIT)
                    self.kick.clear()
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
            self.finished.set_result(None)

    def run_commands(self, consumer: Consumer) -> None:
        """Run the commands sent so far (the thread does, between ``consume`` calls)."""
        self._run_commands(consumer)

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

    def commit_on_thread(
        self, consumer: Consumer, snaps: Sequence[Snapshot], sync: bool
    ) -> set[Key]:
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
            committed = self._metadata(lambda: consumer.committed(asked, timeout=10))
        except (KafkaException, BrokerUnavailable) as exc:
            LOG.warning("kafka committed() failed: %s (%r)", exc, exc.__cause__)
            committed = [TopicPartition(tp.topic, tp.partition, OFFSET_INVALID) for tp in asked]
        times: dict[Key, int] = {}
        if self._dedup_window is not None:
            since = int(time.time() * 1000) - int(self._dedup_window * 1000) - 1000
            at = [TopicPartition(tp.topic, tp.partition, since) for tp in asked]
            try:
                found = self._metadata(lambda: consumer.offsets_for_times(at, timeout=10))
                times = {(tp.topic, tp.partition): tp.offset for tp in found}
            except (KafkaException, BrokerUnavailable) as exc:
                # the dedup memory of these partitions starts at the commit point
                LOG.warning("kafka offsets_for_times failed: %s (%r)", exc, exc.__cause__)
        infos: list[Assigned] = []
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
        self._post(self._sink.assigned, infos)
        consumer.incremental_assign(starts)

    def _metadata(self, read: Callable[[], list[TopicPartition]]) -> list[TopicPartition]:
        """A read in a rebalance callback, transient errors retried by the core's bounded
        policy (a new topic's partition whose leader is still being elected answers
        NOT_LEADER_FOR_PARTITION for a moment); BrokerUnavailable after it."""
        return retry_unavailable_blocking(
            read, what="Kafka", hosts=self._hosts, is_transient=is_transient, deadline=10.0
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Wait for handed-out records to settle (bounded), then commit the final state."""
        keys = [(tp.topic, tp.partition) for tp in partitions]
        snaps: list[Snapshot] = []
        try:
            fut = asyncio.run_coroutine_threadsafe(self._sink.revoke(keys), self._loop)
            snaps = fut.result(REVOKE_WAIT + 10.0)
        except Exception as exc:
            LOG.warning("kafka revoke: could not collect the partition state: %s", exc)
        committed = self.commit_on_thread(consumer, snaps, True)
        self._assigned.difference_update(keys)
        self._post(self._sink.revoked, keys, committed)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self._assigned.difference_update(keys)
        self._post(self._sink.lost, keys)
