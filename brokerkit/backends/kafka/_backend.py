"""KafkaBackend: the connection, topics, and publishing (the sync Producer + a poll thread).

* publish -> ``Producer.produce(topic, body, key, headers, on_delivery=...)`` with
  ``acks=all`` and ``enable.idempotence=true``; ``linger.ms`` from ``?linger=`` (2 ms);
  a call of 64+ records ends with ``flush(0.001)`` (sent without waiting out the
  linger); returns once every delivery report arrived. The record key is the
  fifo_group (else the dedup id, else none), so a group, and every copy of a dedup
  id, lives in one partition.
* queue -> topic ``<prefix>.<queue>`` (``?partitions=``) plus DLQ topic
  ``<prefix>-dlq.<queue>`` (one partition: total death order), created with the
  AdminClient on first use (TOPIC_ALREADY_EXISTS is success) and awaited in the
  metadata before use.
* subscribe -> a ``_Receiver`` (one Consumer in its own thread) in Kafka group
  ``<prefix>.<queue>.<group>`` (``<prefix>-dlq.<queue>.<group>`` for the DLQ).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from brokerkit._errors import BrokerkitError, ConfigError
from brokerkit._message import Outgoing, PublishResult, publish_results
from brokerkit._retry import retry_unavailable
from brokerkit._url import BrokerURL, HostPort
from brokerkit.backends.base import Backend, Capabilities, Receiver, ReceiverSettings
from brokerkit.backends.kafka._errors import is_transient, map_error
from brokerkit.backends.kafka._options import (
    LOG,
    KafkaOptions,
    bootstrap_hosts,
    client_config,
    hosts_from_servers,
    options_from_url,
)

__all__ = ["DEDUP_HEADER", "GROUP_HEADER", "KafkaBackend"]

GROUP_HEADER = "x-brokerkit-fifo-group"
DEDUP_HEADER = "x-brokerkit-dedup-id"

MAX_BODY = 900 * 1024
"""Largest body: librdkafka's ``message.max.bytes`` (1 MB) minus headers, key and framing."""

_TOPIC_READY_TIMEOUT = 15.0
_POLL_EVERY = 64
"""``publish`` serves ready delivery reports on its own thread every this many records."""
_FLUSH_MIN = 64
_FLUSH_WAIT = 0.001
"""A ``publish`` of at least ``_FLUSH_MIN`` records ends with ``flush(_FLUSH_WAIT)``."""


def _on_error(err: KafkaError) -> None:
    LOG.debug("kafka client error: %s", err)


class KafkaBackend(Backend):
    """``kafka://host1:9092,host2:9092?partitions=6&dedup_window=300``.

    See ``docs/backends/kafka.md`` for how every verb maps to Kafka.
    """

    schemes = ("kafka",)

    def __init__(
        self, conf: Mapping[str, Any], options: KafkaOptions, hosts: Sequence[HostPort]
    ) -> None:
        self.options = options
        self.hosts = tuple(hosts)
        self._conf = dict(conf)
        self._conf.setdefault("logger", LOG)
        self._conf.setdefault("error_cb", _on_error)
        self.capabilities = Capabilities(
            max_message_bytes=MAX_BODY,
            dedup_window=options.dedup_window,
            dedup_window_configurable=True,
            fan_out=True,
            redelivery_slack=2.5,
            ack_flush_interval=0.1,
            extras={"partitions": options.partitions, "topic_prefix": options.topic_prefix},
        )
        self._admin: AdminClient | None = None
        self._producer: Producer | None = None
        self._poller: threading.Thread | None = None
        self._stop = threading.Event()
        self._topics: dict[str, asyncio.Future[None]] = {}
        self._receivers: set[Receiver] = set()
        self._closed = False

    def __repr__(self) -> str:
        return f"<KafkaBackend {', '.join(str(h) for h in self.hosts)}>"

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: BrokerURL) -> KafkaBackend:
        options = options_from_url(url)
        return cls(client_config(url, options), options, bootstrap_hosts(url))

    @classmethod
    def from_config(cls, conf: Mapping[str, Any], **options: Any) -> KafkaBackend:
        """A backend from the user's own librdkafka settings (``bootstrap.servers``, SASL, TLS...).

        ``options`` are the URL query options as keywords (``partitions=12``).
        Use it with ``brokerkit.from_backend(KafkaBackend.from_config({...}))``.
        """
        servers = conf.get("bootstrap.servers")
        if not isinstance(servers, str) or not servers:
            raise ConfigError("KafkaBackend.from_config needs 'bootstrap.servers'")
        if "linger.ms" in conf and "linger" not in options:  # the user's own setting holds
            try:
                options["linger"] = float(conf["linger.ms"]) / 1000.0
            except (TypeError, ValueError) as exc:
                raise ConfigError("KafkaBackend.from_config: 'linger.ms' must be a number") from exc
        try:
            parsed = KafkaOptions.model_validate(options)
        except Exception as exc:
            names = ", ".join(sorted(KafkaOptions.model_fields))
            raise ConfigError(f"KafkaBackend.from_config: bad options (known: {names})") from exc
        return cls(conf, parsed, hosts_from_servers(servers))

    # -- topics and groups --------------------------------------------------------------------

    def topic(self, queue: str, *, dead_letters: bool = False) -> str:
        prefix = self.options.topic_prefix
        return f"{prefix}-dlq.{queue}" if dead_letters else f"{prefix}.{queue}"

    def group_id(self, queue: str, group: str, *, dead_letters: bool = False) -> str:
        return f"{self.topic(queue, dead_letters=dead_letters)}.{group}"

    def consumer_config(self, group_id: str) -> dict[str, Any]:
        conf = {k: v for k, v in self._conf.items() if k != "error_cb"}
        conf.update(
            {
                "group.id": group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "partition.assignment.strategy": "cooperative-sticky",
                "session.timeout.ms": int(self.options.session_timeout * 1000),
                "heartbeat.interval.ms": int(self.options.heartbeat_interval * 1000),
                "fetch.wait.max.ms": 100,
                "enable.partition.eof": False,
                "error_cb": _on_error,
            }
        )
        return conf

    def producer_config(self) -> dict[str, Any]:
        """The client settings plus what the contract needs of the producer (durable,
        ordered, one partitioner for every brokerkit client) and the ``linger`` option."""
        conf = dict(self._conf)
        conf.update(
            {
                "acks": "all",
                "enable.idempotence": True,
                "partitioner": "murmur2_random",
                "linger.ms": self.options.linger * 1000.0,
                "message.max.bytes": 1_000_000,
            }
        )
        return conf

    async def ensure_queue(self, queue: str) -> None:
        """Create the queue's topic and DLQ topic once (per connection), concurrency-safe."""
        fut = self._topics.get(queue)
        if fut is None or (fut.done() and (fut.cancelled() or fut.exception() is not None)):
            fut = asyncio.ensure_future(asyncio.to_thread(self._create_topics, queue))
            self._topics[queue] = fut
        await asyncio.shield(fut)

    def _create_topics(self, queue: str) -> None:
        admin = self._live_admin()
        opts = self.options
        wanted = {
            self.topic(queue): opts.partitions,
            self.topic(queue, dead_letters=True): 1,
        }
        try:
            futures = admin.create_topics(
                [NewTopic(t, n, opts.replication_factor) for t, n in wanted.items()],
                operation_timeout=10,
                request_timeout=15,
            )
            _results(futures.values(), KafkaError.TOPIC_ALREADY_EXISTS)
            deadline = time.monotonic() + _TOPIC_READY_TIMEOUT
            for name in wanted:
                while not self._topic_ready(admin, name):
                    if time.monotonic() > deadline:
                        raise BrokerkitError(f"kafka: topic {name!r} is not in the metadata")
                    time.sleep(0.05)
        except BrokerkitError:
            raise
        except Exception as exc:
            raise map_error(exc, self.hosts) from exc

    async def delete_queue(self, queue: str) -> None:
        """``delete_topics`` of the queue's topic and DLQ topic, awaited until the metadata
        no longer lists them (so a new first use creates them anew); then
        ``delete_consumer_groups`` of the queue's groups that have no members left."""
        self._topics.pop(queue, None)
        await asyncio.to_thread(self._delete_topics, queue)

    def _delete_topics(self, queue: str) -> None:
        admin = self._live_admin()
        names = [self.topic(queue), self.topic(queue, dead_letters=True)]
        try:
            deleted = admin.delete_topics(names, operation_timeout=10, request_timeout=15)
            _results(deleted.values(), KafkaError.UNKNOWN_TOPIC_OR_PART)
            deadline = time.monotonic() + _TOPIC_READY_TIMEOUT
            while any(name in admin.list_topics(timeout=5).topics for name in names):
                if time.monotonic() > deadline:
                    raise BrokerkitError(f"kafka: topics {names} are still listed after deletion")
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
        except BrokerkitError:
            raise
        except Exception as exc:
            raise map_error(exc, self.hosts) from exc

    @staticmethod
    def _topic_ready(admin: AdminClient, name: str) -> bool:
        meta = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if meta is None or meta.error is not None or not meta.partitions:
            return False
        return all(p.leader >= 0 and p.error is None for p in meta.partitions.values())

    # -- lifecycle ----------------------------------------------------------------------------

    def _live_admin(self) -> AdminClient:
        if self._admin is None:
            raise BrokerkitError("kafka backend is not open")
        return self._admin

    def _live_producer(self) -> Producer:
        if self._producer is None:
            raise BrokerkitError("kafka backend is not open")
        return self._producer

    async def open(self) -> None:
        """AdminClient.list_topics with a bounded retry; then the producer and its poll thread."""
        admin = AdminClient(dict(self._conf))

        async def probe() -> None:
            await asyncio.to_thread(admin.list_topics, timeout=2.0)

        await retry_unavailable(
            probe, what="Kafka", hosts=self.hosts, is_transient=is_transient, deadline=10.0
        )
        try:
            self._producer = Producer(self.producer_config())
        except KafkaException as exc:
            raise map_error(exc, self.hosts) from exc
        self._admin = admin
        self._poller = threading.Thread(
            target=self._poll_loop, name="brokerkit-kafka-producer", daemon=True
        )
        self._poller.start()

    def _poll_loop(self) -> None:
        producer = self._live_producer()
        while not self._stop.is_set():
            producer.poll(0.05)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for receiver in list(self._receivers):
            await receiver.aclose()
        producer = self._producer
        if producer is not None:
            await asyncio.to_thread(producer.flush, 10.0)
        self._stop.set()
        if self._poller is not None:
            await asyncio.to_thread(self._poller.join, 5.0)

    # -- publishing ---------------------------------------------------------------------------

    async def publish(self, queue: str, messages: Sequence[Outgoing]) -> list[PublishResult]:
        """One ``produce`` per message, one future for the whole batch (see ``_Batch``).

        The loop also serves ready delivery reports itself (``poll(0)`` every
        ``_POLL_EVERY`` records and after the last): run on this thread they need
        no GIL hand-over, whereas the poll thread, wanting the GIL for each report
        while this loop runs, would get it only once per switch interval (5 ms).
        """
        if not self._topic_known(queue):
            await self.ensure_queue(queue)
        topic = self.topic(queue)
        batch = _Batch(asyncio.get_running_loop(), len(messages), self.hosts)
        producer = self._live_producer()
        produced = 0
        produce, poll = producer.produce, producer.poll
        report = batch.report
        try:
            for msg in messages:
                record_headers: list[tuple[str, str | bytes | None]] | None = None
                if msg.headers:
                    record_headers = [(k, v.encode()) for k, v in msg.headers.items()]
                group, dedup = msg.fifo_group, msg.dedup_id
                key: bytes | None = None
                if group is not None or dedup is not None:
                    record_headers = record_headers or []
                    if group is not None:
                        record_headers.append((GROUP_HEADER, group.encode()))
                    if dedup is not None:
                        record_headers.append((DEDUP_HEADER, dedup.encode()))
                    key = (group if group is not None else str(dedup)).encode()
                on_delivery = functools.partial(report, produced)
                try:  # the common case inline; a full queue or an error goes the slow way
                    produce(topic, msg.body, key, headers=record_headers, on_delivery=on_delivery)
                except (BufferError, KafkaException):
                    await self._produce(producer, topic, msg.body, key, record_headers, on_delivery)
                produced += 1
                if not produced % _POLL_EVERY:
                    poll(0)
        finally:
            if produced < len(messages):
                batch.shrink(produced)
        if produced >= _FLUSH_MIN:
            producer.flush(_FLUSH_WAIT)  # send now (no linger), serve reports here
        else:
            poll(0)
        await batch.future
        return batch.results()

    def _topic_known(self, queue: str) -> bool:
        fut = self._topics.get(queue)
        return fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None

    async def _produce(
        self,
        producer: Producer,
        topic: str,
        body: bytes,
        key: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None,
        on_delivery: Callable[[KafkaError | None, Any], None],
    ) -> None:
        """``Producer.produce``; waits (bounded) while librdkafka's queue is full."""
        try:
            producer.produce(topic, value=body, key=key, headers=headers, on_delivery=on_delivery)
            return
        except BufferError:
            pass
        except KafkaException as exc:
            raise map_error(exc, self.hosts) from exc
        deadline = time.monotonic() + 30.0
        while True:
            await asyncio.sleep(0.005)
            try:
                producer.produce(
                    topic, value=body, key=key, headers=headers, on_delivery=on_delivery
                )
                return
            except BufferError as exc:
                if time.monotonic() > deadline:
                    raise map_error(exc, self.hosts) from exc
            except KafkaException as exc:
                raise map_error(exc, self.hosts) from exc

    async def produce(
        self, topic: str, body: bytes, key: str | None, headers: Mapping[str, str]
    ) -> asyncio.Future[None]:
        """Hand one record to librdkafka; the future resolves with its delivery report."""
        batch = _Batch(asyncio.get_running_loop(), 1, self.hosts)
        record_headers: list[tuple[str, str | bytes | None]] = [
            (k, v.encode()) for k, v in headers.items()
        ]
        try:
            await self._produce(
                self._live_producer(),
                topic,
                body,
                key.encode() if key is not None else None,
                record_headers,
                functools.partial(batch.report, 0),
            )
        except BaseException:
            batch.shrink(0)
            raise
        return batch.future

    # -- consuming ----------------------------------------------------------------------------

    async def subscribe(
        self, queue: str, group: str, settings: ReceiverSettings, *, dead_letters: bool = False
    ) -> Receiver:
        from brokerkit.backends.kafka._receiver import KafkaReceiver

        await self.ensure_queue(queue)
        receiver = KafkaReceiver(
            self,
            queue,
            self.topic(queue, dead_letters=dead_letters),
            self.group_id(queue, group, dead_letters=dead_letters),
            settings,
        )
        await receiver.start()
        self._receivers.add(receiver)
        return receiver

    def forget(self, receiver: Receiver) -> None:
        self._receivers.discard(receiver)


class _Batch:
    """The delivery reports of one ``publish`` call, counted down where they are served.

    Reports are served by ``poll`` on the poll thread or on the event loop's
    thread (``publish`` polls too). Each stores its record's ``Message``; the
    last one completes the batch's future: at once when served on the loop's own
    thread, else with one ``call_soon_threadsafe`` per batch (not one future per
    record). The ids are built on the loop in ``results``.
    """

    __slots__ = (
        "_counted",
        "_error",
        "_hosts",
        "_last",
        "_loop",
        "_loop_thread",
        "future",
        "reports",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int, hosts: Sequence[HostPort]):
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the loop's thread
        self._hosts = hosts
        self._counted = itertools.count()
        """Each report (and each record ``shrink`` gives up on) takes one number;
        ``next`` is atomic, so exactly one taker gets the last number and wakes the loop."""
        self._last = size - 1
        self._error: KafkaError | None = None
        self.reports: list[Any] = [None] * size
        self.future: asyncio.Future[None] = loop.create_future()
        self.future.add_done_callback(_retrieve)
        if size == 0:
            self.future.set_result(None)

    def report(self, index: int, err: KafkaError | None, msg: Any) -> None:
        """librdkafka's delivery report (whichever thread called ``poll``)."""
        if err is None:
            self.reports[index] = msg
        elif self._error is None:
            self._error = err
        if next(self._counted) == self._last:
            self._wake()

    def shrink(self, produced: int) -> None:
        """Only ``produced`` records were handed over (a produce call failed)."""
        for _ in range(len(self.reports) - produced):
            if next(self._counted) == self._last:
                self._wake()

    def results(self) -> list[PublishResult]:
        """One ``PublishResult`` per record, id ``"<partition>-<offset>"`` (all reports in)."""
        return publish_results([f"{m.partition()}-{m.offset()}" for m in self.reports])

    def _wake(self) -> None:
        if threading.get_ident() == self._loop_thread:
            # served by a poll(0) of publish: no self-pipe write, no extra loop turn
            self._finish()
            return
        try:
            self._loop.call_soon_threadsafe(self._finish)
        except RuntimeError:  # the event loop is gone: nobody awaits this batch
            pass

    def _finish(self) -> None:
        if self.future.done():
            return
        if self._error is not None:
            self.future.set_exception(map_error(KafkaException(self._error), self._hosts))
        else:
            self.future.set_result(None)


def _results(futures: Iterable[concurrent.futures.Future[Any]], *fine: int) -> None:
    """Wait for admin futures; a ``KafkaException`` whose code is in ``fine`` is success."""
    for fut in futures:
        try:
            fut.result()
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (isinstance(err, KafkaError) and err.code() in fine):
                raise


def _retrieve(fut: asyncio.Future[None]) -> None:
    """Mark an abandoned batch's error as seen (the caller got the produce error instead)."""
    if not fut.cancelled():
        fut.exception()
