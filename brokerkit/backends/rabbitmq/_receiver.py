"""RabbitReceiver: consumes a queue's RabbitMQ queues on one channel and holds its leases.

Sources: for a queue, its free queue (competing consumers) and its N partition queues
(``x-single-active-consumer``: one receiver at a time holds a partition, so it alone
orders and gates the partition's groups); for a DLQ, the DLQ. Consuming starts with the
first ``receive``, whose ``max_messages`` (the consumer's prefetch) sizes ``basic.qos``
unless ``?prefetch=`` is given, with the settings' ``max_unsettled`` unless ``?max_held=``
is (``_held.size``). Delivery states: see ``_held``.

* ack -> ``basic.ack``; nack(delay) -> DELAYED (kept unacked here, its group taken),
  then at the due time ``basic.reject(requeue=True)``: the broker counts the failed
  delivery and puts the message back at the head of its queue. For a partition the
  group stays taken until the copy comes back to this receiver, so nothing later of the
  group overtakes it. A nack without delay is rejected by the next ``receive`` (or by the
  janitor after a grace), so a consumer that nacks what it holds while closing has it
  returned once, in order, by ``aclose``;
* lease expiry -> this receiver rejects the message itself at ``ack_timeout`` (RabbitMQ's
  own consumer_timeout is 30 min and closes the whole channel); a late settle raises
  LeaseExpired (the token moved on);
* release -> back to the front here; aclose -> give back every unacked delivery in
  order (see ``aclose``: explicitly for unordered sources, by the channel close for
  partitions, so a partition changes hands in one broker step);
* the channel lost (connection drop, broker restart) -> every receipt is void
  (LeaseExpired; the broker took them all back) and the next ``receive`` subscribes anew;
* attempt -> 1 for a first delivery; a redelivery's from the attempt book (``_attempts``),
  which counts hand-outs, not what the broker pushed to a consumer that died.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiormq
from aiormq import exceptions as amqp

from brokerkit.backends import (
    BrokerRefused,
    Delivery,
    GroupGate,
    LeaseExpired,
    Receiver,
    ReceiverSettings,
)
from brokerkit.backends.rabbitmq._acks import AckBatch
from brokerkit.backends.rabbitmq._attempts import AttemptBook
from brokerkit.backends.rabbitmq._codec import parse
from brokerkit.backends.rabbitmq._deadlines import Deadlines
from brokerkit.backends.rabbitmq._deliveries import consume
from brokerkit.backends.rabbitmq._errors import MAPPED
from brokerkit.backends.rabbitmq._held import (
    DELAYED,
    GONE,
    LEASED,
    READY,
    RETURNING,
    Held,
    Lease,
    Source,
    held_room,
    size,
)
from brokerkit.backends.rabbitmq._ledger import Ledger
from brokerkit.backends.rabbitmq._link import Link, close_channel_quietly

__all__ = ["RabbitReceiver"]

_log = logging.getLogger(__name__)

_JANITOR_TICK = 0.1
_LAZY_GRACE = 1.0
"""A nack without delay is rejected by the next receive, or by the janitor after this."""
_RESUBSCRIBE_PAUSE = 1.0
_NOT_FOUND = 404

_tokens = itertools.count(1)


class RabbitReceiver(Receiver[Lease]):
    """One consumer's channel; see the module docstring for the mechanisms."""

    release_uncounted = True
    """A release keeps the delivery here, and takes its hand-out out of the attempt book."""

    def __init__(
        self,
        link: Link,
        sources: Sequence[Source],
        settings: ReceiverSettings,
        *,
        ledger: Ledger | None,
        book: AttemptBook,
        dead_letters: bool,
        redeclare: Callable[[], Awaitable[None]],
    ) -> None:
        self._link = link
        self._redeclare = redeclare
        self._sources = list(sources)
        self._lease = settings.ack_timeout
        self._max_unsettled = settings.max_unsettled
        self._ledger = ledger
        self._book = book
        self._dead_letters = dead_letters
        self._channel: aiormq.abc.AbstractChannel | None = None
        self._generation = 0
        self._unacked: dict[int, Held] = {}
        self._ready: deque[Held] = deque()
        self._gate: GroupGate[Held] = GroupGate()
        self._returning: dict[str, Held] = {}
        self._deadlines = Deadlines()
        self._wakeup = asyncio.Event()
        self._janitor: asyncio.Task[None] | None = None
        self._stagers: set[asyncio.Task[None]] = set()
        self._acks = AckBatch(link, lambda: (self._channel, self._unacked))
        self._clock = asyncio.get_running_loop().time
        self._closing = False

    # -- subscribing ------------------------------------------------------------------

    async def _subscribe(self) -> None:
        link = self._link
        channel, _ = await link.channel()
        self._generation += 1
        generation = self._generation
        self._channel = channel  # deliveries may arrive before the last basic.consume-ok
        self._unacked = {}
        channel.closing.add_done_callback(lambda _: self._lost(channel))
        cancelled = getattr(channel, "on_consumer_cancel_callbacks", None)
        if isinstance(cancelled, set):  # the broker cancelled a consumer (queue deleted)
            cancelled.add(lambda _frame: self._resubscribe_later(channel))
        try:
            with link.errors:
                qos = 0
                for source in self._sources:
                    if source.prefetch != qos:  # applies to the consumers created after it
                        qos = source.prefetch
                        await channel.basic_qos(prefetch_count=qos)
                    callback = self._callback(source, channel, generation)
                    ok = await consume(channel, source.name, callback)
                    source.consumer_tag = ok.consumer_tag
        except BaseException:
            self._lost(channel)
            await close_channel_quietly(channel)
            raise
        if self._janitor is None:
            self._janitor = asyncio.ensure_future(self._janitor_loop())

    def _callback(self, source: Source, channel: Any, generation: int) -> Any:
        def on_message(message: aiormq.abc.DeliveredMessage) -> None:
            if self._channel is channel:
                self._arrived(source, generation, message)

        return on_message

    def _resubscribe_later(self, channel: aiormq.abc.AbstractChannel) -> None:
        """Close the channel (the broker takes back what it held); receive subscribes anew,
        declaring the queues again if another client deleted them."""
        if self._channel is channel and not self._closing:
            _log.warning("RabbitMQ cancelled a consumer of a receiver; subscribing again")
            task = asyncio.ensure_future(close_channel_quietly(channel))
            self._stagers.add(task)
            task.add_done_callback(self._stagers.discard)

    def _lost(self, channel: aiormq.abc.AbstractChannel) -> None:
        """The channel closed: the broker took back every unacked delivery."""
        if self._channel is not channel:
            return
        self._channel = None
        if not self._closing:
            _log.warning("RabbitMQ channel of a receiver closed; it will subscribe again")
        self._unacked = {}
        self._acks.drop()
        self._ready.clear()
        self._gate = GroupGate()
        self._returning.clear()
        self._deadlines.clear()
        for source in self._sources:
            source.staging.clear()
        self._wakeup.set()

    async def _ensure_subscribed(self, max_messages: int) -> bool:
        if self._channel is not None and not self._channel.is_closed:
            return True
        if not self._sources[0].prefetch:
            options = self._link.options
            explicit = "max_held" in options.model_fields_set
            held = held_room(options.max_held, explicit, self._max_unsettled, max_messages)
            size(self._sources, options.prefetch or max_messages, held, shared=explicit)
        try:
            try:
                await self._subscribe()
            except BrokerRefused as exc:
                if exc.code != _NOT_FOUND:
                    raise
                await self._redeclare()  # another client deleted the queue meanwhile
                await self._subscribe()
        except MAPPED as exc:
            _log.warning("cannot subscribe to RabbitMQ yet: %s", exc)
            return False
        return True

    # -- arrivals ---------------------------------------------------------------------

    def _arrived(
        self, source: Source, generation: int, message: aiormq.abc.DeliveredMessage
    ) -> None:
        self._acks.heard = self._clock()
        tag = message.delivery.delivery_tag  # type: ignore[union-attr]
        assert isinstance(tag, int)
        grouped = source.ordered or self._dead_letters  # where a fifo_group header belongs
        incoming = parse(message.header.properties, f"tag-{generation}-{tag}", grouped)
        if source.ordered:
            back = self._returning.pop(incoming.id, None)
            if back is not None:  # the copy of a message this receiver returned
                back.tag, back.generation, back.incoming = tag, generation, incoming
                back.body = message.body
                back.state = READY
                back.booked, back.attempt = False, incoming.attempt
                self._unacked[tag] = back
                if self._closing:
                    return
                if back.group is None or self._gate.give_back(back.group) is back:
                    self._ready.append(back)
                self._wakeup.set()
                return
        held = Held(source, tag, generation, incoming, message.body)
        self._unacked[tag] = held
        if self._closing:
            return  # given back by aclose, in order
        if source.staging or (incoming.dedup_id is not None and self._ledger is not None):
            source.staging.append(held)
            if len(source.staging) == 1:
                task = asyncio.ensure_future(self._stage(source, generation))
                self._stagers.add(task)
                task.add_done_callback(self._stagers.discard)
            return
        self._admit(held)

    def _admit(self, held: Held) -> None:
        group = held.group
        if group is None or self._gate.push(group, held):
            self._ready.append(held)
            self._wakeup.set()

    async def _stage(self, source: Source, generation: int) -> None:
        """Dedup verdicts in arrival order; later arrivals of the source wait behind."""
        ledger = self._ledger
        staging = source.staging
        while staging and generation == self._generation and not self._closing:
            held = staging[0]
            incoming = held.incoming
            if incoming.dedup_id is not None and ledger is not None:
                try:
                    keep = await ledger.admit(incoming.dedup_id, incoming.id, incoming.stamp)
                except (*MAPPED, TimeoutError) as exc:  # the task must not die
                    _log.warning("dedup ledger unavailable, retrying: %r", exc)
                    await asyncio.sleep(_RESUBSCRIBE_PAUSE)
                    continue
                if generation != self._generation or not staging or staging[0] is not held:
                    return
                if not keep:  # a duplicate inside its window: acked, never delivered
                    staging.popleft()
                    held.state = GONE
                    try:
                        await self._send_ack(held)
                    except LeaseExpired:
                        return  # the channel went: the broker redelivers it, decided again
                    continue
            staging.popleft()
            self._admit(held)

    # -- receiving --------------------------------------------------------------------

    async def receive(self, max_messages: int, wait: float) -> list[Delivery[Lease]]:
        loop = asyncio.get_running_loop()
        now = loop.time()
        end = now + wait
        while not self._closing:
            if not await self._ensure_subscribed(max_messages):
                await asyncio.sleep(max(0.0, min(_RESUBSCRIBE_PAUSE, end - loop.time())))
                return []
            await self._fire_dues(now, grace=0.0)
            # a lease runs from the hand-out: subscribing (after a broker restart, say)
            # may have taken longer than ack_timeout since ``now`` was read
            now = loop.time()
            out, redeliveries = self._take(max_messages, now)
            if redeliveries:
                try:
                    await self._book.hand_out(redeliveries)
                except (*MAPPED, TimeoutError) as exc:
                    _log.warning("attempt book not written (%r): deliveries kept", exc)
                    self._put_back(out)  # nothing handed out
                    await asyncio.sleep(_RESUBSCRIBE_PAUSE)
                    return []
            if out or now >= end:
                return out
            self._wakeup.clear()
            timeout = end - now
            due = self._deadlines.next_due()
            if due is not None:
                timeout = min(timeout, due - now)
            try:
                await asyncio.wait_for(self._wakeup.wait(), max(timeout, 0.001))
            except TimeoutError:
                pass
            now = loop.time()
        return []

    def _take(
        self, max_messages: int, now: float
    ) -> tuple[list[Delivery[Lease]], list[Delivery[Lease]]]:
        """Lease up to ``max_messages`` ready deliveries; also those of them whose attempt
        the book must count (redeliveries not yet recorded for this hand-out)."""
        out: list[Delivery[Lease]] = []
        redeliveries: list[Delivery[Lease]] = []
        ready, gate, lease, leases = self._ready, self._gate, self._lease, self._deadlines.leases
        dead_letters = self._dead_letters
        while ready and len(out) < max_messages:
            held = ready.popleft()
            if held.state != READY:
                continue
            if held.group is not None:
                gate.take(held.group)
            held.token = token = next(_tokens)
            held.state = LEASED
            held.seen = True
            held.deadline = deadline = now + lease
            leases.append((deadline, token, held))
            incoming = held.incoming
            delivery = incoming.delivery(held.body, held.attempt, Lease(held, token), dead_letters)
            out.append(delivery)
            if incoming.attempt > 1 and not held.booked:
                redeliveries.append(delivery)
        return out, redeliveries

    # -- settling ---------------------------------------------------------------------

    def _held(self, delivery: Delivery[Lease], verb: str) -> Held:
        lease = delivery.receipt
        held = lease.held
        if (
            held.token != lease.token
            or held.state != LEASED
            or held.generation != self._generation
            or self._channel is None
            or asyncio.get_running_loop().time() > held.deadline
        ):
            raise LeaseExpired(f"cannot {verb} message {delivery.id!r}: its lease was lost")
        return held

    def check_lease(self, delivery: Delivery[Lease]) -> None:
        self._held(delivery, "dead-letter")

    async def ack(self, delivery: Delivery[Lease]) -> None:
        """ack -> ``basic.ack``; the message's group (if any) moves on."""
        held = self._held(delivery, "ack")
        held.state = GONE
        held.token = 0
        gate = self._gate  # replaced when the channel goes
        try:
            await self._send_ack(held)
        finally:  # settled here even if the ack's barrier failed: the group moves on
            group = held.group
            if group is not None and gate is self._gate:
                nxt = gate.done(group)
                if nxt is not None:
                    self._ready.append(nxt)
                    self._wakeup.set()

    async def flush_acks(self) -> None:
        """A barrier behind the acks queued so far (``_acks``)."""
        await self._acks.barrier(self._sources[-1].prefetch if self._sources else 1)

    async def _send_ack(self, held: Held) -> None:
        """Queue the ack (written at the next turn of the event loop with every other ack
        queued meanwhile); without recent word from the broker, wait for a barrier
        (``_acks``)."""
        if self._channel is None or held.generation != self._generation:
            raise LeaseExpired("the channel closed: the broker took the message back")
        self._unacked.pop(held.tag, None)
        await self._acks.ack(held.tag, self._sources[-1].prefetch)

    async def nack(self, delivery: Delivery[Lease], delay: float) -> None:
        """nack -> held here until ``delay`` passed, then ``basic.reject(requeue=True)``."""
        held = self._held(delivery, "nack")
        now = asyncio.get_running_loop().time()
        held.state = DELAYED
        held.token = next(_tokens)
        self._deadlines.due(now + max(delay, 0.0), held)
        self._wakeup.set()

    async def extend(self, delivery: Delivery[Lease], ack_timeout: float) -> None:
        """extend -> a later deadline here (the broker has no lease to renew)."""
        held = self._held(delivery, "extend")
        held.deadline = asyncio.get_running_loop().time() + ack_timeout
        self._deadlines.extend(held)

    async def release(self, deliveries: Sequence[Delivery[Lease]]) -> None:
        """Unseen deliveries go back to the front here, their hand-outs taken out of the
        attempt book (``aclose`` gives them back to the broker as never seen)."""
        await self._book.give_back([d.receipt.held for d in self._put_back(deliveries)])

    def _put_back(self, deliveries: Sequence[Delivery[Lease]]) -> list[Delivery[Lease]]:
        """Deliveries still leased go back to the front here, in order; returns them."""
        back = []
        for delivery in reversed(deliveries):
            lease = delivery.receipt
            held = lease.held
            if held.token != lease.token or held.state != LEASED:
                continue
            held.state = READY
            held.token = 0
            held.seen = False
            if held.group is not None:
                self._gate.give_back(held.group)
            self._ready.appendleft(held)
            back.append(delivery)
        return back

    async def _return(self, held: Held) -> None:
        """``basic.reject(requeue=True)``: the broker counts a failed delivery."""
        channel = self._channel
        held.state = RETURNING
        held.token = 0
        if channel is None or held.generation != self._generation:
            return
        self._unacked.pop(held.tag, None)
        if held.source.ordered:
            self._returning[held.incoming.id] = held
        with self._link.errors:
            await channel.basic_reject(held.tag, requeue=True, wait=False)

    async def _fire_dues(self, now: float, *, grace: float) -> None:
        for held in self._deadlines.fired(now, grace):
            await self._return(held)

    async def _janitor_loop(self) -> None:
        """Lease expiries (rejected at once) and dues nobody received for (after a grace)."""
        loop = asyncio.get_running_loop()
        while not self._closing:
            await asyncio.sleep(_JANITOR_TICK)
            now = loop.time()
            try:
                for held in self._deadlines.expired(now):
                    await self._return(held)
                await self._fire_dues(now, grace=_LAZY_GRACE)
            except MAPPED as exc:
                _log.debug("receiver janitor: %s", exc)

    # -- closing ----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Give back what is unacked, then close the channel.

        Unordered sources (the free queue, a DLQ): their consumers are cancelled first,
        then each unacked delivery is given back in delivery order, ``basic.reject`` for
        what the caller saw (a failed attempt), ``basic.nack`` for what it never saw (not
        counted from 4.3 on). Partitions: the channel close itself returns their unacked
        deliveries, in order and in the same broker step that hands the partition to the
        next single active consumer. A ``basic.cancel`` first would activate the next
        consumer while this one still holds the head of a group (seen on the broker's
        side as two consumers of one group at once, and the head returned behind
        later messages); the price is that RabbitMQ counts a fetched-ahead, never seen
        partition delivery as an attempt.
        """
        if self._closing:
            return
        self._closing = True
        for task in [self._janitor, *self._stagers]:
            if task is not None:
                task.cancel()
        self._wakeup.set()
        channel = self._channel
        if channel is None:
            return
        await self._acks.write()  # what the caller acked is acked
        await self._book.uncount([held for held in self._unacked.values() if not held.seen])
        try:
            unordered = [s for s in self._sources if not s.ordered]
            for source in unordered:
                if source.consumer_tag is not None and not channel.is_closed:
                    await asyncio.wait_for(channel.basic_cancel(source.consumer_tag), 5)
            for tag in sorted(self._unacked):
                held = self._unacked[tag]
                if held.source.ordered:
                    continue
                if held.seen:  # handed out and not settled: a failed attempt
                    await channel.basic_reject(tag, requeue=True, wait=False)
                else:  # fetched ahead, never seen: not a failure (uncounted from 4.3)
                    await channel.basic_nack(tag, requeue=True, wait=False)
        except (amqp.AMQPError, amqp.ChannelInvalidStateError, OSError, TimeoutError) as exc:
            _log.debug("closing a receiver: %r (the channel close returns the rest)", exc)
        finally:
            self._unacked = {}
            self._channel = None
            await close_channel_quietly(channel)
