"""Consumers and received messages: the settling policy, written once for every backend."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from brokerkit._alone import AloneLink, FlushedAck, LastAttempts
from brokerkit._dlq import REASON_MAX_ATTEMPTS, dead_letter_corrupt, move, split_envelope
from brokerkit._errors import (
    AlreadySettled,
    BrokerkitError,
    InvalidArgument,
    LeaseExpired,
    ResourceClosed,
    UnsupportedFeature,
)
from brokerkit._fetchbuffer import FetchBuffer
from brokerkit._held import Held
from brokerkit._message import DeadLetterInfo
from brokerkit._validate import check_seconds
from brokerkit.backends.base import Backend, Delivery, QueueRef, Receiver, ReceiverSettings

_now = time.monotonic  # the lease clock: monotonic, and the same clock as the event loop's

# How long one receive call may wait before the iterator checks for close.
_POLL_WAIT = 1.0

# While a fetch is in flight, the iterator yields to the event loop once per this many
# messages handed out, so the fetch progresses even under a caller that never waits.
_YIELD_EVERY = 32

_UNSETTLED, _SETTLING, _SETTLED, _LOST = "unsettled", "settling", "settled", "lost"


@dataclass(frozen=True, slots=True)
class ConsumerLink:
    """What a consumer needs of its broker, handed in: the consumer never sees the Broker."""

    opened_backend: Callable[[], Awaitable[Backend]]
    """The broker's backend, connected on first use (ResourceClosed once the broker is)."""
    max_nack_delay: float
    """``capabilities.max_nack_delay`` of the backend (fixed at construction)."""
    on_close: Callable[[Consumer], None]
    """Called once when the consumer has closed (the broker stops tracking it)."""
    where: str
    """The broker's URL, redacted, for ``repr``."""


class Message:
    """A received message, leased to its consumer until settled or ``ack_timeout`` passes.

    Settle it exactly once with ``ack``, ``nack`` or ``dead_letter``; ``extend``
    renews the lease. Settling twice raises AlreadySettled; settling after the
    lease ran out (or after the consumer gave it back on close) raises
    LeaseExpired.
    """

    __slots__ = ("_consumer", "_deadline", "_delivery", "_receiver", "_state")

    dead_letter_info: DeadLetterInfo | None = None
    """Why the message died, when it was read from a DLQ (``broker.dead_letters``)."""

    def __init__(
        self, consumer: Consumer, receiver: Receiver[Any], delivery: Delivery[Any], deadline: float
    ) -> None:
        self._consumer = consumer
        self._receiver = receiver
        self._delivery = delivery
        self._deadline = deadline
        self._state = _UNSETTLED

    @property
    def headers(self) -> Mapping[str, str]:
        """The publisher's headers, byte-exact (read-only)."""
        return self._delivery.headers

    @property
    def queue(self) -> str:
        return self._consumer.queue

    @property
    def body(self) -> bytes:
        return self._delivery.body

    @property
    def id(self) -> str:
        return self._delivery.id

    @property
    def fifo_group(self) -> str | None:
        info = self.dead_letter_info
        return info.fifo_group if info else self._delivery.fifo_group

    @property
    def dedup_id(self) -> str | None:
        info = self.dead_letter_info
        return info.dedup_id if info else self._delivery.dedup_id

    @property
    def attempt(self) -> int:
        """1-based delivery count, durable across consumer restarts."""
        return self._delivery.attempt

    @property
    def extras(self) -> Mapping[str, Any]:
        """Broker-specific read-outs, documented per backend."""
        return self._delivery.extras

    @property
    def settled(self) -> bool:
        return self._state == _SETTLED

    def __repr__(self) -> str:
        return (
            f"<Message id={self.id!r} queue={self.queue!r} attempt={self.attempt} "
            f"fifo_group={self.fifo_group!r} {self._state}>"
        )

    def ack(self) -> Coroutine[Any, Any, None]:
        """Settle: the message is not delivered to this consumer group again.

        ``await msg.ack()``. (A plain method returning the settling coroutine: one
        coroutine less per message than an ``async def`` wrapper.)
        """
        return self._settle(self._receiver.ack)

    async def nack(self, delay: float | None = None) -> None:
        """Deliver again (attempt + 1) no sooner than ``delay`` seconds from now.

        At ``attempt >= max_attempts`` the message goes to the DLQ instead,
        reason ``max_attempts``. Raises InvalidArgument for a negative delay.
        """
        seconds = check_seconds("delay", delay, allow_none=True) or 0.0
        limit = self._consumer.max_nack_delay
        if seconds > limit:
            raise InvalidArgument(f"delay must be at most {limit} seconds on this broker")
        if self.attempt >= self._consumer.max_attempts and self.dead_letter_info is None:
            await self._settle(lambda d: self._consumer.move_to_dlq(d, REASON_MAX_ATTEMPTS))
        else:
            await self._settle(lambda d: self._receiver.nack(d, seconds))

    async def dead_letter(self, reason: str) -> None:
        """Move to the queue's DLQ now, whatever the attempt count."""
        if not isinstance(reason, str) or not reason:
            raise InvalidArgument("dead_letter needs a non-empty reason string")
        if self.dead_letter_info is not None:
            raise UnsupportedFeature(
                "a dead letter cannot be dead-lettered again: ack or redrive it"
            )
        await self._settle(lambda d: self._consumer.move_to_dlq(d, reason))

    async def extend(self) -> None:
        """Renew the lease for another ``ack_timeout`` seconds from now."""
        self._check_settleable()
        started = _now()
        timeout = self._consumer.ack_timeout
        await self._receiver.extend(self._delivery, timeout)
        self._deadline = started + timeout

    def _check_settleable(self) -> None:
        if self._state in (_SETTLED, _SETTLING):
            raise AlreadySettled(f"message {self.id!r} was already settled")
        if self._state == _LOST or _now() > self._deadline:
            self._state = _LOST
            self._consumer.settled(self)  # the caller let go of it: its slot is free
            raise LeaseExpired(
                f"the lease on message {self.id!r} ran out (ack_timeout="
                f"{self._consumer.ack_timeout}s); it may already be redelivered"
            )

    async def _settle(self, action: Any) -> None:
        """Run one settling backend call; the state machine lives here only."""
        if self._state is not _UNSETTLED or _now() > self._deadline:
            self._check_settleable()  # raises AlreadySettled or LeaseExpired
        self._state = _SETTLING
        try:
            await action(self._delivery)
        except LeaseExpired:
            self._state = _LOST
            self._consumer.settled(self)
            raise
        except BaseException:
            self._state = _UNSETTLED
            raise
        self._state = _SETTLED
        self._consumer.settled(self)

    def _give_back(self, now: float) -> bool:
        """Called on consumer close: True if unsettled and its lease still held."""
        if self._state == _UNSETTLED:
            self._state = _LOST
            return now <= self._deadline
        return False


class _DeadLetterMessage(Message):
    """A message read from a DLQ: the envelope split off its headers into ``dead_letter_info``.

    (Its own class, so that an ordinary Message carries no per-message fields for it.)
    """

    __slots__ = ("_headers", "dead_letter_info")

    def __init__(
        self, consumer: Consumer, receiver: Receiver[Any], delivery: Delivery[Any], deadline: float
    ) -> None:
        super().__init__(consumer, receiver, delivery, deadline)
        self._headers, self.dead_letter_info = split_envelope(delivery.headers)

    @property
    def headers(self) -> Mapping[str, str]:
        return self._headers


class Consumer:
    """Reads one queue (or its DLQ) for one consumer group; an async iterator of Messages.

    The iterator keeps yielding while earlier messages are unsettled, up to
    ``max_in_flight`` of them (``in_flight``), so messages may be handled concurrently.
    A message counts from its hand-out until the caller settles it, tries to (a settle
    or ``extend`` after its lease ran out raises LeaseExpired and frees the slot), or
    drops every reference to it: a lease that ran out does not free a slot by itself,
    so the caller never holds more than ``max_in_flight`` messages. It reads ahead
    (see ``Broker.consumer``'s ``prefetch``). Cancelling a pending ``__anext__`` loses
    nothing. ``aclose`` stops fetching, waits up to ``close_timeout`` for held messages
    to be settled, then gives every unsettled one back.
    """

    def __init__(
        self,
        link: ConsumerLink,
        queue: QueueRef,
        group: str,
        *,
        max_attempts: int,
        ack_timeout: float,
        prefetch: int,
        close_timeout: float,
        max_in_flight: int,
    ) -> None:
        self._link = link
        self.ref = queue
        self.queue = queue.name
        self.group = group
        self.max_attempts = max_attempts
        self.max_nack_delay = link.max_nack_delay
        self.ack_timeout = ack_timeout
        self.prefetch = prefetch
        self.close_timeout = close_timeout
        self.max_in_flight = max_in_flight
        dead_letters = self.dead_letters = queue.dead_letters
        self._backend: Backend | None = None
        self._max_bytes = 0  # capabilities.max_message_bytes, read when opened
        self._receiver: Receiver[Any] | None = None
        # only DLQ copies carry the envelope
        self._message_class = _DeadLetterMessage if dead_letters else Message
        # fetched, not yet handed out (a last attempt first); given back before a lease ends
        last = 0 if dead_letters else max_attempts
        where = f"consumer {queue.name}/{group}{' (DLQ)' if dead_letters else ''}"
        self._buffer = buffer = FetchBuffer(ack_timeout, self._give_back_unseen, last, where)
        self._releases: set[asyncio.Task[None]] = set()
        link_ = AloneLink(
            buffer, max_attempts, self.move_to_dlq, self._holds, self._settle_held, ack_timeout
        )
        self._alone = LastAttempts(link_)  # a last attempt is handed out alone
        self._read_ahead_at = prefetch // 2 if prefetch > 1 else -1
        self._since_yield = 0
        self._held: Held[Message] = Held()  # handed out, not settled nor dropped: in_flight
        self._slot: asyncio.Future[None] | None = None  # made while the iterator waits for one
        self._drained: asyncio.Event | None = None  # made by aclose when it must wait
        self._closing = False
        self._closed: asyncio.Future[None] | None = None
        self._open_lock = asyncio.Lock()

    def __repr__(self) -> str:
        kind = "dead_letters" if self.dead_letters else "consumer"
        return f"<{kind} queue={self.queue!r} group={self.group!r} broker={self._link.where}>"

    async def __aenter__(self) -> Consumer:
        await self.open()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def open(self) -> None:
        """Subscribe (creating queue, DLQ and group on first use). Idempotent."""
        if self._closing:
            raise ResourceClosed(f"{self!r} is closed")
        async with self._open_lock:
            if self._receiver is None:
                backend = await self._link.opened_backend()
                settings = ReceiverSettings(self.ack_timeout, self.prefetch + self.max_in_flight)
                self._receiver = await backend.subscribe(self.ref, self.group, settings)
                self._backend = backend
                self._max_bytes = backend.capabilities.max_message_bytes

    @property
    def in_flight(self) -> int:
        """Messages handed out and not yet settled by the caller, as ``max_in_flight``
        counts them: one whose lease ran out still counts until a settle raises
        LeaseExpired for it, or until the caller drops every reference to it."""
        return len(self._held)

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> Message:
        if self._closing:
            raise ResourceClosed(f"{self!r} is closed")
        receiver = self._receiver
        if receiver is None:
            await self.open()
            receiver = self._live_receiver()
        buffer = self._buffer
        alone = self._alone
        while True:
            # state is re-read after every await: close or another iterating task moves it
            if len(self._held) >= self.max_in_flight or (alone.held is not None and alone.blocks()):
                await self._wait_for_slot()
                if self._closing:
                    raise StopAsyncIteration
                continue
            if buffer.count:
                if buffer.fetch is not None:
                    if self._since_yield >= _YIELD_EVERY:
                        # A caller that never waits (every ack coalesced, a CPU-bound
                        # handler) would starve the read-ahead fetch: let the loop move it.
                        self._since_yield = 0
                        await asyncio.sleep(0)
                        continue
                    self._since_yield += 1
                delivery = buffer.take()
                assert delivery is not None  # count > 0
                # read ahead: once half the prefetch is handed out, fetch that many more (not
                # with prefetch=1: that asks for one message at a time, leased when asked for)
                buffered = buffer.count
                if buffered <= self._read_ahead_at and buffer.fetch is None and not self._closing:
                    self._start_fetch(self.prefetch - buffered, wait=0.0)
                deadline = buffer.lease_end
                if _now() > deadline:  # ran out buffered (the loop lagged): given back with
                    self._give_back_unseen([delivery])  # the rest that did, uncounted
                    buffer.give_back_stale()
                    continue
                corrupt = delivery.defect or len(delivery.body) > self._max_bytes
                if corrupt and not self.dead_letters:  # to the DLQ, never handed out
                    await dead_letter_corrupt(self.move_to_dlq, delivery, self)
                    continue
                if delivery.attempt > 1 and not self.dead_letters:  # a redelivery
                    flush = self._backend.capabilities.ack_flush_interval if self._backend else 0.0
                    renewed = await alone.hand_out(delivery, deadline, receiver, flush)
                    if renewed is None:
                        continue  # to the DLQ, or its lease was lost meanwhile
                    deadline = renewed
                    if delivery.attempt >= self.max_attempts:  # handed out alone:
                        receiver = FlushedAck(receiver, flush)  # its ack returns recorded
                message = self._message_class(self, receiver, delivery, deadline)
                self._held.add(message)
                return message
            if self._closing:
                raise StopAsyncIteration
            await self._fill()

    async def _fill(self) -> None:
        buffer = self._buffer
        if buffer.fetch is None:
            self._start_fetch(self.prefetch, wait=_POLL_WAIT)
        await buffer.wait_fetch()  # cancel-safe; rides out an outage (BrokerUnavailable)

    def _start_fetch(self, count: int, *, wait: float) -> None:
        """Start one receive. A read-ahead one does not wait (``wait=0``): it only takes
        what is there now, so nothing is left blocked on an idle queue (close would wait
        for it); the caller's own fetch, when the buffer is empty, is the one that waits."""
        receiver = self._receiver
        assert receiver is not None
        self._buffer.start(receiver.receive(count, wait))

    def settled(self, message: Message) -> None:
        """A held message was settled (or its lease lost): it is no longer held."""
        self._held.discard(message)
        if self._slot is not None:
            self._wake_slot()
        if self._drained is not None and not self._held:
            self._drained.set()

    async def _wait_for_slot(self) -> None:
        """Wait while ``max_in_flight`` handed-out messages are unsettled, or until close.

        One dropped unsettled wakes nobody: a wait no settle ended looks for those, once."""
        slot = self._slot
        if slot is None:
            slot = self._slot = asyncio.get_running_loop().create_future()
        await asyncio.wait((slot,), timeout=_POLL_WAIT)  # never cancels the shared future
        if not slot.done():
            self._held.forget_dropped()

    def _holds(self, delivery: Delivery[Any]) -> bool:
        """Held and leased: a last attempt handed out alone stops blocking at its lease end."""
        now = _now()
        return any(m._delivery is delivery and m._deadline >= now for m in self._held)

    async def _settle_held(self) -> None:
        """Wait until the held messages are settled, their last lease ran out, or close."""
        if self._held:
            last = max(m._deadline for m in self._held)
            while self._held and _now() < last and not self._closing:
                await self._wait_for_slot()  # wakes at each settle, at most _POLL_WAIT later

    def _wake_slot(self) -> None:
        slot, self._slot = self._slot, None
        if slot is not None:  # never done while it is self._slot: only this resolves it
            slot.set_result(None)

    def _live_receiver(self) -> Receiver[Any]:
        if self._receiver is None:
            raise ResourceClosed(f"{self!r} is not open")
        return self._receiver

    def _give_back_unseen(self, unseen: list[Delivery[Any]]) -> None:
        """Released before their leases run out unseen (see ``_fetchbuffer``)."""
        task = asyncio.ensure_future(self._release(unseen))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, unseen: list[Delivery[Any]]) -> None:
        with contextlib.suppress(BrokerkitError):  # not given back: its lease runs out
            await self._live_receiver().release(unseen)

    async def move_to_dlq(
        self, delivery: Delivery[Any], reason: str, attempts: int | None = None
    ) -> None:
        """Dead-letter ``delivery``: its DLQ copy carries the envelope, then it is settled."""
        count = delivery.attempt if attempts is None else attempts
        await move(self._backend, self._live_receiver(), self.ref, delivery, reason, count)

    async def aclose(self) -> None:
        """Stop fetching, let held messages settle (``close_timeout``), give back the rest.

        Idempotent, and safe while another task is blocked iterating.
        """
        if self._closed is not None:
            await asyncio.shield(self._closed)
            return
        self._closing = True
        self._wake_slot()
        self._closed = asyncio.get_running_loop().create_future()
        try:
            await self._shutdown()
        finally:
            self._closed.set_result(None)
            self._link.on_close(self)

    async def _shutdown(self) -> None:
        receiver = self._receiver
        if receiver is None:
            return
        fetch = self._buffer.fetch
        if fetch is not None:
            await asyncio.wait([fetch], timeout=_POLL_WAIT + 5.0)
            if not fetch.done():
                fetch.cancel()
        if self._held and self.close_timeout > 0:
            # wait for the caller to settle, but never past the last lease still held
            last_lease = max(m._deadline for m in self._held)
            timeout = min(self.close_timeout, last_lease - _now())
            if timeout > 0:
                self._drained = asyncio.Event()
                drained = asyncio.ensure_future(self._drained.wait())
                await asyncio.wait([drained], timeout=timeout)
                drained.cancel()
        now = _now()
        seen = [m._delivery for m in list(self._held) if m._give_back(now)]
        self._buffer.stop_giving_back()  # what is buffered now is given back just below
        unseen, ran_out = self._buffer.drain(now)
        self._held.clear()
        try:
            # held by the caller and never settled: a failed attempt, like a crash
            for delivery in seen:
                with contextlib.suppress(LeaseExpired):  # lost meanwhile: redelivered anyway
                    await receiver.nack(delivery, 0.0)
            # fetched, never handed out (leases run out or not): given back, uncounted
            for back in (unseen, ran_out):
                if back:
                    with contextlib.suppress(LeaseExpired):
                        await receiver.release(back)
        finally:
            if self._releases:  # give-backs on their way finish before the receiver closes
                await asyncio.wait(list(self._releases), timeout=_POLL_WAIT + 5.0)
            await receiver.aclose()


__all__ = ["Consumer", "ConsumerLink", "Message"]
