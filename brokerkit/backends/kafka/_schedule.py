"""The hand-out schedule: which held records go out when, on the core's ``LeaseBook``.

One book per receiver holds the ``Record``s of every owned partition that the window
admitted: ready, due later (a nack delay), or leased (a token and a deadline). Plain
records (``_segments.py``: no fifo_group, no dedup id, never handed out) are not in the
book: a take leases consecutive ones of a segment as one ``Run`` (one token block, one
deadline), after the book's due records. The receipt of a delivery is its lease token
(an int, process-unique); a stale one is refused. A take's book tokens are
consecutive, so its receipts are a ``range``; a run's are a ``range`` of its own.

Kafka adds three things around the book:

* the delivery count: a take counts each record (``count + 1``; a plain record handed
  out has count 1), a give-back before the caller saw it (``release``, an unstaged or
  unrecorded hand-out) uncounts it;
* staging: a take with no deadline (``stage``) whose lease starts when a receive hands
  it over (``hand_over``); the receiver commits the counts meanwhile;
* partitions that go away: a revoked partition's records stop going out (the
  handed-out ones are waited for), a lost or dropped one's leases end at once.

A plain record whose lease ends other than by a settle (nack, expiry, give-back)
becomes a ``Record`` in the book (``Partition.convert``).

Times: ``now`` is ``time.monotonic()``; a record's ``due`` is wall-clock (it is
committed in the metadata), converted here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import attrgetter

from brokerkit.backends import LeaseBook, LeaseExpired
from brokerkit.backends.kafka._partition import WINDOW, Partition, Record
from brokerkit.backends.kafka._segments import RUN_BITS, RUN_MASK, RUN_TOKENS, Run, RunBook, Segment

__all__ = ["Batch", "HandOut", "Receipt"]

Receipt = int
"""What a Kafka delivery carries to settle: the token of its lease (process-unique)."""

_group_of = attrgetter("fifo_group")


class Batch:
    """Records handed out (with their receipts, in the same order) and runs of plain ones."""

    __slots__ = ("records", "runs", "tokens")

    def __init__(
        self,
        records: list[Record] | None = None,
        tokens: Sequence[Receipt] = (),
        runs: list[Run] | None = None,
    ) -> None:
        self.records: list[Record] = records if records is not None else []
        self.tokens = tokens
        self.runs: list[Run] = runs if runs is not None else []

    def __len__(self) -> int:
        return len(self.records) + sum(run.hi - run.lo for run in self.runs)

    def __bool__(self) -> bool:
        return bool(self.records) or bool(self.runs)

    def parts(self) -> set[Partition]:
        parts = {rec.part for rec in self.records}
        parts.update(run.seg.part for run in self.runs)
        return parts

    def receipts(self) -> Iterator[Receipt]:
        yield from self.tokens
        for run in self.runs:
            yield from run.tokens()

    def offsets(self) -> list[int]:
        """Every record's offset, in hand-out order (for tests and logs)."""
        return [offset for _, offset, _, _ in self.entries()]

    def entries(self) -> list[tuple[Partition, int, int, Receipt]]:
        """``(partition, offset, count, receipt)`` of every record still in the batch, in
        hand-out order (a plain record's count is 1)."""
        out = [
            (rec.part, rec.offset, rec.count, token)
            for rec, token in zip(self.records, self.tokens, strict=True)
        ]
        for run in self.runs:
            seg = run.seg
            origin = run.origin
            out.extend(
                (seg.part, seg.first + i, 1, origin - i)
                for i in range(run.lo, run.hi)
                if seg.state[i] == 0
            )
        return out

    def __repr__(self) -> str:
        return f"<Batch {len(self)} records, {len(self.runs)} runs>"


class HandOut:
    """The schedule of one receiver; see the module docstring. Event-loop side only."""

    __slots__ = ("_book", "_moved", "_on_moved", "_plain", "_runs", "lease", "staged")

    def __init__(self, ack_timeout: float, on_moved: Callable[[], None] = lambda: None) -> None:
        self._book: LeaseBook[Record] = LeaseBook()
        self._runs = RunBook()
        self._plain: dict[Partition, None] = {}
        """Partitions with plain records not handed out yet (an ordered set, rotated)."""
        self.lease = ack_timeout
        self.staged = Batch()
        """Taken and counted, lease not started: the next receive's batch."""
        self._moved: list[Partition] = []
        self._on_moved = on_moved
        """Called when a settle may have moved a commit point and no ``apply_moved`` is
        pending (the receiver schedules one on the next loop iteration)."""

    def __len__(self) -> int:
        return len(self._book) + len(self._runs)

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
        return self._take(max_records, now, now + self.lease)

    def stage(self, max_records: int, now: float) -> bool:
        """Take and count the next batch now; its lease starts at ``hand_over``."""
        if self.staged:
            return False
        self.expire(now)
        self.staged = self._take(max_records, now, math.inf)
        return bool(self.staged)

    def _take(self, max_records: int, now: float, deadline: float) -> Batch:
        records, first = self._book.take_keys(max_records, now, deadline - now)
        for rec in records:
            rec.count += 1
            rec.due = 0.0
            part = rec.part
            if rec.offset > part.top:
                part.top = rec.offset
        runs = self._take_plain(max_records - len(records), deadline)
        return Batch(records, range(first, first + len(records)), runs)

    def _take_plain(self, left: int, deadline: float) -> list[Run]:
        """Runs of plain records below each partition's window, partitions in turn."""
        runs: list[Run] = []
        plain = self._plain
        if left <= 0 or not plain:
            return runs
        open_run = self._runs.open
        for part in list(plain):
            fresh = part.fresh
            if part.revoking or part.gone or not fresh:
                del plain[part]
                continue
            limit = part.commit_point() + WINDOW
            while left and fresh:
                seg = fresh[0]
                lo = seg.taken
                size = len(seg.msgs)
                hi = min(size, lo + left, limit - seg.first)
                if hi <= lo:
                    break
                runs.append(open_run(seg, lo, hi, deadline))
                seg.taken = hi
                left -= hi - lo
                if hi == size:
                    fresh.popleft()
                top = seg.first + hi - 1
                if top > part.top:
                    part.top = top
            del plain[part]
            if fresh:
                plain[part] = None  # to the end: the other partitions come first next time
            if not left:
                break
        return runs

    def hand_over(self, max_records: int, now: float) -> Batch:
        """Start the lease of up to ``max_records`` staged records (those still held)."""
        staged = self.staged
        if not staged:
            return staged
        batch, self.staged = self._split(staged, max_records)
        deadline = now + self.lease
        records, tokens = batch.records, batch.tokens
        if records:
            live = self._book.extend_many(tokens, deadline, now)
            if len(live) != len(tokens):
                key_of = self._book.key_of
                records = [rec for t in live if (rec := key_of(t)) is not None]
                tokens = live
        runs = [run for run in batch.runs if run.ident in self._runs.runs]
        for run in runs:
            self._runs.start(run, deadline)
        return Batch(records, tokens, runs)

    def _split(self, batch: Batch, n: int) -> tuple[Batch, Batch]:
        """The first ``n`` records of a staged batch, and the rest (a run may be cut)."""
        if len(batch) <= n:
            return batch, Batch()
        records, tokens = batch.records, batch.tokens
        if len(records) >= n:
            return (
                Batch(records[:n], tokens[:n]),
                Batch(records[n:], tokens[n:], batch.runs),
            )
        n -= len(records)
        head: list[Run] = []
        tail: list[Run] = []
        for run in batch.runs:
            if n >= len(run):
                head.append(run)
                n -= len(run)
            elif n > 0:
                cut = run.lo + n
                rest = self._runs.open(run.seg, cut, run.hi, math.inf)
                rest.out = run.seg.state.count(0, cut, run.hi)
                run.hi = cut
                run.out = run.seg.state.count(0, run.lo, cut)
                if not run.out:
                    self._runs.drop(run)
                head.append(run)
                tail.append(rest)
                n = 0
            else:
                tail.append(run)
        return Batch(records, tokens, head), Batch(runs=tail)

    def unstage(self, parts: Iterable[Partition] | None = None) -> list[Record]:
        """Give staged records back uncounted (all, or those of ``parts``); returns them."""
        staged = self.staged
        if parts is None:
            back, self.staged = staged, Batch()
        else:
            which = set(parts)
            keep = [i for i, rec in enumerate(staged.records) if rec.part not in which]
            back = Batch(
                [rec for rec in staged.records if rec.part in which],
                [
                    t
                    for rec, t in zip(staged.records, staged.tokens, strict=True)
                    if rec.part in which
                ],
                [run for run in staged.runs if run.seg.part in which],
            )
            self.staged = Batch(
                [staged.records[i] for i in keep],
                [staged.tokens[i] for i in keep],
                [run for run in staged.runs if run.seg.part not in which],
            )
        return self.give_back(back.receipts(), time.monotonic())

    def give_back(self, tokens: Iterable[Receipt], now: float) -> list[Record]:
        """Records the caller never had (released, or their count commit failed): due now,
        uncounted. Those no longer held are skipped. Returns the ones given back."""
        book = self._book
        out: list[Record] = []
        for token in tokens:
            if token < RUN_TOKENS:
                found = self._runs.find(token, now)
                if found is None:
                    continue
                rec = self._convert(*found, 0, 0.0)
                if rec.part.revoking or rec.part.gone:
                    out.append(rec)  # stays in the partition's state
                    continue
                book.add(rec, None, now)
                out.append(rec)
                continue
            if not book.holds_token(token, now):
                continue
            rec = book.requeue_token(token, now, now)
            rec.count -= 1
            rec.due = 0.0
            self._park_if_revoking(rec, now)
            out.append(rec)
        return out

    def _convert(self, run: Run, index: int, count: int, due: float) -> Record:
        """Record ``index`` of ``run`` leaves it: a ``Record`` of its partition from now on."""
        seg = run.seg
        rec: Record = seg.part.convert(seg, index, count, due)
        self._runs.done_one(run)
        return rec

    # -- settling -----------------------------------------------------------------------------

    def settle(self, token: Receipt, now: float) -> Partition:
        """Ack or dead-letter: the record leaves (LeaseExpired if the lease was lost).
        Returns its partition."""
        if token < RUN_TOKENS:  # the common case, inlined: RunBook.find and done_one
            runs = self._runs.runs
            bits = ~token
            run = runs.get(bits >> RUN_BITS)
            index = -1 if run is None else run.lo + (bits & RUN_MASK)
            if (
                run is None
                or index >= run.hi
                or run.seg.state[index]
                or (run.deadline if run.extended is None else run.deadline_of(index)) < now
            ):
                raise LeaseExpired(f"the lease on token {token} was lost")
            run.out -= 1
            if not run.out:
                del runs[run.ident]
            part: Partition = run.seg.part
            moved = part.settle_plain(run.seg, index)
        else:
            rec = self._book.settle_token(token, now)
            part = rec.part
            moved = part.settle(rec)
        if moved:
            self._moved.append(part)
            if len(self._moved) == 1:
                self._on_moved()
        return part

    def nack(self, token: Receipt, delay: float, now: float) -> Partition:
        """Due again ``delay`` s from now; its group stays held by it."""
        if token < RUN_TOKENS:
            found = self._runs.find(token, now)
            if found is None:
                raise LeaseExpired(f"the lease on token {token} was lost")
            rec = self._convert(*found, 1, time.time() + delay)
            if not (rec.part.revoking or rec.part.gone):
                self._book.add(rec, None, now, now + delay)
            return rec.part
        rec = self._book.requeue_token(token, now + delay, now)
        rec.due = time.time() + delay
        self._park_if_revoking(rec, now)
        return rec.part

    def leased(self, token: Receipt, now: float) -> tuple[Partition, Record | tuple[Segment, int]]:
        """The partition and record ``token`` leases (LeaseExpired if the lease was lost);
        changes nothing. A plain record is named by its segment and index."""
        if token < RUN_TOKENS:
            found = self._runs.find(token, now)
            if found is None:
                raise LeaseExpired(f"the lease on token {token} was lost")
            seg = found[0].seg
            return seg.part, (seg, found[1])
        book = self._book
        rec = book.key_of(token) if book.holds_token(token, now) else None
        if rec is None:
            raise LeaseExpired(f"the lease on token {token} was lost")
        return rec.part, rec

    def holds(self, token: Receipt, now: float) -> bool:
        """True while ``token`` is a live lease."""
        if token < RUN_TOKENS:
            return self._runs.find(token, now) is not None
        return self._book.holds_token(token, now)

    def extend(self, token: Receipt, ack_timeout: float, now: float) -> None:
        if token < RUN_TOKENS:
            found = self._runs.find(token, now)
            if found is None:
                raise LeaseExpired(f"the lease on token {token} was lost")
            self._runs.extend(*found, now + ack_timeout)
            return
        self._book.extend_token(token, now + ack_timeout, now)

    def expire(self, now: float) -> None:
        """End the leases past their deadline: due again, unless their partition is going."""
        book = self._book
        for rec in book.reclaim(now):
            part = rec.part
            if part.revoking or part.gone:
                book.remove(rec, now=now)
        for run, index in self._runs.due(now):
            rec = self._convert(run, index, 1, 0.0)
            if not (rec.part.revoking or rec.part.gone):
                book.add(rec, None, now)

    def _park_if_revoking(self, rec: Record, now: float) -> None:
        if rec.part.revoking or rec.part.gone:
            self._book.remove(rec, now=now)  # stays in the partition's state (committed)

    def next_wake(self) -> float | None:
        """The monotonic time something is due next (a record or a lease's end)."""
        for part in self._plain:
            fresh = part.fresh
            if fresh and not part.revoking and not part.gone:
                seg = fresh[0]
                if seg.first + seg.taken < part.commit_point() + WINDOW:
                    return -math.inf
        times = [t for t in (self._book.next_wake(), self._runs.next_deadline()) if t is not None]
        return min(times) if times else None

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
        """Records ``Partition.read`` returned, and any ``beyond`` the window reaches now;
        the partition's plain records are taken from its ``fresh`` segments."""
        if part.revoking:
            return
        self.add(records, now)
        if part.beyond:
            self.add(part.admit(), now)
        if part.fresh and part not in self._plain:
            self._plain[part] = None

    def revoke(self, parts: Sequence[Partition]) -> list[Record]:
        """Stop handing out ``parts``: staged records go back uncounted (returned), held
        but not leased ones leave the book (they stay in the partitions' state)."""
        for part in parts:
            part.revoking = True
            self._plain.pop(part, None)
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
        if any(run.seg.part is part for run in self._runs.runs.values()):
            return True
        return any(book.leased(rec) for rec in part.records.values())

    def drop(self, parts: Iterable[Partition]) -> None:
        """The partitions are gone: their records leave the book, leases and all."""
        book = self._book
        gone: set[Partition] = set()
        now = time.monotonic()
        for part in parts:
            part.gone = True
            gone.add(part)
            self._plain.pop(part, None)
            for rec in part.records.values():
                book.remove(rec, now=now)
        if not gone:
            return
        for run in self._runs.of(gone):
            self._runs.drop(run)
        staged = self.staged
        if staged:
            keep = [i for i, rec in enumerate(staged.records) if not rec.part.gone]
            self.staged = Batch(
                [staged.records[i] for i in keep],
                [staged.tokens[i] for i in keep],
                [run for run in staged.runs if not run.seg.part.gone],
            )
