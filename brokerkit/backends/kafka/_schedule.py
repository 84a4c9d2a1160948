"""The hand-out schedule: which held records go out when, on the core's ``LeaseBook``.

One book per receiver holds the records of every owned partition that the window
admitted: ready, due later (a nack delay), or leased (a token and a deadline). The
receipt of a delivery is its lease token (an int, process-unique); a stale one is
refused. A take's tokens are consecutive, so a batch's receipts are a ``range``.

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
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter

from brokerkit.backends import LeaseBook, LeaseExpired
from brokerkit.backends.kafka._partition import Partition, Record

__all__ = ["Batch", "HandOut", "Receipt"]

Receipt = int
"""What a Kafka delivery carries to settle: the token of its lease (process-unique)."""
Batch = tuple[list[Record], Sequence[Receipt]]
"""Records handed out and their receipts, in the same order."""

_group_of = attrgetter("fifo_group")
_NONE: Batch = ([], ())


class HandOut:
    """The schedule of one receiver; see the module docstring. Event-loop side only."""

    __slots__ = ("_book", "_moved", "_on_moved", "lease", "staged")

    def __init__(self, ack_timeout: float, on_moved: Callable[[], None] = lambda: None) -> None:
        self._book: LeaseBook[Record] = LeaseBook()
        self.lease = ack_timeout
        self.staged: Batch = _NONE
        """Taken and counted, lease not started: the next receive's batch."""
        self._moved: list[Partition] = []
        self._on_moved = on_moved
        """Called when a settle may have moved a commit point and no ``apply_moved`` is
        pending (the receiver schedules one on the next loop iteration)."""

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

    def take(self, max_records: int, now: float) -> Batch:
        """Lease up to ``max_records`` due records for ``ack_timeout``; each is counted."""
        self.expire(now)
        return self._counted(self._book.take_keys(max_records, now, self.lease))

    def stage(self, max_records: int, now: float) -> bool:
        """Take and count the next batch now; its lease starts at ``hand_over``."""
        if self.staged[0]:
            return False
        self.expire(now)
        self.staged = self._counted(self._book.take_keys(max_records, now, math.inf))
        return bool(self.staged[0])

    def hand_over(self, max_records: int, now: float) -> Batch:
        """Start the lease of up to ``max_records`` staged records (those still held)."""
        records, tokens = self.staged
        if not records:
            return _NONE
        if len(records) > max_records:
            self.staged = (records[max_records:], tokens[max_records:])
            records, tokens = records[:max_records], tokens[:max_records]
        else:
            self.staged = _NONE
        live = self._book.extend_many(tokens, now + self.lease, now)
        if len(live) == len(tokens):
            return records, tokens
        key_of = self._book.key_of
        return [rec for t in live if (rec := key_of(t)) is not None], live

    def unstage(self, parts: Iterable[Partition] | None = None) -> list[Record]:
        """Give staged records back uncounted (all, or those of ``parts``); returns them."""
        records, tokens = self.staged
        if parts is None:
            back, self.staged = tokens, _NONE
        else:
            which = set(parts)
            keep = [i for i, rec in enumerate(records) if rec.part not in which]
            back = [t for rec, t in zip(records, tokens, strict=True) if rec.part in which]
            self.staged = ([records[i] for i in keep], [tokens[i] for i in keep])
        return self.give_back(back, time.monotonic())

    def give_back(self, tokens: Iterable[Receipt], now: float) -> list[Record]:
        """Records the caller never had (released, or their count commit failed): due now,
        uncounted. Those no longer held are skipped. Returns the ones given back."""
        book = self._book
        out: list[Record] = []
        for token in tokens:
            if not book.holds_token(token, now):
                continue
            rec = book.requeue_token(token, now, now)
            rec.count -= 1
            rec.due = 0.0
            self._park_if_revoking(rec, now)
            out.append(rec)
        return out

    def _counted(self, taken: tuple[list[Record], int]) -> Batch:
        records, first = taken
        for rec in records:
            rec.count += 1
            rec.due = 0.0
            part = rec.part
            if rec.offset > part.top:
                part.top = rec.offset
        return records, range(first, first + len(records))

    # -- settling -----------------------------------------------------------------------------

    def settle(self, token: Receipt, now: float) -> Record:
        """Ack or dead-letter: the record leaves (LeaseExpired if the lease was lost)."""
        rec = self._book.settle_token(token, now)
        part = rec.part
        if part.settle(rec):
            self._moved.append(part)
            if len(self._moved) == 1:
                self._on_moved()
        return rec

    def nack(self, token: Receipt, delay: float, now: float) -> Record:
        """Due again ``delay`` s from now; its group stays held by it."""
        rec = self._book.requeue_token(token, now + delay, now)
        rec.due = time.time() + delay
        self._park_if_revoking(rec, now)
        return rec

    def leased(self, token: Receipt, now: float) -> Record:
        """The record ``token`` leases (LeaseExpired if the lease was lost); changes nothing."""
        book = self._book
        rec = book.key_of(token) if book.holds_token(token, now) else None
        if rec is None:
            raise LeaseExpired(f"the lease on token {token} was lost")
        return rec

    def holds(self, token: Receipt, now: float) -> bool:
        """True while ``token`` is a live lease."""
        return self._book.holds_token(token, now)

    def extend(self, token: Receipt, ack_timeout: float, now: float) -> None:
        self._book.extend_token(token, now + ack_timeout, now)

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
        records, tokens = self.staged
        if gone and records:
            keep = [i for i, rec in enumerate(records) if not rec.part.gone]
            self.staged = ([records[i] for i in keep], [tokens[i] for i in keep])
