"""The hand-out schedule: which held records go out when, on the core's ``LeaseBook``.

One book per receiver holds the records of every owned partition that the window
admitted: ready, due later (a nack delay), or leased (a token and a deadline). The
receipt of a delivery is its ``Leased`` (record + token); a stale one is refused.

Kafka adds three things around the book:

* the delivery count: a take counts each record (``count + 1``), a give-back before
  the caller saw it (``release``, an unstaged or unrecorded hand-out) uncounts it;
* staging: a take with no deadline (``stage``) whose lease starts when a receive hands
  it over (``hand_over``); the receiver commits the counts meanwhile;
* partitions that go away: a revoked partition's records stop going out (the
  handed-out ones are waited for), a lost or dropped one's leases end at once.

Times: ``now`` is ``time.monotonic()``; a record's ``due`` is wall-clock (it is
committed in the metadata), converted here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from operator import attrgetter

from brokerkit.backends import LeaseBook, Leased
from brokerkit.backends.kafka._partition import Partition, Record

__all__ = ["HandOut", "Receipt"]

Receipt = Leased[Record]
"""What a Kafka delivery carries to settle: the record and the token of its lease."""

_group_of = attrgetter("fifo_group")


class HandOut:
    """The schedule of one receiver; see the module docstring. Event-loop side only."""

    __slots__ = ("_book", "_moved", "lease", "staged")

    def __init__(self, ack_timeout: float) -> None:
        self._book: LeaseBook[Record] = LeaseBook()
        self.lease = ack_timeout
        self.staged: list[Receipt] = []
        """Taken and counted, lease not started: the next receive's batch."""
        self._moved: list[Partition] = []

    def __len__(self) -> int:
        return len(self._book)

    # -- records in and out -----------------------------------------------------------------

    def add(self, records: Sequence[Record], now: float) -> None:
        """Records the window admitted (offset order per partition): due now or at their
        own (restored) due time."""
        if not records:
            return
        book = self._book
        if any(rec.due for rec in records):
            skew = time.time() - now
            for rec in records:
                book.add(rec, rec.fifo_group, now, rec.due - skew if rec.due else None)
        else:
            book.add_many(zip(records, map(_group_of, records), strict=True), now)

    def take(self, max_records: int, now: float) -> list[Receipt]:
        """Lease up to ``max_records`` due records for ``ack_timeout``; each is counted."""
        self.expire(now)
        return self._counted(self._book.take(max_records, now, self.lease))

    def stage(self, max_records: int, now: float) -> bool:
        """Take and count the next batch now; its lease starts at ``hand_over``."""
        if self.staged:
            return False
        self.expire(now)
        self.staged = self._counted(self._book.take(max_records, now, math.inf))
        return bool(self.staged)

    def hand_over(self, max_records: int, now: float) -> list[Receipt]:
        """Start the lease of up to ``max_records`` staged records (those still held)."""
        staged = self.staged
        if not staged:
            return []
        if len(staged) > max_records:
            staged, self.staged = staged[:max_records], staged[max_records:]
        else:
            self.staged = []
        return self._book.extend_many(staged, now + self.lease, now)

    def unstage(self, parts: Iterable[Partition] | None = None) -> list[Record]:
        """Give staged records back uncounted (all, or those of ``parts``); returns them."""
        if parts is None:
            back, self.staged = self.staged, []
        else:
            which = set(parts)
            back = [r for r in self.staged if r.key.part in which]
            self.staged = [r for r in self.staged if r.key.part not in which]
        return self.give_back(back, time.monotonic())

    def give_back(self, receipts: Iterable[Receipt], now: float) -> list[Record]:
        """Records the caller never had (released, or their count commit failed): due now,
        uncounted. Those no longer held are skipped. Returns the ones given back."""
        book = self._book
        out: list[Record] = []
        for receipt in receipts:
            rec = receipt.key
            if not book.holds(rec, receipt.token, now):
                continue
            rec.count -= 1
            rec.due = 0.0
            book.requeue(rec, receipt.token, now, now)
            self._park_if_revoking(rec, now)
            out.append(rec)
        return out

    def _counted(self, leases: list[Receipt]) -> list[Receipt]:
        for lease in leases:
            rec = lease.key
            rec.count += 1
            rec.due = 0.0
            part = rec.part
            if rec.offset > part.top:
                part.top = rec.offset
        return leases

    # -- settling -----------------------------------------------------------------------------

    def settle(self, receipt: Receipt, now: float) -> bool:
        """Ack or dead-letter: the record leaves (LeaseExpired if the lease was lost).

        True when its partition's commit point may have moved and nothing is pending
        for ``apply_moved`` yet (the caller schedules one call).
        """
        rec = receipt.key
        self._book.settle(rec, receipt.token, now)
        part = rec.part
        if part.settle(rec):
            self._moved.append(part)
            return len(self._moved) == 1
        return False

    def nack(self, receipt: Receipt, delay: float, now: float) -> Record:
        """Due again ``delay`` s from now; its group stays held by it."""
        rec = receipt.key
        self._book.requeue(rec, receipt.token, now + delay, now)
        rec.due = time.time() + delay
        self._park_if_revoking(rec, now)
        return rec

    def holds(self, receipt: Receipt, now: float) -> bool:
        """True while ``receipt`` is the live lease of its record."""
        return self._book.holds(receipt.key, receipt.token, now)

    def extend(self, receipt: Receipt, ack_timeout: float, now: float) -> None:
        self._book.extend(receipt.key, receipt.token, now + ack_timeout, now)

    def expire(self, now: float) -> None:
        """End the leases past their deadline: due again, unless their partition is going."""
        book = self._book
        for rec in book.reclaim(now):
            part = rec.part
            if part.revoking or part.gone:
                book.remove(rec, now=now)

    def _park_if_revoking(self, rec: Record, now: float) -> None:
        if rec.part.revoking or rec.part.gone:
            self._book.remove(rec, now=now)  # stays in the partition's state (committed)

    def next_wake(self) -> float | None:
        """The monotonic time something is due next (a record or a lease's end)."""
        return self._book.next_wake()

    # -- the window and partitions --------------------------------------------------------

    def apply_moved(self, now: float) -> list[Partition]:
        """Let in the records that moved commit points brought into the window; returns
        the partitions whose fetching may resume now."""
        moved = self._moved
        if not moved:
            return []
        self._moved = []
        resume: list[Partition] = []
        for part in moved:
            part.moved = False
            if part.gone:
                continue
            if part.beyond and not part.revoking:
                self.add(part.admit(), now)
            if part.may_resume():
                resume.append(part)
        return resume

    def admit(self, part: Partition, records: Sequence[Record], now: float) -> None:
        """Records ``Partition.read`` returned, and any ``beyond`` the window reaches now."""
        if part.revoking:
            return
        self.add(records, now)
        if part.beyond:
            self.add(part.admit(), now)

    def revoke(self, parts: Sequence[Partition]) -> list[Record]:
        """Stop handing out ``parts``: staged records go back uncounted (returned), held
        but not leased ones leave the book (they stay in the partitions' state)."""
        for part in parts:
            part.revoking = True
        back = self.unstage(parts)
        book, now = self._book, time.monotonic()
        for part in parts:
            for rec in list(part.records.values()):
                if rec in book and not book.leased(rec):
                    book.remove(rec, now=now)
        return back

    def leased_in(self, part: Partition) -> bool:
        """True while a record of ``part`` is leased."""
        book = self._book
        return any(book.leased(rec) for rec in part.records.values())

    def drop(self, parts: Iterable[Partition]) -> None:
        """The partitions are gone: their records leave the book, leases and all."""
        book = self._book
        gone = False
        now = time.monotonic()
        for part in parts:
            part.gone = gone = True
            for rec in part.records.values():
                book.remove(rec, now=now)
        if gone and self.staged:
            self.staged = [r for r in self.staged if not r.key.part.gone]
