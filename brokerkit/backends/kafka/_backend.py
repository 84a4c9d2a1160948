"""KafkaBackend: the connection, topics, and publishing (the sync Producer + a poll thread).

* publish -> ``Producer.produce(topic, body, key, headers, on_delivery=...)`` with
  ``acks=all`` and ``enable.idempotence=true``; ``linger.ms`` from ``?linger=`` (2 ms);
  plain records (no fifo_group, dedup id or headers) go in ``produce_batch`` calls
  (``_produce.produce_plain``, ``PartitionTurn``); a call of 64+ records made alone ends
  with ``flush(0.001)``; returns once every report arrived. The record key is the
  fifo_group (else the dedup id, else none), so a group, and every copy of a dedup id,
  lives in one partition. A DLQ ref publishes to the DLQ topic (the seam's
  copy-then-settle ``dead_letter`` goes through here).
* queue -> topic ``<prefix>.<queue>`` (``?partitions=``) plus DLQ topic
  ``<prefix>-dlq.<queue>`` (one partition: total death order), created with the
  AdminClient on first use or by ``declare`` (TOPIC_ALREADY_EXISTS is success) and
  awaited in the metadata before use.
* subscribe -> a ``KafkaReceiver`` (one Consumer in its own thread) in Kafka group
  ``<prefix>.<queue>.<group>`` (``<prefix>-dlq.<queue>.<group>`` for the DLQ).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from brokerkit.backends import (
    DEDUP_ID_HEADER,
    FIFO_GROUP_HEADER,
    Backend,
    BrokerUnavailable,
    BrokerURL,
    Capabilities,
    ConfigError,
    Delivery,
    HostPort,
    Outgoing,
    PublishResult,
    QueueRef,
    QueueStats,
    ReceiverSettings,
    ResourceClosed,
    retry_unavailable,
)
from brokerkit.backends.kafka._errors import is_transient
from brokerkit.backends.kafka._inspect import browse_topic, stats_topic
from brokerkit.backends.kafka._link import KafkaLink
from brokerkit.backends.kafka._options import (
    KafkaOptions,
    bootstrap_hosts,
    client_config,
    hosts_from_servers,
    options_from_url,
)
from brokerkit.backends.kafka._produce import (
    Batch,
    Headers,
    PartitionTurn,
    plain_bodies,
    produce,
    produce_plain,
)
from brokerkit.backends.kafka._receiver import KafkaReceiver
from brokerkit.backends.kafka._sender import Sender

__all__ = ["KafkaBackend"]

MAX_BODY = 900 * 1024
"""Largest body: librdkafka's ``message.max.bytes`` (1 MB) minus headers, key and framing."""

_TOPIC_READY_TIMEOUT = 15.0
_REBALANCE = 1.0
"""Seconds a rebalance takes after a crashed member's session timed out (measured: up to
~1.3 s on the loaded 2-core test box, less the time the member held the message)."""
_POLL_EVERY = 64
"""``publish`` serves ready delivery reports on its own thread every this many records."""
_FLUSH_MIN = 64
_FLUSH_WAIT = 0.001
"""A ``publish`` of at least ``_FLUSH_MIN`` records is followed by ``flush(_FLUSH_WAIT)``
(at the end of the loop turn) when no other publish was in flight (see ``publish``)."""
_LOOP_POLL = 0.0005
"""How often the loop serves reports itself while it does (see ``_loop_poll``)."""
_LOOP_POLL_STALE = 0.02
"""The poll thread steps aside only while the loop served reports this recently."""

T = TypeVar("T")


class KafkaBackend(Backend):
    """``kafka://host1:9092,host2:9092?partitions=6&dedup_window=300``.

    See ``docs/backends/kafka.md`` for how every verb maps to Kafka.
    """

    schemes = ("kafka",)

    def __init__(
        self, conf: Mapping[str, Any], options: KafkaOptions, hosts: Sequence[HostPort]
    ) -> None:
        self.link = KafkaLink(conf, options, hosts)
        self.options = options
        self.hosts = self.link.hosts
        self.capabilities = Capabilities(
            max_message_bytes=MAX_BODY,
            dedup_window=options.dedup_window,
            dedup_window_configurable=True,
            fan_out=True,
            # a crashed member's partitions move only when the group's session times out,
            # then a rebalance hands them over (join, sync, the new owner's reads)
            redelivery_slack=options.session_timeout + _REBALANCE,
            ack_flush_interval=0.1,
            browse=True,
            extras={"partitions": options.partitions, "topic_prefix": options.topic_prefix},
        )
        self._admin: AdminClient | None = None
        self._producer: Producer | None = None
        self._awaiting = 0
        """``publish`` calls waiting for their delivery reports (records in flight)."""
        self._flush_soon = False
        """A ``_flush_now`` is scheduled (see ``publish``)."""
        self._poller: threading.Thread | None = None
        self._stop = threading.Event()
        self._sender: Sender | None = None
        self._loop_timer: asyncio.TimerHandle | None = None
        """Armed while the loop serves delivery reports itself (``_loop_poll``)."""
        self._loop_polled = 0.0
        self._topics: dict[str, asyncio.Future[dict[str, int]]] = {}
        """Per queue: its topics made and ready, with their partition counts."""
        self._turns: dict[str, PartitionTurn] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"<KafkaBackend {', '.join(str(h) for h in self.hosts)}>"

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: BrokerURL) -> KafkaBackend:
        options = options_from_url(url)
        return cls(client_config(url, options), options, bootstrap_hosts(url))

    @classmethod
    def from_client(cls, conf: Mapping[str, Any], **options: Any) -> KafkaBackend:
        """A backend from the user's own librdkafka settings (``bootstrap.servers``, SASL, TLS...).

        ``options`` are the URL query options as keywords (``partitions=12``).
        Use it with ``brokerkit.from_backend(KafkaBackend.from_client({...}))``.
        """
        servers = conf.get("bootstrap.servers")
        if not isinstance(servers, str) or not servers:
            raise ConfigError("KafkaBackend.from_client needs 'bootstrap.servers'")
        for setting, option in (("linger.ms", "linger"), ("message.timeout.ms", "publish_timeout")):
            if setting in conf and option not in options:  # the user's own setting holds
                try:
                    options[option] = float(conf[setting]) / 1000.0
                except (TypeError, ValueError) as exc:
                    raise ConfigError(
                        f"KafkaBackend.from_client: {setting!r} must be a number"
                    ) from exc
        try:
            parsed = KafkaOptions.model_validate(options)
        except Exception as exc:
            names = ", ".join(sorted(KafkaOptions.model_fields))
            raise ConfigError(f"KafkaBackend.from_client: bad options (known: {names})") from exc
        return cls(conf, parsed, hosts_from_servers(servers))

    def producer_config(self) -> dict[str, Any]:
        """The librdkafka settings of this connection's producer."""
        return self.link.producer_config()

    # -- topics ---------------------------------------------------------------------------------

    async def declare(self, queue: QueueRef, group: str | None = None) -> None:
        """Create the queue's topic and DLQ topic once (per connection), concurrency-safe.

        A Kafka consumer group exists once a member joined it; a new group starts at the
        oldest retained record either way, so ``group`` needs nothing here.
        """
        name = queue.name
        fut = self._topics.get(name)
        if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None)):
            fut = asyncio.ensure_future(asyncio.to_thread(self._create_topics, name))
            self._topics[name] = fut
        await asyncio.shield(fut)

    def _create_topics(self, queue: str) -> dict[str, int]:
        """Make the queue's topics (if need be); their partition counts once ready."""
        admin = self._live_admin()
        opts, link = self.options, self.link
        ref = QueueRef(queue)
        wanted = {link.topic(ref): opts.partitions, link.topic(ref.dlq): 1}
        with link.errors:
            futures = admin.create_topics(
                [NewTopic(t, n, opts.replication_factor) for t, n in wanted.items()],
                operation_timeout=10,
                request_timeout=15,
            )
            _results(futures.values(), KafkaError.TOPIC_ALREADY_EXISTS)
            deadline = time.monotonic() + _TOPIC_READY_TIMEOUT
            counts = {}
            for name in wanted:
                while not (count := self._topic_partitions(admin, name)):
                    if time.monotonic() > deadline:
                        raise self._unavailable(f"kafka: topic {name!r} is not in the metadata")
                    time.sleep(0.05)
                counts[name] = count
        return counts

    async def delete_queue(self, queue: str) -> None:
        """``delete_topics`` of the queue's topic and DLQ topic, awaited until the metadata
        no longer lists them (so a new first use creates them anew); then
        ``delete_consumer_groups`` of the queue's groups that have no members left."""
        self._topics.pop(queue, None)
        await asyncio.to_thread(self._delete_topics, queue)

    def _delete_topics(self, queue: str) -> None:
        admin = self._live_admin()
        ref = QueueRef(queue)
        names = [self.link.topic(ref), self.link.topic(ref.dlq)]
        with self.link.errors:
            deleted = admin.delete_topics(names, operation_timeout=10, request_timeout=15)
            _results(deleted.values(), KafkaError.UNKNOWN_TOPIC_OR_PART)
            deadline = time.monotonic() + _TOPIC_READY_TIMEOUT
            while any(name in admin.list_topics(timeout=5).topics for name in names):
                if time.monotonic() > deadline:
                    raise self._unavailable(
                        f"kafka: topics {names} are still listed after deletion"
                    )
                time.sleep(0.05)
            prefixes = tuple(f"{name}." for name in names)
            listing = admin.list_consumer_groups(request_timeout=15).result()
            groups = [g.group_id for g in listing.valid if g.group_id.startswith(prefixes)]
            if groups:
                _results(
                    admin.delete_consumer_groups(groups, request_timeout=15).values(),
                    KafkaError.GROUP_ID_NOT_FOUND,
                    KafkaError.NON_EMPTY_GROUP,  # a member elsewhere; its offsets went anyway
                )

    def _unavailable(self, text: str) -> BrokerUnavailable:
        """The broker answered but did not get there in time."""
        first = self.hosts[0] if self.hosts else HostPort("localhost", 9092)
        return BrokerUnavailable(text, host=first.host, port=first.port)

    @staticmethod
    def _topic_partitions(admin: AdminClient, name: str) -> int:
        """The topic's partition count once every partition has a leader, else 0."""
        meta = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if meta is None or meta.error is not None or not meta.partitions:
            return 0
        ready = all(p.leader >= 0 and p.error is None for p in meta.partitions.values())
        return len(meta.partitions) if ready else 0

    # -- operations ---------------------------------------------------------------------------

    async def browse(self, queue: QueueRef, limit: int) -> list[Delivery[None]]:
        """A group-less consumer ``assign()``s the partitions at the lowest committed offset
        of the queue's groups and reads to the high watermark, skipping what every group
        settled; merged by (timestamp, partition, offset). See ``_inspect``."""
        window = None if queue.dead_letters else self.options.dedup_window
        topic = self.link.topic(queue)
        admin = self._live_admin()
        return await self._inspect(browse_topic, self.link, admin, topic, limit, window)

    async def stats(self, queue: QueueRef, group: str | None) -> QueueStats:
        """Watermarks and the group's committed offset and metadata; the oldest age from
        the first unsettled record's timestamp. See ``_inspect``."""
        link, admin = self.link, self._live_admin()
        topic = link.topic(queue)
        group_id = link.group_id(queue, group) if group is not None else None
        figures = await self._inspect(stats_topic, link, admin, topic, group_id)
        oldest = await self.browse(queue, 1)
        if not oldest:
            return figures
        age = max(0.0, time.time() - oldest[0].extras["timestamp"] / 1000)
        return dataclasses.replace(figures, oldest_age=age)

    async def _inspect(self, read: Callable[..., T], *args: Any) -> T:
        """``read(*args)`` in a thread, retried (bounded) while the broker answers with a
        transient error: a topic created a moment ago may have no partition leader yet
        (NOT_LEADER_FOR_PARTITION from the watermarks)."""

        async def once() -> T:
            return await asyncio.to_thread(read, *args)

        return await retry_unavailable(
            once, what="Kafka", hosts=self.hosts, is_transient=_transient_or_caused_by_one
        )

    # -- lifecycle ----------------------------------------------------------------------------

    def _live_admin(self) -> AdminClient:
        if self._admin is None:
            raise ResourceClosed("kafka backend is not open")
        return self._admin

    def _live_producer(self) -> Producer:
        if self._producer is None:
            raise ResourceClosed("kafka backend is not open")
        return self._producer

    async def open(self) -> None:
        """AdminClient.list_topics with a bounded retry; then the producer and its poll thread."""
        link = self.link
        with link.errors:
            admin = AdminClient(link.admin_config())

        async def probe() -> None:
            await asyncio.to_thread(admin.list_topics, timeout=2.0)

        await retry_unavailable(
            probe, what="Kafka", hosts=self.hosts, is_transient=is_transient, deadline=10.0
        )
        with link.errors:
            self._producer = Producer(link.producer_config())
        self._sender = Sender(self._producer)
        self._sender.start()
        self._admin = admin
        self._poller = threading.Thread(
            target=self._poll_loop, name="brokerkit-kafka-producer", daemon=True
        )
        self._poller.start()

    def _poll_loop(self) -> None:
        """Serve delivery reports, except while the loop serves them itself: each report
        served here wants the GIL, and with the loop busy producing for concurrent
        callers every hand-over cost both threads (``_loop_poll``)."""
        producer = self._live_producer()
        while not self._stop.is_set():
            if (
                self._loop_timer is not None
                and time.monotonic() - self._loop_polled < _LOOP_POLL_STALE
            ):
                self._stop.wait(0.001)
                continue
            producer.poll(0.01)

    def _loop_poll(self) -> None:
        """Started by a flushed call or a second call in flight, until no call awaits: the
        loop serves reports every ``_LOOP_POLL`` and the poll thread steps aside (4
        concurrent ``publish_many``: 1.15x). Waiting in ``poll``, that thread took the
        reports a flush waited for, which then waited out its 1 ms (docs/backends/kafka.md).
        A lone small call keeps the poll thread, which serves its report at once (a timer
        would add up to a millisecond). After ``_LOOP_POLL_STALE`` (a blocked loop) the
        thread serves again."""
        producer = self._producer
        if producer is None or not self._awaiting:
            self._loop_timer = None
            return
        self._loop_polled = time.monotonic()
        producer.poll(0)
        self._loop_timer = asyncio.get_running_loop().call_later(_LOOP_POLL, self._loop_poll)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for receiver in list(self.link.receivers):
            await receiver.aclose()
        producer = self._producer
        if producer is not None:
            await asyncio.to_thread(producer.flush, 10.0)
        self._stop.set()
        if self._sender is not None:
            await self._sender.stop()
        if self._loop_timer is not None:
            self._loop_timer.cancel()
            self._loop_timer = None
        if self._poller is not None:
            await asyncio.to_thread(self._poller.join, 5.0)

    # -- publishing ---------------------------------------------------------------------------

    async def publish(self, queue: QueueRef, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """``produce_batch`` for plain records, else ``produce`` per message; one future
        for the call (``Batch``). The loop serves ready reports itself (``poll(0)`` every
        ``_POLL_EVERY`` records and after the last): on this thread they need no GIL
        hand-over; the poll thread gets the GIL once per switch interval (5 ms)."""
        if not self._topic_known(queue.name):
            await self.declare(queue)
        topic = self.link.topic(queue)
        errors = self.link.errors
        batch = Batch(asyncio.get_running_loop(), len(messages), errors)
        producer = self._live_producer()
        produced = 0
        produce_now, poll = producer.produce, producer.poll
        report = batch.report
        indexes: Iterable[int] = range(len(messages))
        try:
            bodies = plain_bodies(messages)
            if bodies is not None:
                turns = self._turns.get(topic) or self._turns.setdefault(topic, PartitionTurn())
                turn = functools.partial(turns.next, self._partition_count(queue, topic))
                try:
                    with errors:
                        indexes, stale = produce_plain(producer, topic, turn, bodies, batch)
                finally:
                    produced = batch.run_taken
                if stale:  # fewer partitions than when it was declared: read them again
                    self._topics.pop(queue.name, None)
            for index in indexes:
                msg = messages[index]
                record_headers: Headers | None = None
                if msg.headers:
                    record_headers = [(k, v.encode()) for k, v in msg.headers.items()]
                group, dedup = msg.fifo_group, msg.dedup_id
                key: bytes | None = None
                if group is not None or dedup is not None:
                    record_headers = record_headers or []
                    if group is not None:
                        record_headers.append((FIFO_GROUP_HEADER, group.encode()))
                    if dedup is not None:
                        record_headers.append((DEDUP_ID_HEADER, dedup.encode()))
                    key = (group if group is not None else str(dedup)).encode()
                on_delivery = functools.partial(report, index)
                try:  # the common case inline; a full queue or an error goes the slow way
                    produce_now(
                        topic, msg.body, key, headers=record_headers, on_delivery=on_delivery
                    )
                except (BufferError, KafkaException):
                    await produce(
                        producer, topic, msg.body, key, record_headers, on_delivery, errors
                    )
                produced += 1
                if not produced % _POLL_EVERY:
                    poll(0)
        finally:
            if produced < len(messages):
                batch.shrink(produced)
        flushed = produced >= _FLUSH_MIN and not self._awaiting
        if flushed:
            # Send now (no linger) and serve the reports here, once the publishes the
            # loop runs in this turn have produced too: one flush for all of them (the
            # coalescer sends up to four batches in one turn).
            if not self._flush_soon:
                self._flush_soon = True
                asyncio.get_running_loop().call_soon(self._flush_now)
        else:
            # Others in flight: flush would block this loop for their records too (4
            # callers spent ~40 % of their time there); ours go within ``linger`` at
            # worst. Alone, a small call has the sender thread flush (``_sender``).
            poll(0)
            if not self._awaiting and self._sender is not None:
                self._sender.send_now(batch.future.done)
        self._awaiting += 1
        if self._loop_timer is None and (flushed or self._awaiting >= 2):
            self._loop_poll()
        try:
            await batch.future
        finally:
            self._awaiting -= 1
        return batch.results()

    def _flush_now(self) -> None:
        self._flush_soon = False
        if self._producer is not None:
            self._producer.flush(_FLUSH_WAIT)

    def _partition_count(self, queue: QueueRef, topic: str) -> int:
        """How many partitions ``topic`` has (1 if that is not known now)."""
        known = self._topic_known(queue.name)
        return self._topics[queue.name].result().get(topic, 1) if known else 1

    def _topic_known(self, queue: str) -> bool:
        fut = self._topics.get(queue)
        return fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None

    # -- consuming ----------------------------------------------------------------------------

    async def subscribe(
        self, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> KafkaReceiver:
        await self.declare(queue)
        receiver = KafkaReceiver(self.link, queue, group, settings)
        await receiver.start()
        self.link.receivers.add(receiver)
        return receiver


def _results(futures: Iterable[concurrent.futures.Future[Any]], *fine: int) -> None:
    """Wait for admin futures; a ``KafkaException`` whose code is in ``fine`` is success."""
    for fut in futures:
        try:
            fut.result()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.code() in fine):
                raise


def _transient_or_caused_by_one(exc: BaseException) -> bool:
    """``is_transient``, also for a driver error the error map already translated."""
    return is_transient(exc) or (exc.__cause__ is not None and is_transient(exc.__cause__))
