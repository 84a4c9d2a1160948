"""KafkaReceiver: the receiver verbs, per-message settling on cumulative offset commits.

The receiver owns the state of each partition it was assigned (``Partition``), the
hand-out schedule (``HandOut``, on the core's LeaseBook) and a ``ConsumerThread`` (the
one thread that calls the Consumer); what the thread consumes and learns arrives here
through the ``Sink`` methods (``records``, ``assigned``, ``revoke``, ``lost``).

* receive -> due records go out; within a partition, different fifo_groups (and
  records without one) go out concurrently, one record per group at a time. Before a
  record is handed out its new delivery count is committed (synchronous commit with
  the partition's state in the commit metadata), so ``attempt`` is durable. A receive
  that returns a full batch stages the next one (taken and counted now, leased when
  the next receive hands it over), so that commit overlaps the caller's work.
* ack -> the record is settled in memory; the partition's commit offset moves to the
  lowest unsettled offset and the settled offsets above it go into the metadata; an
  asynchronous commit follows within ``ack_flush_interval``. Only while the group
  coordinator confirmed a commit within ``_FRESH`` s: otherwise (an idle or slow
  stream, or a broker that stopped answering) the ack commits synchronously and
  returns only once the commit is recorded, else raises BrokerUnavailable (or
  LeaseExpired when the partition moved), so an ack that returns while the broker is
  unreachable is never counted as done. A failed asynchronous commit is sent again.
* nack(delay) -> the record stays in memory, due ``delay`` s later; its group stays
  blocked (it is the group's head), other groups flow; the due time is committed in
  the metadata so a new owner honours it.
* lease -> a deadline per handed-out record; past it the record is due again
  (attempt + 1 at the next hand-out) and a late settle raises LeaseExpired.
* dead_letter -> the seam's copy-then-settle: the copy is published to the DLQ topic
  (delivery report awaited), then the original is acked.
* rebalance -> on revoke the thread waits (bounded) until the partition's handed-out
  records are settled or their leases ran out, then commits the state; the new owner
  reads the committed offset and metadata and replays the partition from there (plus
  the dedup window before it, to rebuild the dedup memory). A synchronous ack cannot
  use the thread then (it sits in the revoke that waits for that very ack): the record
  is settled in memory, which ends the wait, and the ack returns once the revoke's final
  commit recorded it (LeaseExpired if it did not). A synchronous ack already waiting for
  its own commit when the revoke starts is taken over the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from asyncio import FIRST_COMPLETED
from collections.abc import Sequence
from itertools import groupby
from operator import methodcaller
from typing import Any

from brokerkit.backends import (
    BrokerUnavailable,
    Delivery,
    HostPort,
    LeaseExpired,
    QueueRef,
    Receiver,
    ReceiverSettings,
)
from brokerkit.backends.kafka._deliveries import deliveries
from brokerkit.backends.kafka._handover import Handover
from brokerkit.backends.kafka._link import KafkaLink
from brokerkit.backends.kafka._partition import Key, Partition, Snapshot
from brokerkit.backends.kafka._schedule import Batch, HandOut, Receipt
from brokerkit.backends.kafka._thread import REVOKE_WAIT, Assigned, ConsumerThread

__all__ = ["FLUSH_DELAY", "KafkaReceiver"]

LOG = logging.getLogger(__name__)

FLUSH_DELAY = 0.05
"""Acks are coalesced this long before the commit (capabilities.ack_flush_interval = 0.1)."""

_FRESH = 0.075
"""An ack is coalesced only if a commit was confirmed this recently (s): then it returns
at most ``ack_flush_interval`` (0.1) after the broker was last heard from, with room
for the consumer thread's delay in serving the confirmation."""
_ACK_WAIT = 10.0
"""Longest a synchronous ack waits for its commit (the retry budget of the toolkit)."""
_RECOMMIT_PAUSE = 0.05
"""Pause before a synchronous ack commits again after the group refused the commit."""

_partition_of = methodcaller("partition")


class KafkaReceiver(Receiver[Receipt]):
    """One consumer of a topic in one Kafka consumer group; see the module docstring."""

    release_uncounted = True
    """``release`` gives the records back with their count lowered again (committed by
    the next flush), so the core may release what it fetched ahead of a last attempt."""

    def __init__(
        self, link: KafkaLink, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> None:
        self._link = link
        self._topic = link.topic(queue)
        self._group_id = link.group_id(queue, group)
        self._loop = asyncio.get_running_loop()
        self._dedup_window = link.options.dedup_window
        self._parts: dict[int, Partition] = {}
        self._schedule = HandOut(settings.ack_timeout, self._moved_soon)
        self._wake = asyncio.Event()
        self._flush_handle: asyncio.TimerHandle | None = None
        self._staging: asyncio.Future[None] | None = None
        self._closed = False
        self._contact = 0.0
        """When a commit was last confirmed (monotonic; written by the consumer thread too)."""
        self._handover = Handover(self._loop, self._schedule.settle)
        config = link.consumer_config(self._group_id)
        config["on_commit"] = self._on_commit
        self._thread = ConsumerThread(
            config,
            self._topic,
            name=f"brokerkit-kafka-{self._group_id}",
            dedup_window=None if queue.dead_letters else self._dedup_window,
            loop=self._loop,
            sink=self,
            errors=link.errors,
        )

    def __repr__(self) -> str:
        return f"<KafkaReceiver topic={self._topic!r} group={self._group_id!r}>"

    async def start(self) -> None:
        """Start the consumer thread (it joins the group)."""
        await self._thread.start()

    # ================================================================ what the thread posts

    def assigned(self, parts: list[Assigned]) -> None:
        for key, commit, start, meta in parts:
            old = self._parts.pop(key[1], None)
            if old is not None:
                self._schedule.drop([old])
            self._parts[key[1]] = Partition(key[0], key[1], commit, start, meta, self._dedup_window)
            self._thread.backlog[key] = (0, 0)
        self._wake.set()

    def records(self, msgs: list[Any]) -> None:
        """Consumed records (runs of one partition): held, and admitted to the schedule."""
        parts, schedule = self._parts, self._schedule
        now = time.monotonic()
        touched = False
        for p, run in groupby(msgs, _partition_of):
            part = parts.get(p)
            if part is None or part.gone:
                continue
            schedule.admit(part, part.read(run), now)
            self._update_backlog(part)
            part.dirty = True  # the flush updates the backlog again as records settle
            touched = True
        if touched:
            self._schedule_flush()
            self._wake.set()

    async def revoke(self, keys: list[Key]) -> list[Snapshot]:
        parts = [p for k in keys if (p := self._parts.get(k[1])) is not None]
        self._handover.begin(parts)
        for rec in self._schedule.revoke(parts):
            rec.part.dirty = True
        deadline = time.monotonic() + REVOKE_WAIT
        schedule = self._schedule
        while any(schedule.leased_in(p) for p in parts) and time.monotonic() < deadline:
            schedule.expire(time.monotonic())
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), 0.05)
            except TimeoutError:
                pass
        snaps = [p.snapshot() for p in parts]
        self._drop(parts)
        return snaps

    def revoked(self, keys: list[Key], committed: set[Key]) -> None:
        self._handover.ended(keys, committed)

    def lost(self, keys: list[Key]) -> None:
        self._handover.ended(keys, set())
        self._drop([p for k in keys if (p := self._parts.get(k[1])) is not None])

    def _drop(self, parts: list[Partition]) -> None:
        self._schedule.drop(parts)
        for part in parts:
            if self._parts.get(part.partition) is part:
                del self._parts[part.partition]
                self._thread.backlog.pop(part.key, None)
        self._wake.set()

    # ================================================================ receive

    async def receive(self, max_messages: int, wait: float) -> list[Delivery[Receipt]]:
        """Hand out due records; commit their new delivery counts first (durable attempt)."""
        end = time.monotonic() + wait
        if self._staging is not None:
            await asyncio.shield(self._staging)  # cancelled: the staged records stay staged
        schedule = self._schedule
        while True:
            now = time.monotonic()
            delivered = schedule.hand_over(max_messages, now)
            if not delivered:
                self._apply_moved()
                taken = schedule.take(max_messages, now)
                if taken:
                    delivered = await self._persist(taken)
            if delivered:
                # never behind a redelivery: it may be a poison that kills this process,
                # and the staged records' counts are committed already (a crash would
                # count an attempt for each of them that no handler ever saw); a plain
                # record handed out is always a first delivery
                if len(delivered) == max_messages and all(r.count == 1 for r in delivered.records):
                    self._stage_next(max_messages)
                return deliveries(delivered)
            now = time.monotonic()
            if now >= end:
                return []
            self._wake.clear()
            wake = schedule.next_wake()
            timeout = end - now if wake is None else min(end, wake) - now
            try:
                await asyncio.wait_for(self._wake.wait(), max(timeout, 0.001))
            except TimeoutError:
                pass

    def _stage_next(self, max_messages: int) -> None:
        """Busy: take the next batch now and commit its counts while the caller works.

        Staged records are counted and hold their fifo_group, but their lease starts
        only when a receive hands them over; close and revocation give them back
        uncounted. (A crash meanwhile over-counts them by one, as for any crash
        between the count commit and the hand-out.)
        """
        if self._closed or self._staging is not None:
            return
        self._apply_moved()
        if self._schedule.stage(max_messages, time.monotonic()):
            self._staging = asyncio.ensure_future(self._stage(self._schedule.staged))

    async def _stage(self, taken: Batch) -> None:
        try:
            await self._persist(taken)  # a failure gives the records back
        finally:
            self._staging = None

    async def _persist(self, taken: Batch) -> Batch:
        """Commit the counts of ``taken``; returns those recorded (the rest go back)."""
        parts = taken.parts()
        started = time.monotonic()
        ok = await self._thread.commit([part.snapshot() for part in parts])
        now = time.monotonic()
        if ok:
            self._contact = now
        # a take is given back meanwhile only by a revoke or by its lease running out
        check = now - started >= self._schedule.lease or any(p.revoking for p in parts)
        schedule = self._schedule
        # (a part stays dirty: acks made while this commit was in flight are not in it)
        if not check and len(ok) == len(parts) and not any(p.gone for p in parts):
            return taken  # the common case: every count recorded, every lease live
        if check:
            schedule.expire(now)  # a run's records whose lease ran out leave it (skipped)
        delivered = Batch([], [])
        tokens: list[Receipt] = []
        failed: list[Receipt] = []
        for rec, token in zip(taken.records, taken.tokens, strict=True):
            part = rec.part
            if part.gone or (check and not schedule.holds(token, now)):
                continue
            if part.key in ok:
                delivered.records.append(rec)
                tokens.append(token)
            else:
                failed.append(token)
        delivered.tokens = tokens
        for run in taken.runs:  # a record of a run that is no longer held is skipped later
            part = run.seg.part
            if part.gone:
                continue
            if part.key in ok:
                delivered.runs.append(run)
            else:
                failed.extend(run.tokens())
        if failed:
            # not recorded: give them back uncounted and try again later
            if schedule.give_back(failed, now) and not delivered:
                await asyncio.sleep(0.1)
        return delivered

    # ================================================================ settling

    def check_lease(self, delivery: Delivery[Receipt]) -> None:
        self._schedule.leased(delivery.receipt, time.monotonic())  # else LeaseExpired

    async def ack(self, delivery: Delivery[Receipt]) -> None:
        """ack -> settled in memory; the commit follows within ack_flush_interval, or is
        awaited when the broker was not heard from lately (see the module docstring)."""
        now = time.monotonic()
        if now - self._contact > _FRESH:
            await self._ack_now(delivery, now)
            return
        try:
            part = self._schedule.settle(delivery.receipt, now)
        except LeaseExpired:
            raise LeaseExpired(f"the lease on message {delivery.id!r} was lost") from None
        self._mark_dirty(part)

    async def _ack_now(self, delivery: Delivery[Receipt], now: float) -> None:
        """Commit the partition's state with the record settled; settle it in memory only
        once that is recorded, else raise (and it stays leased: it comes back)."""
        try:
            part, rec = self._schedule.leased(delivery.receipt, now)
        except LeaseExpired:
            raise LeaseExpired(f"the lease on message {delivery.id!r} was lost") from None
        final = self._handover.final(part.key)
        if part.revoking and final is not None:  # the thread waits in the revoke for this
            self._schedule.settle(delivery.receipt, now)  # leased: cannot raise
            self._wake.set()
            await Handover.recorded(delivery.id, final, _ACK_WAIT)
            return
        end = time.monotonic() + _ACK_WAIT
        ok: set[Key] | None = None
        with self._handover.acking(part, delivery.receipt, now) as taken:
            # a revoke may begin in any pause (it settles the record and takes this ack
            # over), and a record whose lease ran out may be settled by its next holder
            while not taken.done() and part.unsettled(rec):
                commit = asyncio.ensure_future(self._thread.commit([part.snapshot_settling(rec)]))
                left = end - time.monotonic()
                await asyncio.wait((commit, taken), timeout=left, return_when=FIRST_COMPLETED)
                ok = commit.result() if commit.done() else None
                commit.cancel()
                if taken.done() or ok is None or part.key in ok or part.gone or self._closed:
                    break
                # refused: a rebalance is in progress (REBALANCE_IN_PROGRESS, then
                # ILLEGAL_GENERATION until the member rejoined); try again within the budget
                left = end - time.monotonic()
                if left <= 0:
                    break
                await asyncio.wait((taken,), timeout=min(_RECOMMIT_PAUSE, left))
        if taken.done():  # a revoke began and settled the record: its final commit counts
            await Handover.recorded(delivery.id, taken.result(), _ACK_WAIT)
            return
        # the next flush follows with the true state (a commit still on its way, or one
        # recorded for a record that went out again meanwhile, is overwritten)
        self._mark_dirty(part)
        if ok and part.key in ok:
            self._contact = time.monotonic()
            try:
                # ``now``: a lease that ran out while the commit was on its way still
                # counts, unless the record went out again meanwhile (then it is lost)
                self._schedule.settle(delivery.receipt, now)
            except LeaseExpired:
                raise LeaseExpired(f"the lease on message {delivery.id!r} was lost") from None
            return
        if part.gone or part.revoking:
            raise LeaseExpired(
                f"message {delivery.id!r}: its partition moved before the ack was recorded"
            )
        if not part.unsettled(rec):
            raise LeaseExpired(f"the lease on message {delivery.id!r} was lost")
        raise self._not_recorded(f"the ack of message {delivery.id!r}", ok is None)

    def _not_recorded(self, what: str, unanswered: bool) -> BrokerUnavailable:
        first = self._link.hosts[0] if self._link.hosts else HostPort("localhost", 9092)
        reason = f"no answer within {_ACK_WAIT:g} s" if unanswered else "the commit failed"
        where = ", ".join(str(h) for h in self._link.hosts) or str(first)
        return BrokerUnavailable(
            f"kafka: {what} was not recorded ({reason}; {where})", host=first.host, port=first.port
        )

    async def flush_acks(self) -> None:
        """Commit the state of every partition held now, synchronously: an asynchronous
        commit of the acks so far may still be on its way, or not yet sent."""
        if self._closed:
            return
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        parts = [p for p in self._parts.values() if not p.gone and not p.revoking]
        snaps = self._snapshots(parts)
        if not snaps:
            return
        commit = asyncio.ensure_future(self._thread.commit(snaps))
        await asyncio.wait([commit], timeout=_ACK_WAIT)
        ok = commit.result() if commit.done() else None
        commit.cancel()
        failed = [p for p in parts if not p.gone and not p.revoking and p.key not in (ok or ())]
        if failed:
            for part in failed:
                self._mark_dirty(part)  # the next flush tries again
            raise self._not_recorded("a commit of the acks so far", ok is None)
        self._contact = time.monotonic()

    def _on_commit(self, err: Any, partitions: list[Any]) -> None:
        """librdkafka's result of an asynchronous commit (on the consumer thread)."""
        failed = [
            (tp.topic, tp.partition) for tp in partitions if err is not None or tp.error is not None
        ]
        if err is None and not failed:
            self._contact = time.monotonic()
            return
        LOG.debug("kafka commit failed (%s): %d partitions, sent again", err, len(failed))
        try:
            self._loop.call_soon_threadsafe(self._commit_failed, failed)
        except RuntimeError:  # the event loop is gone
            pass

    def _commit_failed(self, keys: list[Key]) -> None:
        for _, p in keys:
            part = self._parts.get(p)
            if part is not None and not part.gone:
                self._mark_dirty(part)  # the next flush carries the state again

    async def nack(self, delivery: Delivery[Receipt], delay: float) -> None:
        """nack -> held in memory until due; the group stays blocked; due time committed."""
        try:
            part = self._schedule.nack(delivery.receipt, delay, time.monotonic())
        except LeaseExpired:
            raise LeaseExpired(f"the lease on message {delivery.id!r} was lost") from None
        self._mark_dirty(part)

    async def release(self, deliveries: Sequence[Delivery[Receipt]]) -> None:
        """Give back unseen deliveries without counting the attempt."""
        back = self._schedule.give_back([d.receipt for d in deliveries], time.monotonic())
        for rec in back:
            self._mark_dirty(rec.part)

    async def extend(self, delivery: Delivery[Receipt], ack_timeout: float) -> None:
        try:
            self._schedule.extend(delivery.receipt, ack_timeout, time.monotonic())
        except LeaseExpired:
            raise LeaseExpired(f"the lease on message {delivery.id!r} was lost") from None

    def _moved_soon(self) -> None:
        self._loop.call_soon(self._apply_moved)

    def _apply_moved(self) -> None:
        """Moved commit points bring records into the window; tell the thread when a
        partition's fetching may resume. A run of in-order acks moves the commit point on
        every ack: this runs once per run, before the next take or on the next loop
        iteration, whichever comes first."""
        resume = self._schedule.apply_moved(time.monotonic())
        if resume:
            for part in resume:
                self._update_backlog(part)
            self._thread.kick.set()

    def _update_backlog(self, part: Partition) -> None:
        self._thread.backlog[part.key] = part.backlog()

    def _mark_dirty(self, part: Partition) -> None:
        part.dirty = True
        self._schedule_flush()
        self._wake.set()

    def _schedule_flush(self) -> None:
        if self._flush_handle is None and not self._closed:
            self._flush_handle = self._loop.call_later(FLUSH_DELAY, self._flush)

    def _flush(self) -> None:
        """Commit the state of every changed partition (asynchronous commit)."""
        self._flush_handle = None
        parts = [p for p in self._parts.values() if p.dirty and not p.gone and not p.revoking]
        snaps = self._snapshots(parts)
        if snaps:
            self._thread.commit_soon(snaps)

    def _snapshots(self, parts: list[Partition]) -> list[Snapshot]:
        """A snapshot of each partition, each then marked clean."""
        snaps = []
        for part in parts:
            snaps.append(part.snapshot())
            part.dirty = False  # after: a snapshot that raised leaves it to the next flush
            self._update_backlog(part)
        return snaps

    async def aclose(self) -> None:
        """Commit the final state, leave the group (close()), stop the thread."""
        if self._closed:
            return
        self._closed = True
        if self._staging is not None:
            await asyncio.wait([self._staging], timeout=30.0)
        for rec in self._schedule.unstage():
            rec.part.dirty = True
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        snaps = [p.snapshot() for p in self._parts.values() if not p.gone]
        if snaps and not self._thread.finished.done():
            await self._thread.commit(snaps)
        self._thread.stop()
        try:
            await asyncio.wait_for(asyncio.wrap_future(self._thread.finished), 60.0)
        except TimeoutError:
            LOG.warning("kafka consumer thread did not stop in time")
        self._drop(list(self._parts.values()))
        self._handover.end_all()
        self._link.receivers.discard(self)
