"""SqsReceiver: ReceiveMessage leases, the batch-of-one-group trap, settling by receipt handle.

* lease = the visibility timeout of the ReceiveMessage: ``ceil(ack_timeout + wait + 0.5)``
  whole seconds (SQS counts whole seconds; the wait and the margin cover the time between
  asking and being handed the message, so the caller always has its full ``ack_timeout``).
  Each receipt knows its own deadline (measured from *before* the request, so it is never
  later than SQS's): AWS silently "succeeds" on a stale receipt handle, so the receiver
  must know itself when a lease is gone and raise LeaseExpired.
* one ReceiveMessage can return several messages of one fifo group, all in flight. Only the
  first is handed out; the others wait here, in order, and the next is handed out (its
  lease renewed first) once the previous is acked or dead-lettered. A nack or a lost lease
  gives the waiting ones back too (visibility 0), so the group restarts at the nacked one.
* attempt = ApproximateReceiveCount minus the receives given back unseen (``_attempts``),
  plus, for a copy made by ``release`` (``_copies``), the attempts counted before it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from brokerkit.backends import (
    Delivery,
    LeaseExpired,
    QueueRef,
    Receiver,
    ReceiverSettings,
    ResourceClosed,
    UnsupportedFeature,
)
from brokerkit.backends.sqs import _attempts
from brokerkit.backends.sqs._acks import AckBatcher
from brokerkit.backends.sqs._codec import decode
from brokerkit.backends.sqs._copies import COPY_MARGIN, copy_back, copyable
from brokerkit.backends.sqs._link import Link, batches

__all__ = ["LEASE_MARGIN", "MAX_VISIBILITY", "Receipt", "SqsReceiver"]

_log = logging.getLogger(__name__)

LEASE_MARGIN = 0.5
"""Seconds added to every visibility timeout beyond ``ack_timeout`` (and the long poll)."""
MAX_VISIBILITY = 43_200
"""SQS: a message's visibility timeout ends at most 12 h after the receive that leased it."""
_ACK_MARGIN = 0.5
_SYSTEM = ["ApproximateReceiveCount", "MessageGroupId", "MessageDeduplicationId"]
_ATTRS = ["All"]  # brokerkit's own, and a foreign message's: its headers (``decode``)
_IDLE_POLL = 0.25
_APART = 2.0
"""Seconds after a handed-out suspect's lease that what this receiver holds comes back."""
_PRUNE_PUSHED = 256


class Receipt:
    """What settling one delivery needs: its receipt handle and the lease's deadline."""

    __slots__ = ("deadline", "group", "handle", "message_id", "received")

    def __init__(
        self, handle: str, deadline: float, group: str | None, message_id: str, received: float
    ) -> None:
        self.handle = handle
        self.deadline = deadline
        """Monotonic time the lease ends at the latest (never later than SQS's)."""
        self.group = group
        """The user's fifo group's SQS MessageGroupId (None: no user group)."""
        self.message_id = message_id
        self.received = received


class _Group:
    """A fifo group this receiver holds: the message handed out, then those behind it."""

    __slots__ = ("head", "waiting")

    def __init__(self, head: Delivery[Receipt]) -> None:
        self.head = head
        self.waiting: deque[Delivery[Receipt]] = deque()


def _visibility(seconds: float) -> int:
    return min(max(math.ceil(seconds), 0), MAX_VISIBILITY)


class SqsReceiver(Receiver[Receipt]):
    release_uncounted = True  # a copy (no fifo_group) or this process's _attempts record
    wants_handing_out = True  # a suspect redelivery: what this receiver holds comes back later

    def __init__(
        self,
        link: Link,
        queue_url: str,
        ref: QueueRef,
        settings: ReceiverSettings,
        *,
        max_wait: int,
        ack_flush_interval: float,
    ) -> None:
        self._link = link
        self._url = queue_url
        self._ref = ref
        self._lease = settings.ack_timeout
        self._max_wait = max_wait
        self._flush_interval = ack_flush_interval
        self._acks = AckBatcher(link, queue_url, ack_flush_interval)
        self._groups: dict[str, _Group] = {}
        self._ready: deque[Delivery[Receipt]] = deque()
        self._pushed: dict[str, float] = {}  # receipt handle -> held back until (handing_out)
        self._suspects: dict[str, float] = {}  # handed-out suspects -> what is held back until
        self._wake = asyncio.Event()
        self._closed = False
        self._orphans: set[asyncio.Task[None]] = set()

    # ---------------------------------------------------------------- receive
    async def receive(self, max_messages: int, wait: float) -> list[Delivery[Receipt]]:
        if self._closed:
            raise ResourceClosed(f"SQS receiver of {self._ref} is closed")
        now = time.monotonic()
        self._expire(now)
        if self._ready:
            return await self._hand_out_ready(max_messages)
        if self._acks.urgent:
            await self._acks.flush()  # a fifo group waits on that delete at SQS
        count = min(10, max_messages)
        if not self._groups:
            return await self._poll(count, min(int(wait), self._max_wait))
        # this receiver holds fifo groups: an ack here may free the next message of one at
        # any moment, so poll briefly instead of sitting in one long poll
        end = now + wait
        while True:
            out = await self._poll(count, 0)
            if out:
                return out
            if self._ready:
                return await self._hand_out_ready(max_messages)
            left = end - time.monotonic()
            if left <= 0 or self._closed:
                return []
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), min(left, _IDLE_POLL))
            except TimeoutError:
                continue
            if self._ready:
                return await self._hand_out_ready(max_messages)

    async def _poll(self, count: int, wait: int) -> list[Delivery[Receipt]]:
        visibility = _visibility(self._lease + wait + LEASE_MARGIN)
        started = time.monotonic()
        future = self._link.start(
            "receive_message",
            QueueUrl=self._url,
            MaxNumberOfMessages=count,
            WaitTimeSeconds=wait,
            VisibilityTimeout=visibility,
            MessageSystemAttributeNames=_SYSTEM,
            MessageAttributeNames=_ATTRS,
            # botocore's own retries resend the same id: SQS returns the same batch
            ReceiveRequestAttemptId=uuid.uuid4().hex,
        )
        try:
            with self._link.errors:
                reply = await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(self._orphaned)
            raise
        messages = reply.get("Messages")
        if not messages:
            return []
        out = self._accept(messages, started, started + visibility)
        until = max(self._suspects.values(), default=0.0)
        if until > started + visibility:  # received while a suspect is out: held back too
            now = time.monotonic()
            hold = {m["ReceiptHandle"]: _visibility(until - now) for m in messages}
            self._pushed.update(dict.fromkeys(hold, until))
            try:
                await self._set_visibility(hold, "hold back")
            except asyncio.CancelledError:  # not handed out: given back (and their groups)
                for key in {d.receipt.group for d in out if d.receipt.group is not None}:
                    self._groups.pop(key, None)
                self._orphaned(future)
                raise
        return out

    def _accept(
        self, messages: list[dict[str, Any]], received: float, deadline: float
    ) -> list[Delivery[Receipt]]:
        out: list[Delivery[Receipt]] = []
        fresh: set[str] = set()
        url = self._url
        for raw in messages:
            decoded = decode(raw)
            message_id = raw["MessageId"]
            count = int(raw.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
            key = decoded.group_key if decoded.fifo_group is not None else None
            receipt = Receipt(raw["ReceiptHandle"], deadline, key, message_id, received)
            delivery = Delivery(
                id=decoded.copy_of or message_id,
                body=decoded.body,
                headers=decoded.headers,
                fifo_group=decoded.fifo_group,
                dedup_id=decoded.dedup_id,
                attempt=decoded.prior + _attempts.attempt_of(url, message_id, count),
                receipt=receipt,
                defect=decoded.defect,
            )
            if key is None:
                out.append(delivery)
                continue
            group = self._groups.get(key)
            if group is not None and key not in fresh:
                # SQS handed out this group again: what we held of it is stale (leases gone)
                self._drop_group(key)
                group = None
            if group is None:
                self._groups[key] = _Group(delivery)
                fresh.add(key)
                out.append(delivery)
            else:
                group.waiting.append(delivery)  # behind its batch's head: held back here
        return out

    def _orphaned(self, future: asyncio.Future[Any]) -> None:
        """A cancelled receive's reply arrived after all: give its messages back."""
        if future.cancelled() or future.exception() is not None:
            return
        messages = future.result().get("Messages") or []
        handles = [(m["MessageId"], m["ReceiptHandle"]) for m in messages]
        if handles:
            task = asyncio.ensure_future(self._give_back(handles))
            self._orphans.add(task)
            task.add_done_callback(self._orphans.discard)

    def _expire(self, now: float) -> None:
        for key, group in list(self._groups.items()):
            if group.head.receipt.deadline < now:
                self._drop_group(key)

    def _drop_group(self, key: str) -> None:
        group = self._groups.pop(key, None)
        if group is None:
            return
        for delivery in group.waiting:
            _attempts.count_unseen(self._url, delivery.receipt.message_id)
        if group.head in self._ready:
            self._ready.remove(group.head)
            _attempts.count_unseen(self._url, group.head.receipt.message_id)

    async def _hand_out_ready(self, max_messages: int) -> list[Delivery[Receipt]]:
        """Hand out promoted followers, their leases renewed first (they waited here)."""
        batch: list[Delivery[Receipt]] = []
        while self._ready and len(batch) < min(max_messages, 10):
            batch.append(self._ready.popleft())
        visibility = _visibility(self._lease + LEASE_MARGIN)
        started = time.monotonic()
        entries = [
            {"Id": str(i), "ReceiptHandle": d.receipt.handle, "VisibilityTimeout": visibility}
            for i, d in enumerate(batch)
        ]
        reply = await self._link.call(
            "change_message_visibility_batch", QueueUrl=self._url, Entries=entries
        )
        failed = {int(f["Id"]) for f in reply.get("Failed") or ()}
        out = []
        for i, delivery in enumerate(batch):
            key = delivery.receipt.group
            if i in failed:
                if key is not None:
                    self._drop_group(key)  # its lease ran out while waiting: SQS redelivers
                continue
            delivery.receipt.deadline = started + visibility
            out.append(delivery)
        return out

    # ----------------------------------------------------------------- settle
    def _check(self, delivery: Delivery[Receipt]) -> Receipt:
        receipt = delivery.receipt
        if time.monotonic() > receipt.deadline:
            self._lost(delivery)
            raise LeaseExpired(
                f"the SQS lease on message {delivery.id!r} ran out; it may be redelivered"
            )
        return receipt

    def _lost(self, delivery: Delivery[Receipt]) -> None:
        self._suspects.pop(delivery.receipt.handle, None)
        key = delivery.receipt.group
        if key is not None:
            group = self._groups.get(key)
            if group is not None and group.head is delivery:
                self._drop_group(key)

    def _advance(self, delivery: Delivery[Receipt]) -> None:
        """``delivery`` was acked or dead-lettered: its group's next message may go out."""
        key = delivery.receipt.group
        if key is None:
            return
        group = self._groups.get(key)
        if group is None or group.head is not delivery:
            return
        if group.waiting:
            group.head = group.waiting.popleft()
            self._ready.append(group.head)
            self._wake.set()
        else:
            del self._groups[key]

    def check_lease(self, delivery: Delivery[Receipt]) -> None:
        self._check(delivery)

    async def ack(self, delivery: Delivery[Receipt]) -> None:
        receipt = self._check(delivery)
        if time.monotonic() + self._flush_interval + _ACK_MARGIN > receipt.deadline:
            # too close to the lease's end to coalesce: delete now, and know it landed
            await self._link.call(
                "delete_message", QueueUrl=self._url, ReceiptHandle=receipt.handle
            )
            if time.monotonic() > receipt.deadline:
                self._lost(delivery)
                raise LeaseExpired(
                    f"the SQS lease on message {delivery.id!r} ended during its delete; "
                    "it may be delivered again"
                )
        else:
            self._acks.add(receipt.handle, urgent=receipt.group is not None)
        self._suspects.pop(receipt.handle, None)
        _attempts.forget(self._url, delivery.receipt.message_id)
        self._advance(delivery)

    async def nack(self, delivery: Delivery[Receipt], delay: float) -> None:
        receipt = self._check(delivery)
        visibility = math.ceil(delay)
        held = time.monotonic() - receipt.received
        if visibility + held > MAX_VISIBILITY:
            raise UnsupportedFeature(
                f"SQS keeps a message invisible at most 12 h after the receive that leased "
                f"it; message {delivery.id!r} was received {held:.0f}s ago, so a nack may "
                f"delay it at most {max(MAX_VISIBILITY - held, 0):.0f}s"
            )
        _attempts.note_nacked(self._url, receipt.message_id)
        self._suspects.pop(receipt.handle, None)
        key = receipt.group
        if key is not None:
            group = self._groups.get(key)
            if group is not None and group.head is delivery:
                del self._groups[key]
                # the ones behind it go back first; the group then restarts at this one
                waiting = group.waiting
                await self._give_back((d.receipt.message_id, d.receipt.handle) for d in waiting)
        await self._link.call(
            "change_message_visibility",
            QueueUrl=self._url,
            ReceiptHandle=receipt.handle,
            VisibilityTimeout=visibility,
        )

    async def extend(self, delivery: Delivery[Receipt], ack_timeout: float) -> None:
        receipt = self._check(delivery)
        visibility = _visibility(ack_timeout + LEASE_MARGIN)
        started = time.monotonic()
        await self._link.call(
            "change_message_visibility",
            QueueUrl=self._url,
            ReceiptHandle=receipt.handle,
            VisibilityTimeout=visibility,
        )
        receipt.deadline = started + visibility

    async def release(self, deliveries: Sequence[Delivery[Receipt]]) -> None:
        """Give back deliveries the caller never saw (and whatever waits behind them).

        One without a fifo_group is copied back (``_copies``: the correction of its
        count survives this process). One of a fifo group with time left on its lease
        is kept and handed out again by the next ``receive`` (lease renewed): given back,
        another process would receive it and SQS would count that receive (two last
        attempts fetched together: the one not handed out alone went to the DLQ). The
        rest get visibility 0 (corrected in this process only)."""
        now = time.monotonic()
        back: list[Delivery[Receipt]] = []
        copies: list[Delivery[Receipt]] = []
        for delivery in deliveries:
            if delivery.receipt.deadline <= now:
                continue
            if copyable(delivery, now):
                copies.append(delivery)
                continue
            key = delivery.receipt.group
            group = self._groups.get(key) if key is not None else None
            if group is not None and group.head is delivery and key is not None:
                if delivery.receipt.deadline - now > COPY_MARGIN and not self._closed:
                    self._ready.append(delivery)  # counted no more; aclose gives it back
                    continue
                del self._groups[key]
                back += group.waiting
            back.append(delivery)
        if copies:
            back += await copy_back(self._link, self._url, copies)
        await self._give_back((d.receipt.message_id, d.receipt.handle) for d in back)

    async def handing_out(
        self, delivery: Delivery[Receipt], unseen: Sequence[Delivery[Receipt]]
    ) -> None:
        """A redelivery goes to the caller. Unless this process nacked it, it may be the
        message that killed its last consumer: SQS counted every message that consumer
        held unseen, and they came back at the same moment, in the same batches, to be
        counted again by the next crash (a copy-back corrects only a message without a
        fifo_group). So what is held unseen (fetched ahead, followers held here) is made
        to come back ``_APART`` s after its lease: SQS visibility only (their leases stay
        as they were). A crash now counts them once. One held back so, when its own turn
        comes as a redelivery, gets its own lease's visibility again (its redelivery
        after a crash must not come later than declared)."""
        receipt = delivery.receipt
        now = time.monotonic()
        pushed = self._pushed
        visibility: dict[str, int] = {}
        if pushed.pop(receipt.handle, 0.0) > now:  # held back for another: its own lease again
            visibility[receipt.handle] = _visibility(receipt.deadline - now)
        if not _attempts.nacked_here(self._url, receipt.message_id):
            until = receipt.deadline + _APART
            self._suspects[receipt.handle] = until
            held = [*unseen, *self._ready]
            held += [d for group in self._groups.values() for d in group.waiting]
            for d in held:
                handle = d.receipt.handle
                if now < d.receipt.deadline < until and handle != receipt.handle:
                    visibility[handle] = _visibility(until - now)
                    pushed[handle] = until
        if len(pushed) > _PRUNE_PUSHED:
            self._pushed = {h: t for h, t in pushed.items() if t > now}
        self._suspects = {h: t for h, t in self._suspects.items() if t > now}
        await self._set_visibility(visibility, "hold back")

    async def _set_visibility(self, visibility: dict[str, int], what: str) -> None:
        """``ChangeMessageVisibilityBatch``: receipt handle -> seconds; failures logged
        (the messages then come back when their leases end)."""
        for chunk in batches(list(visibility.items())):
            entries = [
                {"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": seconds}
                for i, (handle, seconds) in enumerate(chunk)
            ]
            try:
                await self._link.call(
                    "change_message_visibility_batch", QueueUrl=self._url, Entries=entries
                )
            except Exception as exc:
                _log.warning("SQS could not %s %d messages: %s", what, len(chunk), exc)

    async def _give_back(self, messages: Iterable[tuple[str, str]]) -> None:
        """Visibility 0 for messages the caller never saw; their receive is not counted."""
        for chunk in batches(list(messages)):
            await self._set_visibility({handle: 0 for _, handle in chunk}, "give back")
            for message_id, _ in chunk:
                _attempts.count_unseen(self._url, message_id)

    async def flush_acks(self) -> None:
        """Send the batched deletes now and wait for every delete in flight."""
        await self._acks.flush()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        try:
            await self._acks.flush()
        finally:
            held = [d for g in self._groups.values() for d in g.waiting]
            held += [d for d in self._ready if d not in held]
            self._groups.clear()
            self._ready.clear()
            self._pushed.clear()
            self._suspects.clear()
            await self._give_back((d.receipt.message_id, d.receipt.handle) for d in held)
