"""The facade: connect, publish, consume, dead letters and redrive."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterable
from types import TracebackType

from brokerkit._coalesce import PublishCoalescer
from brokerkit._consumer import Consumer, ConsumerLink
from brokerkit._dlq import split_envelope
from brokerkit._errors import InvalidArgument, ResourceClosed, UnsupportedFeature
from brokerkit._message import BrowsedMessage, Outgoing, PublishResult, QueueStats, outgoing
from brokerkit._redrive import redrive
from brokerkit._registry import backend_class
from brokerkit._url import BrokerURL
from brokerkit._validate import check_consumer_args, check_int, check_name, check_outgoing
from brokerkit.backends.base import Backend, Capabilities, QueueRef

DEFAULT_GROUP = "default"
DEAD_LETTER_GROUP = "dead-letters"
"""The consumer group of ``dead_letters()`` and ``redrive()``: they share one view of the DLQ."""


MIN_DEFAULT_IN_FLIGHT = 100
"""The default ``max_in_flight`` is ``max(prefetch, MIN_DEFAULT_IN_FLIGHT)``."""


def connect(url: str | BrokerURL) -> Broker:
    """A broker for ``url``; the scheme picks the backend. No I/O until first use.

    Use it as ``async with brokerkit.connect(url) as broker:``. Raises
    ConfigError for an unknown scheme or parameter (naming it, never the
    password).
    """
    parsed = BrokerURL.parse(url)
    backend = backend_class(parsed.scheme).from_url(parsed)
    return Broker(backend, parsed)


def from_backend(backend: Backend) -> Broker:
    """A broker around a backend built from the user's own configured client."""
    scheme = backend.schemes[0] if backend.schemes else "custom"
    return Broker(backend, BrokerURL(scheme))


class Broker:
    """A connection to one broker. Opens on ``async with`` (or on first use)."""

    def __init__(self, backend: Backend, url: BrokerURL) -> None:
        self._backend = backend
        self.url = url
        self._opened = False
        self._closed = False
        self._open_lock = asyncio.Lock()
        self._consumers: set[Consumer] = set()
        self._coalescers: dict[str, PublishCoalescer] = {}
        self._link = ConsumerLink(
            opened_backend=self._opened_backend,
            max_nack_delay=backend.capabilities.max_nack_delay,
            on_close=self._consumers.discard,
            where=url.redacted(),
        )

    def __repr__(self) -> str:
        return f"<Broker {self.url.redacted()}>"

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def capabilities(self) -> Capabilities:
        return self._backend.capabilities

    async def __aenter__(self) -> Broker:
        await self.open()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Connect; BrokerUnavailable after a bounded retry. Idempotent."""
        await self._opened_backend()

    async def _opened_backend(self) -> Backend:
        if self._closed:
            raise ResourceClosed(f"{self!r} is closed")
        if not self._opened:
            async with self._open_lock:
                if not self._opened:
                    await self._backend.open()
                    self._opened = True
        return self._backend

    async def aclose(self) -> None:
        """Close every consumer, then the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for consumer in list(self._consumers):
            await consumer.aclose()
        if self._opened:
            await self._backend.aclose()

    async def publish(
        self,
        queue: str,
        body: bytes,
        *,
        fifo_group: str | None = None,
        dedup_id: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> PublishResult:
        """Publish one message; return once the broker accepted it durably.

        Raises InvalidName, InvalidMessage or MessageTooLarge before any I/O. Concurrent
        calls for one queue are gathered into pipelined backend calls (each caller still
        gets its own result or error; see ``brokerkit._coalesce``), so a service may
        publish from thousands of tasks at once.
        """
        if headers is None or (not headers and type(headers) is dict):
            headers = {}  # a fresh one: the caller's empty dict may change while this pends
        message = outgoing(body, fifo_group, dedup_id, headers)
        coalescer = self._coalescers.get(queue)
        if coalescer is not None:  # made for this name once it was checked: a valid name
            caps = self._backend.capabilities
            checked = check_outgoing(
                message,
                max_bytes=caps.max_message_bytes,
                max_headers=caps.max_headers,
                max_header_bytes=caps.max_header_bytes,
            )
            if self._closed:
                raise ResourceClosed(f"{self!r} is closed")
            return await coalescer.publish(checked)
        (checked,) = self._checked(queue, (message,))
        backend = await self._opened_backend()
        coalescer = self._coalescers.setdefault(
            queue, PublishCoalescer(functools.partial(backend.publish, QueueRef(queue)))
        )
        return await coalescer.publish(checked)

    async def publish_many(self, queue: str, messages: Iterable[Outgoing]) -> list[PublishResult]:
        """Publish in list order (the FIFO order within a fifo_group); all validated first."""
        checked = self._checked(queue, messages)
        if not checked:
            return []
        backend = await self._opened_backend()
        return await backend.publish(QueueRef(queue), checked)

    def _checked(self, queue: str, messages: Iterable[Outgoing]) -> list[Outgoing]:
        """Validate a publish before any I/O; ResourceClosed on a closed broker."""
        check_name("queue", queue)
        caps = self.capabilities
        checked = [
            check_outgoing(
                m,
                max_bytes=caps.max_message_bytes,
                max_headers=caps.max_headers,
                max_header_bytes=caps.max_header_bytes,
            )
            for m in messages
        ]
        if self._closed:
            raise ResourceClosed(f"{self!r} is closed")
        return checked

    def consumer(
        self,
        queue: str,
        group: str = DEFAULT_GROUP,
        *,
        max_attempts: int = 5,
        ack_timeout: float = 30.0,
        prefetch: int = 32,
        close_timeout: float = 10.0,
        max_in_flight: int | None = None,
    ) -> Consumer:
        """A consumer of ``queue`` in consumer group ``group``: ``async with`` it, iterate it.

        ``prefetch`` bounds the messages fetched (and so leased) but not yet handed to
        you; with ``prefetch >= 2`` the consumer reads ahead, fetching more once half of
        them are handed out, so the next batch is on its way while you work. With
        ``prefetch=1`` a message is fetched only when you ask for it.

        ``max_in_flight`` bounds the messages handed to you and not yet settled: the
        iterator waits (it does not raise) while that many are unsettled, so one task per
        message never holds more than that many leases. The default,
        ``max(prefetch, 100)``, leaves a sequential loop unchanged and lets a caller
        gather up to ``prefetch`` messages before settling them (batch inserts); a loop
        that holds ``max_in_flight`` messages and waits for one more before settling any
        waits for good. A held message whose lease ran out still counts until you settle
        it (that raises LeaseExpired) or drop it: see ``Consumer.in_flight``.
        Raises InvalidName or InvalidArgument before any I/O.
        """
        return self._consumer(
            QueueRef(queue), group, max_attempts, ack_timeout, prefetch, close_timeout,
            max_in_flight,
        )  # fmt: skip

    def dead_letters(
        self,
        queue: str,
        group: str = DEAD_LETTER_GROUP,
        *,
        ack_timeout: float = 30.0,
        prefetch: int = 32,
        close_timeout: float = 10.0,
        max_in_flight: int | None = None,
    ) -> Consumer:
        """A consumer over ``queue``'s DLQ; each message has ``dead_letter_info``."""
        return self._consumer(
            QueueRef(queue).dlq, group, 2**31 - 1, ack_timeout, prefetch, close_timeout,
            max_in_flight,
        )  # fmt: skip

    def _consumer(
        self,
        queue: QueueRef,
        group: str,
        max_attempts: int,
        ack_timeout: float,
        prefetch: int,
        close_timeout: float,
        max_in_flight: int | None,
    ) -> Consumer:
        check_name("queue", queue.name)
        check_name("consumer group", group)
        attempts, timeout, fetch, close = check_consumer_args(
            max_attempts, ack_timeout, prefetch, close_timeout
        )
        if max_in_flight is None:
            in_flight = max(fetch, MIN_DEFAULT_IN_FLIGHT)
        else:
            in_flight = check_int("max_in_flight", max_in_flight, minimum=1)
        if self._closed:
            raise ResourceClosed(f"{self!r} is closed")
        consumer = Consumer(
            self._link,
            queue,
            group,
            max_attempts=attempts,
            ack_timeout=timeout,
            prefetch=fetch,
            close_timeout=close,
            max_in_flight=in_flight,
        )
        self._consumers.add(consumer)
        return consumer

    async def declare(self, queue: str, group: str | None = None) -> None:
        """Create ``queue``, its DLQ and (if given) consumer ``group`` now, idempotently.

        Optional: everything is created on first use anyway. This is the separate,
        least-privilege step of CONTRACT section 3 (an operator declares; services then
        need only publish and consume rights). InvalidName before any I/O.
        """
        check_name("queue", queue)
        if group is not None:
            check_name("consumer group", group)
        backend = await self._opened_backend()
        await backend.declare(QueueRef(queue), group)

    async def delete_queue(self, queue: str) -> None:
        """Delete ``queue`` and its DLQ on the broker: their messages and every group's state.

        For tests and tooling (``brokerkit check`` deletes the queues it made). Idempotent:
        a queue that does not exist is fine. Close this connection's consumers of the queue
        first (InvalidArgument otherwise); consumers elsewhere find the queue gone or made
        anew, as the broker does it. UnsupportedFeature on a backend that cannot delete.
        """
        check_name("queue", queue)
        if self._closed:
            raise ResourceClosed(f"{self!r} is closed")
        open_here = [c for c in self._consumers if c.queue == queue]
        if open_here:
            raise InvalidArgument(
                f"close the {len(open_here)} open consumer(s) of queue {queue!r} before deleting it"
            )
        backend = await self._opened_backend()
        await backend.delete_queue(queue)

    async def browse(
        self, queue: str, *, dead_letters: bool = False, limit: int = 100
    ) -> AsyncIterator[BrowsedMessage]:
        """The oldest ``limit`` messages of ``queue`` (or its DLQ), oldest first, read without
        any side effect: nothing is leased, no attempt counted, no order changed.

        ``async for msg in broker.browse("orders", dead_letters=True): ...``. Raises
        UnsupportedFeature where the broker cannot read without side effects
        (``capabilities.browse`` is False): it never degrades to a destructive read.
        """
        check_name("queue", queue)
        check_int("limit", limit, minimum=0)
        if not self.capabilities.browse:
            raise UnsupportedFeature(
                f"{self.url.scheme}:// cannot browse without side effects (see its docs)"
            )
        backend = await self._opened_backend()
        ref = QueueRef(queue).dlq if dead_letters else QueueRef(queue)
        for delivery in await backend.browse(ref, limit):
            headers, info = (
                split_envelope(delivery.headers) if dead_letters else (delivery.headers, None)
            )
            yield BrowsedMessage(
                id=delivery.id,
                body=delivery.body,
                headers=headers,
                fifo_group=info.fifo_group if info else delivery.fifo_group,
                dedup_id=info.dedup_id if info else delivery.dedup_id,
                dead_letter_info=info,
            )

    async def stats(self, queue: str, group: str = DEFAULT_GROUP) -> QueueStats:
        """What the broker can tell about ``queue`` for consumer ``group``: ready, in flight,
        delayed, dead (the DLQ's depth), the oldest message's age; None where it cannot."""
        check_name("queue", queue)
        check_name("consumer group", group)
        backend = await self._opened_backend()
        ref = QueueRef(queue)
        main = await backend.stats(ref, group)
        dlq = await backend.stats(ref.dlq, None)
        dead = (
            dlq.ready if dlq.ready is None or dlq.in_flight is None else dlq.ready + dlq.in_flight
        )
        return QueueStats(main.ready, main.in_flight, main.delayed, dead, main.oldest_age)

    async def redrive(self, queue: str, limit: int | None = None) -> int:
        """Move dead messages back to ``queue``, oldest first, keeping fifo_group order.

        Each is republished (without its dedup id, which would suppress it),
        then removed from the DLQ: a crash in between leaves a copy in both.
        Returns how many moved. "Oldest" is the order of death (see ``brokerkit._redrive``).
        """
        check_name("queue", queue)
        if limit is not None:
            check_int("limit", limit, minimum=0)
        backend = await self._opened_backend()
        wait = 1.0 + self.capabilities.redelivery_slack
        return await redrive(backend, queue, DEAD_LETTER_GROUP, limit=limit, first_wait=wait)
