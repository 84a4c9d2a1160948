"""NatsReceiver: pulls from a consumer group's durables and settles with JetStream acks.

Pull engine: one inbox subscription per receiver, and at most one outstanding
pull request per durable (slot 0: the group's unordered consumer, batch up to
the facade's ``max_messages``; slots 1..P: one partition each, batch 1). Each
request lingers server-side up to the ``wait`` of the ``receive`` that issued
it; whatever it delivers lands in this receiver's buffer, stamped with its
arrival time, and is handed out by the next ``receive``. A message that waited
in the buffer gets ``in_progress()`` when handed out, so the server's
``ack_wait`` clock restarts with the facade's lease clock; one that waited
longer than half its lease is given back unseen and uncounted (``_give_back_unseen``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from brokerkit.backends import (
    Delivery,
    LeaseExpired,
    Outgoing,
    PublishCopy,
    Receiver,
    ReceiverSettings,
)
from brokerkit.backends.nats._ackreply import AckReply, ack_reply
from brokerkit.backends.nats._attempts import AttemptBook
from brokerkit.backends.nats._errors import BEST_EFFORT
from brokerkit.backends.nats._layout import QueueLayout, decode_headers
from brokerkit.backends.nats._lease import Lease, new_lease
from brokerkit.backends.nats._link import NatsLink
from brokerkit.backends.nats._strays import StraySweeper

__all__ = ["Lease", "NatsReceiver"]

_STATUS = "Status"
_HEARTBEAT = "100"
_REFRESH_AFTER = 0.01
"""Buffered longer than this: ``in_progress()`` when handed out, to realign the server lease."""
_STALE_FRACTION = 0.5
"""Buffered longer than this share of ack_timeout: given back unseen, not handed out."""
_EXPIRY_GRACE = 0.25
"""A pull request is taken as finished this long after its expiry even if no 408 came."""
_LOOK = 0.05
"""How long a ``receive`` with ``wait <= 0`` looks for what is there now."""
_MAX_PULL = 1.0  # a longer receive re-issues; a close waits for at most this
_LEASE_MARGIN = 0.02
"""Settling this close to the server's lease end raises LeaseExpired: it may be redelivered."""
_NAK_MARGIN = 0.5
"""A delivery given back unseen is ``-NAK``ed only while more of its lease is left than
this: a ``-NAK`` that reaches the server after the lease ran out (and the server sent the
message again) makes it send the message once more, to a second holder (measured after a
20 s cut: a released delivery's ``-NAK`` landed 5 ms after its redelivery, and both copies
were handed out). Short of it, the server's own redelivery comes at most this late."""
_PRUNE_AT = 1024
"""Renewals kept before the ones that ran out (never settled here) are dropped."""
_ACK_WINDOW = 0.1
"""A pipelined ``+ACK`` returns at once only while the server was heard from this recently
(``capabilities.ack_flush_interval``); else ``ack`` waits for a PING/PONG behind it."""
_BURST = 1.0
"""How long after the first byte that follows an unanswered pull request deliveries are
still taken as sent before the silence (see ``_on_msg``)."""


@dataclass(slots=True)
class _Pull:
    serial: int
    remaining: int
    expires_at: float
    issued: float


class NatsReceiver(Receiver[Lease]):
    """receive -> pull requests ($JS.API.CONSUMER.MSG.NEXT); ack -> ack(); nack -> nak(delay);
    extend -> in_progress(); dead_letter -> publish to the DLQ stream, then term().

    ``attempt`` of a redelivery comes from the group's AttemptBook (``_attempts``), not
    from ``num_delivered`` alone, so a release counts no attempt."""

    release_uncounted = True  # release rewrites the record: see _attempts

    def __init__(
        self,
        link: NatsLink,
        group: str,
        layout: QueueLayout,
        settings: ReceiverSettings,
        *,
        dead_letters: bool,
    ) -> None:
        self._link = link
        self._group = group
        self._layout = layout
        self._settings = settings
        self._dead_letters = dead_letters
        self._book = None if dead_letters else AttemptBook(link, layout, group)
        self._strays = StraySweeper(link, layout)  # messages on subjects no durable reads
        self._confirm_acks = link.options.confirm_acks
        self._request_timeout = link.options.request_timeout
        errors = link.errors
        self._on_receive, self._on_ack, self._on_nack = (
            errors("receive"),
            errors("ack"),
            errors("nack"),
        )
        self._on_extend, self._on_dead = errors("extend"), errors("dead_letter")
        self._renewed: dict[Lease, float] = {}
        self._prune_at = _PRUNE_AT
        slots = layout.partitions + 1
        names = [layout.consumer(group, s) for s in range(slots)]
        self._slot_of = {name: s for s, name in enumerate(names)}
        self._next_subject = [f"$JS.API.CONSUMER.MSG.NEXT.{layout.stream}.{n}" for n in names]
        self._pulls: list[_Pull | None] = [None] * slots
        self._buffer: deque[tuple[float, Msg, AckReply]] = deque()
        self._arrived = asyncio.Event()
        self._serials = itertools.count(1)
        self._inbox = ""
        self._sub: Subscription | None = None
        self._closed = False
        self._naked_at = -math.inf  # when this receiver last sent an immediate -NAK
        self._heard = 0.0  # when the server last sent this receiver anything
        # a pull request went unanswered (the path may be cut): since when, and its serial
        self._quiet_since: float | None = None
        self._quiet_serial = 0
        self._quiet_until = math.inf

    async def start(self) -> None:
        nc = self._link.client
        self._inbox = nc.new_inbox()
        with self._link.errors("subscribe"):
            self._sub = await nc.subscribe(f"{self._inbox}.>", cb=self._on_msg)

    # -- the pull engine ----------------------------------------------------------------

    async def _on_msg(self, msg: Msg) -> None:
        """A delivery goes to the buffer, stamped with its arrival; a status ends a request.

        After a pull request went unanswered (no status by its expiry, and nothing else
        heard since: see ``_issue``) the path may have been cut, and what arrives next may
        have been sent long ago: the server's lease (``ack_wait``, from sending) ran on
        while it sat in the network. So until a later request is answered, or ``_BURST``
        after the first byte that follows the silence, a delivery is stamped as arrived
        when that request was issued (the earliest the server could have sent it):
        ``_take`` then drops it as stale, or its lease is that much shorter, and a late ack
        raises LeaseExpired instead of returning.
        """
        now = self._heard = asyncio.get_running_loop().time()
        if self._quiet_since is not None:
            if self._quiet_until == math.inf:
                self._quiet_until = now + _BURST
            elif now > self._quiet_until:
                self._quiet_since = None
        headers = msg.headers
        status = headers.get(_STATUS) if headers and not msg.data else None
        if status is None:
            try:
                reply = ack_reply(msg)
            except (nats.errors.Error, ValueError, IndexError):
                return  # not a JetStream delivery: nothing to settle, nothing to hand out
            slot = self._slot_of.get(reply.consumer, -1)
            pull = self._pulls[slot] if slot >= 0 else None
            if pull is not None:
                pull.remaining -= 1
                if pull.remaining <= 0:
                    self._pulls[slot] = None
            quiet = self._quiet_since
            self._buffer.append((now if quiet is None else min(now, quiet), msg, reply))
            self._arrived.set()
            return
        if status == _HEARTBEAT:
            return
        # 404 no messages, 408 request expired, 409 limits / consumer gone: the request is over
        token = msg.subject[len(self._inbox) + 1 :]
        slot_text, _, serial_text = token.partition(".")
        if slot_text.isdigit() and serial_text.isdigit():
            slot, serial = int(slot_text), int(serial_text)
            if serial > self._quiet_serial:
                self._quiet_since = None  # a request sent after the silence was answered
            pull = self._pulls[slot] if slot < len(self._pulls) else None
            if pull is not None and pull.serial == serial:
                self._pulls[slot] = None
                self._arrived.set()

    async def _issue(self, max_messages: int, wait: float) -> float:
        """Give every slot without a live request a new one; return the earliest expiry."""
        nc = self._link.client
        now = asyncio.get_running_loop().time()
        linger = min(max(wait, _LOOK), _MAX_PULL)
        expires_ns = int(linger * 1e9)
        earliest = now + linger
        for slot, pull in enumerate(self._pulls):
            if pull is not None and pull.expires_at + _EXPIRY_GRACE > now:
                earliest = min(earliest, pull.expires_at + _EXPIRY_GRACE)
                continue
            if pull is not None and self._heard < pull.expires_at:
                # expired unanswered, and nothing else heard since (a slow loop still
                # hears the other slots' statuses; a cut path hears nothing): see _on_msg
                if self._quiet_since is None:
                    self._quiet_since, self._quiet_until = pull.issued, math.inf
                self._quiet_serial = max(self._quiet_serial, pull.serial)
            batch = max(1, max_messages - len(self._buffer)) if slot == 0 else 1
            serial = next(self._serials)
            self._pulls[slot] = _Pull(serial, batch, now + linger, now)
            payload = json.dumps({"batch": batch, "expires": expires_ns}).encode()
            await nc.publish(
                self._next_subject[slot], payload, reply=f"{self._inbox}.{slot}.{serial}"
            )
        return earliest

    async def receive(self, max_messages: int, wait: float) -> list[Delivery[Lease]]:
        """receive -> hand out buffered deliveries, else pull every slot and wait for the first."""
        if self._closed:
            return []
        loop = asyncio.get_running_loop()
        self._strays.poke(loop.time())
        # wait <= 0: one short look, its end fixed once (every status that lands resets
        # nothing: with a pull per partition they land more often than a look lasts)
        end = loop.time() + (wait if wait > 0 else _LOOK)
        with self._on_receive:
            while True:
                out = await self._take(max_messages)
                if out:
                    return out
                now = loop.time()
                if now >= end:
                    return []
                self._arrived.clear()
                wake = await self._issue(max_messages, end - now)
                if self._buffer:
                    continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), max(min(end, wake) - now, 0.001))

    async def _take(self, max_messages: int) -> list[Delivery[Lease]]:
        """Up to ``max_messages`` buffered deliveries; stale ones go back, aged ones refreshed."""
        now = asyncio.get_running_loop().time()
        stale = self._settings.ack_timeout * _STALE_FRACTION
        lease = self._settings.ack_timeout
        taken: list[tuple[float, Msg, AckReply]] = []
        out: list[Delivery[Lease]] = []
        again: list[int] = []  # indexes of redeliveries: their attempt is in the book
        unseen: list[tuple[float, Msg]] = []
        while self._buffer and len(out) < max_messages:
            arrived, msg, reply = entry = self._buffer.popleft()
            if now - arrived > stale:
                unseen.append((arrived, msg))  # its server lease is nearly over
                continue
            taken.append(entry)
            refresh = now - arrived > _REFRESH_AFTER
            delivery = self._delivery(msg, reply, (now if refresh else arrived) + lease)
            if delivery.attempt > 1 and self._book is not None:
                again.append(len(out))
            out.append(delivery)
        try:
            if unseen:
                await self._give_back_unseen(unseen, now)
            for arrived, msg, _ in taken:
                if now - arrived > _REFRESH_AFTER:
                    await msg.in_progress()
            if again:
                await self._count(out, again)
        except BaseException:
            self._buffer.extendleft(reversed(taken))  # cancellation-safe: nothing taken
            raise
        return out

    async def _count(self, out: list[Delivery[Lease]], again: list[int]) -> None:
        """Redeliveries: attempt = their record + 2; the record + 1 is stored before they
        are handed out (a crash while the caller holds one still counts it)."""
        assert self._book is not None
        seqs = [int(out[i].id) for i in again]
        counts = await self._book.counts(seqs)
        for i, count in zip(again, counts, strict=True):
            out[i] = dataclasses.replace(out[i], attempt=count + 2)
        await self._book.record([(seq, c + 1) for seq, c in zip(seqs, counts, strict=True)])

    def _delivery(self, msg: Msg, reply: AckReply, deadline: float) -> Delivery[Lease]:
        user, fifo_group, msg_id, defect = decode_headers(msg.headers, msg.subject, self._layout)
        return Delivery(
            id=str(reply.stream_seq),
            body=msg.data,
            headers=user,
            fifo_group=fifo_group,
            dedup_id=None if self._dead_letters else msg_id,
            attempt=reply.num_delivered,
            receipt=new_lease(msg, deadline),
            extras={
                "stream": reply.stream,
                "consumer": reply.consumer,
                "stream_sequence": reply.stream_seq,
                "consumer_sequence": reply.consumer_seq,
                "num_pending": reply.num_pending,
            },
            defect=defect,
        )

    # -- settling -----------------------------------------------------------------------

    def _held(self, delivery: Delivery[Lease], verb: str) -> Msg:
        """The message, or LeaseExpired once the server's ack_wait has (nearly) run out."""
        if self._left(delivery) < _LEASE_MARGIN:
            raise LeaseExpired(
                f"cannot {verb} message {delivery.id!r}: its JetStream lease (ack_wait) ran out"
            )
        return delivery.receipt.msg

    def _settled(self, delivery: Delivery[Lease]) -> None:
        if self._renewed:
            self._renewed.pop(delivery.receipt, None)

    async def ack(self, delivery: Delivery[Lease]) -> None:
        """ack -> ``+ACK`` (pipelined; ``?confirm_acks=true`` waits for the server: ack_sync).

        Pipelined, it is sent at once only while the server sent this receiver something
        within ``_ACK_WINDOW``: an ack must not return unrecorded into a path that went
        silent (cut) longer ago than the coalescing window. Else a PING/PONG goes first,
        with nothing sent yet (none within ``request_timeout``: BrokerUnavailable, and the
        message may be redelivered), then the lease is checked again and the ``+ACK`` sent.
        """
        msg = self._held(delivery, "ack")
        if not self._confirm_acks and asyncio.get_running_loop().time() - self._heard > _ACK_WINDOW:
            await self.flush_acks()
            msg = self._held(delivery, "ack")
        with self._on_ack:
            if self._confirm_acks:
                await msg.ack_sync(timeout=self._request_timeout)
            else:
                await msg.ack()
        self._settled(delivery)

    async def flush_acks(self) -> None:
        """A PING/PONG: its PONG means the server read every ``+ACK`` sent before it."""
        with self._on_ack:
            await self._link.client.flush(timeout=max(1, int(self._request_timeout)))
        self._heard = asyncio.get_running_loop().time()

    async def nack(self, delivery: Delivery[Lease], delay: float) -> None:
        """nack -> ``-NAK {"delay": ns}``: stays pending (holds its partition) until redelivered.

        Not past the lease (no error): the server redelivers that message itself, maybe
        already has, and a ``-NAK`` for this older delivery would make it send the newer
        one again, to a second holder (``_left``)."""
        if self._left(delivery) > _LEASE_MARGIN:
            with self._on_nack:
                await self._nak(delivery.receipt.msg, delay)
        self._settled(delivery)

    def _left(self, delivery: Delivery[Lease]) -> float:
        """Seconds until the server's lease on this delivery ends (as this receiver knows it)."""
        lease = delivery.receipt
        deadline = self._renewed.get(lease, lease.deadline) if self._renewed else lease.deadline
        return deadline - asyncio.get_running_loop().time()

    async def _nak(self, msg: Msg, delay: float) -> None:
        """``-NAK``; before 2.10 not before this receiver's pull on that durable has ended.

        nats-server 2.9 hands a redelivery to the oldest waiting pull request; if
        that request's inbox is gone by then (this receiver closing), the server
        rolls the delivery back and loses its count. Delaying the NAK past our own
        outstanding request (<= its linger, about 1 s) keeps the redelivery away
        from it; ``aclose`` keeps the inbox until every request has ended.
        """
        if self._link.drain_pulls:
            slot = self._slot_of.get(ack_reply(msg).consumer, -1)
            pull = self._pulls[slot] if slot >= 0 else None
            if pull is not None:
                left = pull.expires_at + _EXPIRY_GRACE - asyncio.get_running_loop().time()
                delay = max(delay, left)
        if delay <= 0:
            self._naked_at = asyncio.get_running_loop().time()
        await msg.nak(delay=delay if delay > 0 else None)

    async def _give_back_unseen(self, unseen: Sequence[tuple[float, Msg]], now: float) -> None:
        """Give back what was sent here and handed to nobody, uncounted: a first delivery's
        record becomes -1 (JetStream counted the send), then ``-NAK``, except for what may
        be past its server lease (arrival stamps are the earliest it could have been sent),
        which the server redelivers itself (if it already did, the -1 may leave the count
        one low, as two holders writing one record do; never one high)."""
        live = [m for at, m in unseen if now - at < self._settings.ack_timeout - _NAK_MARGIN]
        with contextlib.suppress(*BEST_EFFORT):  # not given back: its lease runs out
            if self._book is not None:
                await self._book.uncount_first([m for _, m in unseen])
            for msg in live:
                await self._nak(msg, 0.0)

    async def release(self, deliveries: Sequence[Delivery[Lease]]) -> None:
        """release -> the record set to ``attempt - 2`` (the next delivery has the same
        attempt: JetStream counted one, the book takes it back), then ``-NAK`` each whose
        lease has more than ``_NAK_MARGIN`` left; the rest the server redelivers itself."""
        if self._book is not None and deliveries:
            with self._on_nack:
                await self._book.record([(int(d.id), d.attempt - 2) for d in deliveries])
        for delivery in deliveries:
            if self._left(delivery) > _NAK_MARGIN:
                await self.nack(delivery, 0.0)
            else:
                self._settled(delivery)

    async def extend(self, delivery: Delivery[Lease], ack_timeout: float) -> None:
        """extend -> ``+WPI`` (in_progress): the server restarts the durable's ack_wait."""
        msg = self._held(delivery, "extend")
        with self._on_extend:
            await msg.in_progress()
        renewed = self._renewed
        renewed[delivery.receipt] = asyncio.get_running_loop().time() + ack_timeout
        if len(renewed) > self._prune_at:  # renewals of deliveries whose lease ran out
            now = asyncio.get_running_loop().time()
            self._renewed = {k: v for k, v in renewed.items() if v > now}
            self._prune_at = max(_PRUNE_AT, 2 * len(self._renewed))

    async def dead_letter(
        self, delivery: Delivery[Lease], copy: Outgoing, publish: PublishCopy
    ) -> None:
        """dead_letter -> publish the copy to the DLQ stream and await its PubAck, then ``+TERM``.

        The seam's copy-then-ack, with two differences that make it safe to repeat: the
        lease is checked before copying, and the copy's Nats-Msg-Id is
        ``<group>:<stream seq>``: a crash (or a lost lease) between the two steps
        redelivers the original, and dead-lettering it again inside the dedup window
        stores no second copy. ``+TERM`` rather than ``+ACK`` tells the server (and its
        advisories) that the message was given up, not processed.
        """
        msg = self._held(delivery, "dead-letter")
        seq = ack_reply(msg).stream_seq
        await publish(dataclasses.replace(copy, dedup_id=f"{self._group}:{seq}"))
        with self._on_dead:
            await msg.term()
        self._settled(delivery)

    async def _await_pulls_ended(self) -> None:
        """Wait, keeping the inbox, until every outstanding pull request ended (its
        404/408 status, or expiry plus a grace); what they deliver lands in the buffer."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            ends = [p.expires_at + _EXPIRY_GRACE for p in self._pulls if p is not None]
            live = [end for end in ends if end > now]
            if not live:
                break
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), max(live) - now)
            except TimeoutError:
                break
        self._pulls = [None] * len(self._pulls)

    async def aclose(self) -> None:
        """Give back the buffer (``-NAK``), drain the inbox (UNSUB, a round trip), flush.

        A pull request outlives its ``receive``, and the server routes a ``-NAK``ed message
        on its own time: routed to our request after the UNSUB, it is dropped and waits out
        ``ack_wait``. So after an immediate ``-NAK`` the inbox stays until they ended."""
        if self._closed:
            return
        self._closed = True
        await self._strays.aclose()
        link = self._link
        link.receivers.discard(self)
        self._renewed.clear()
        nc = link.nc
        try:
            if nc is None or nc.is_closed:
                return
            loop = asyncio.get_running_loop()
            if self._buffer and not link.drain_pulls:  # what comes back lands in the buffer
                buffered, self._buffer = [(at, m) for at, m, _ in self._buffer], deque()
                await self._give_back_unseen(buffered, loop.time())
            if link.drain_pulls or self._naked_since_pulls_began():
                await self._await_pulls_ended()
            sub, self._sub = self._sub, None
            if sub is not None:
                await self._link.drain_inbox(sub, max(1.0, self._request_timeout))
            buffered, self._buffer = [(at, m) for at, m, _ in self._buffer], deque()
            await self._give_back_unseen(buffered, loop.time())
            await nc.flush(timeout=max(1, int(self._request_timeout)))
        except BEST_EFFORT:
            pass  # the server redelivers whatever it did not hear about after ack_wait
        finally:
            self._buffer.clear()

    def _naked_since_pulls_began(self) -> bool:
        """An immediate ``-NAK`` went out while a pull request of ours was outstanding."""
        issued = [p.issued for p in self._pulls if p is not None]
        return bool(issued) and self._naked_at >= min(issued)
