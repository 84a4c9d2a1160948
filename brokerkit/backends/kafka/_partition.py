"""The state of one owned partition: its held records, commit point, window and metadata.

Pure bookkeeping (no Kafka client, no clock but the records' own timestamps and the
wall clock for nack due times), so it is tested without a broker.

* ``read`` takes a run of consumed records of this partition: it skips what is settled
  already (below the commit point; a duplicate dedup id; ``s`` in the restored
  metadata). Plain records (no fifo_group, no dedup id, no restored state) go into
  ``Segment``s of consecutive offsets (``_segments.py``: no object per record); the
  others become ``Record``s with their restored delivery count and due time, and
  ``read`` returns those that may go out now;
* records are handed out only below commit point + ``WINDOW`` (this bounds the commit
  metadata); ``Record``s read beyond it wait in ``beyond`` in offset order, and ``admit``
  lets them in as the commit point moves (plain ones are taken from ``fresh``, each
  take checking the window);
* ``settle`` forgets a record, ``settle_plain`` marks a plain one settled, ``convert``
  turns a plain one into a ``Record``; ``commit_point`` is the lowest unsettled offset;
  ``snapshot`` is the commit (offset + metadata) describing everything above it;
* ``backlog`` is what flow control reads: offsets and bytes held above the commit point.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from brokerkit.backends import NO_HEADERS, DedupWindow
from brokerkit.backends.kafka._codec import TOMBSTONE, decode_headers
from brokerkit.backends.kafka._offsets import SETTLED, decode_metadata, encode_runs, state_text
from brokerkit.backends.kafka._segments import CONVERTED, OPEN, SETTLED_PLAIN, Segment, spans

__all__ = [
    "PAUSE_BYTES",
    "PAUSE_SPAN",
    "RESUME_BYTES",
    "RESUME_SPAN",
    "WINDOW",
    "Key",
    "Partition",
    "Record",
    "Snapshot",
]

WINDOW = 200
"""Records are handed out only below commit point + WINDOW (bounds the commit metadata)."""
PAUSE_SPAN, RESUME_SPAN = 4000, 2000
"""Fetching of a partition pauses when this many offsets are held above its commit point."""
PAUSE_BYTES, RESUME_BYTES = 16 << 20, 8 << 20
SEGMENT_MAX = 1000
"""Most records of one segment (a consume batch is at most 500)."""

Key = tuple[str, int]
"""(topic, partition)"""
Snapshot = tuple[str, int, int, str]
"""topic, partition, commit offset, metadata"""


@dataclass(slots=True, eq=False, repr=False)
class Record:
    """One consumed record not settled yet."""

    part: Partition
    offset: int
    body: bytes
    headers: Mapping[str, str]
    fifo_group: str | None
    dedup_id: str | None
    timestamp: int
    count: int = 0
    """Deliveries so far (the attempt of the current/last hand-out)."""
    due: float = 0.0
    """Wall-clock time before which it is not handed out again (0: now)."""
    defect: str | None = None
    """What makes it corrupt (``_codec``): the facade dead-letters it."""

    def __repr__(self) -> str:  # never the body
        return f"<Record {self.part.partition}-{self.offset}>"


class Partition:
    """One owned partition: see the module docstring."""

    __slots__ = (
        "_now_ms",
        "beyond",
        "commit_from",
        "dedup",
        "dirty",
        "extras",
        "fresh",
        "gone",
        "held_bytes",
        "key",
        "low",
        "moved",
        "next_offset",
        "partition",
        "records",
        "restored",
        "revoking",
        "segs",
        "span",
        "top",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        commit: int,
        start: int,
        metadata: str | None,
        dedup_window: float,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.key: Key = (topic, partition)
        self.commit_from = commit
        """The committed offset at assignment: everything below was settled."""
        self.next_offset = start
        """The offset after the last record read (reading starts a dedup window early)."""
        self.restored = {o: s for o, s in decode_metadata(commit, metadata).items() if o >= commit}
        """The committed states of offsets not read back yet."""
        self._now_ms = 0
        self.dedup = DedupWindow(dedup_window * 1000.0, clock=self._clock)
        """Dedup ids judged by record timestamps: every owner of the partition reads the
        same log in the same order, so every owner reaches the same verdicts."""
        self.records: dict[int, Record] = {}
        """Unsettled records read that are not plain (or no longer: converted), in offset
        order of reading."""
        self.segs: deque[Segment] = deque()
        """Plain records read, in offset order (dropped once the commit point passed)."""
        self.fresh: deque[Segment] = deque()
        """The segments with records not handed out yet, in offset order."""
        self.beyond: deque[Record] = deque()
        """Records read beyond the hand-out window, in offset order."""
        self.held_bytes = 0
        self.revoking = False
        self.gone = False
        self.dirty = False
        """Changed since the last commit."""
        self.moved = False
        """Its commit point may have moved since the window was last checked."""
        self.low = commit
        """No unsettled record below this offset (walks up as records settle)."""
        self.top = -1
        """Highest offset whose state the metadata must carry (handed out, restored, skipped)."""
        self.span = 0
        """Offsets held above the commit point at the last backlog update (flow control)."""
        self.extras: dict[str, Any] = {"topic": topic, "partition": partition}
        """The delivery extras every record of this partition shares (offset, timestamp added)."""

    def __repr__(self) -> str:
        return f"<Partition {self.topic}[{self.partition}] commit={self.commit_point()}>"

    def _clock(self) -> float:
        return self._now_ms

    def read(self, msgs: Iterable[Any]) -> list[Record]:
        """Take consumed records of this partition (confluent-kafka ``Message``s, offset
        order); return the new non-plain ones that may be handed out now, in offset order
        (plain ones join a segment: ``fresh``)."""
        out: list[Record] = []
        records, restored, beyond = self.records, self.restored, self.beyond
        limit = -1 if beyond else self.commit_point() + WINDOW  # keep offset order
        next_offset, commit_from = self.next_offset, self.commit_from
        segs = self.segs
        seg = segs[-1] if segs else None
        if seg is not None and (
            seg.end != next_offset or not self.fresh or self.fresh[-1] is not seg
        ):
            seg = None  # a gap, or all handed out: the next plain record starts a new one
        seg_end = -1 if seg is None else next_offset
        held = 0
        for msg in msgs:
            offset = msg.offset()
            if offset < next_offset:
                continue
            next_offset = offset + 1
            raw = msg.headers()
            headers: Mapping[str, str] = NO_HEADERS
            group = dedup = defect = None
            if raw:
                headers, group, dedup, defect = decode_headers(raw, msg.key)
            state = None
            if dedup is not None:
                self._now_ms = msg.timestamp()[1]
                duplicate = self.dedup.claim(dedup, "") is not None
                if offset < commit_from:
                    continue  # read only to rebuild the dedup memory
                if duplicate:
                    if offset > self.top:
                        self.top = offset
                    seg = None
                    continue  # settled without delivery
            elif offset < commit_from:
                continue
            if restored:
                state = restored.pop(offset, None)
                if state is not None:
                    if offset > self.top:
                        self.top = offset
                    if state.count == SETTLED:
                        seg = None
                        continue
            value = msg.value()
            if value is None:  # a tombstone: a Record, so that it carries its defect
                defect = defect or TOMBSTONE
            if group is None and dedup is None and state is None and defect is None:
                body = value
                size = len(body)
                if offset != seg_end or seg is None or len(seg.msgs) >= SEGMENT_MAX:
                    seg = Segment(self, offset)
                    segs.append(seg)
                    self.fresh.append(seg)
                seg.msgs.append(msg)
                seg.state.append(OPEN)
                seg.size += size
                seg_end = offset + 1
                if headers:
                    if seg.heads is None:
                        seg.heads = [NO_HEADERS] * (len(seg.msgs) - 1)
                    seg.heads.append(headers)
                elif seg.heads is not None:
                    seg.heads.append(NO_HEADERS)
                held += size
                continue
            seg = None
            body = value or b""
            rec = Record(self, offset, body, headers, group, dedup, msg.timestamp()[1])
            rec.defect = defect
            records[offset] = rec
            held += len(body)
            if state is not None:
                rec.count = state.count
                rec.due = state.due_ms / 1000.0
            if offset < limit:
                out.append(rec)
            else:
                limit = -1  # the rest of this run waits too
                beyond.append(rec)
        self.next_offset = next_offset
        self.held_bytes += held
        return out

    def admit(self) -> list[Record]:
        """The records ``beyond`` that the window reaches now, in offset order."""
        beyond = self.beyond
        if not beyond:
            return []
        limit = self.commit_point() + WINDOW
        records = self.records
        out: list[Record] = []
        while beyond and beyond[0].offset < limit:
            rec = beyond.popleft()
            if records.get(rec.offset) is rec:
                out.append(rec)
        return out

    def settle(self, rec: Record) -> bool:
        """Forget a settled record; True when the commit point may have moved (it was the
        lowest held), the first time since ``moved`` was last cleared."""
        del self.records[rec.offset]
        self.held_bytes -= len(rec.body)
        self.dirty = True
        if rec.offset <= self.low and not self.moved:
            self.moved = True
            return True
        return False

    def settle_plain(self, seg: Segment, index: int) -> bool:
        """``settle`` for record ``index`` of ``seg`` (leased: its state byte is OPEN)."""
        seg.state[index] = SETTLED_PLAIN
        self.dirty = True
        if seg.first + index <= self.low and not self.moved:
            self.moved = True
            return True
        return False

    def convert(self, seg: Segment, index: int, count: int, due: float) -> Record:
        """Record ``index`` of ``seg`` leaves the range: a ``Record`` from now on."""
        msg = seg.msgs[index]
        body = msg.value() or b""
        seg.size -= len(body)
        heads = seg.heads
        headers = heads[index] if heads is not None else NO_HEADERS
        rec = Record(self, seg.first + index, body, headers, None, None, msg.timestamp()[1])
        rec.count, rec.due = count, due
        seg.state[index] = CONVERTED
        self.records[rec.offset] = rec
        return rec

    def unsettled(self, rec: Record | tuple[Segment, int]) -> bool:
        """True while ``rec`` (a record, or a segment's index) is held as it was handed
        out: not settled, and a plain one not turned into a ``Record`` since."""
        if isinstance(rec, Record):
            return self.records.get(rec.offset) is rec
        seg, index = rec
        return seg.state[index] == OPEN

    def snapshot_settling(self, rec: Record | tuple[Segment, int]) -> Snapshot:
        """The snapshot as it will be once ``rec`` (``unsettled``: a record, or a
        segment's index) is settled; nothing changes here."""
        low = self.low
        if isinstance(rec, Record):
            del self.records[rec.offset]
            try:
                return self.snapshot()
            finally:
                self.records[rec.offset] = rec
                self.low = low
        seg, index = rec
        was = seg.state[index]
        seg.state[index] = SETTLED_PLAIN
        segs, held = list(self.segs), self.held_bytes
        try:
            return self.snapshot()
        finally:
            seg.state[index] = was
            self.low, self.held_bytes = low, held
            if len(segs) != len(self.segs):
                self.segs.clear()
                self.segs.extend(segs)

    def commit_point(self) -> int:
        """The lowest unsettled offset (amortised O(1): ``low`` only moves up)."""
        low, end, records, segs = self.low, self.next_offset, self.records, self.segs
        while low < end:
            while segs and segs[0].end <= low:  # passed: all of it settled
                self.held_bytes -= segs.popleft().size
            seg = segs[0] if segs else None
            if seg is None or low < seg.first:
                if low in records:
                    break
                low += 1
                continue
            state, first = seg.state, seg.first
            i = low - first
            j = state.find(OPEN, i)
            k = state.find(CONVERTED, i, j if j >= 0 else len(state))
            if k >= 0:
                if first + k in records:
                    low = first + k
                    break
                state[k] = SETTLED_PLAIN  # the converted record was settled since
                low = first + k + 1
                continue
            if j >= 0:
                low = first + j
                break
            low = seg.end
        while segs and segs[0].end <= low:
            self.held_bytes -= segs.popleft().size
        self.low = low
        return low if low < end else max(end, self.commit_from)

    def backlog(self) -> tuple[int, int]:
        """(offsets, bytes) held above the commit point, for flow control (also ``span``)."""
        self.span = span = max(0, self.next_offset - self.commit_point())
        return span, self.held_bytes

    def may_resume(self) -> bool:
        """Fetching may be paused (at the last backlog update) and may resume now."""
        return self.span >= RESUME_SPAN and self.next_offset - self.commit_point() < RESUME_SPAN

    def runs(self, commit: int) -> Iterator[tuple[int, int, str]]:
        """The metadata runs above ``commit``: settled offsets and delivery counts."""
        run_start = run_len = 0
        run_text = ""  # "" = never delivered (omitted)
        for offset, length, text in self._spans(commit):
            if text == run_text and offset == run_start + run_len:
                run_len += length
                continue
            if run_text:
                yield run_start, run_len, run_text
            run_start, run_len, run_text = offset, length, text
        if run_text:
            yield run_start, run_len, run_text

    def _spans(self, commit: int) -> Iterator[tuple[int, int, str]]:
        """(first offset, length, state text) above ``commit`` in offset order: the records
        read so far (a segment's alike neighbours as one span), then the restored states
        of offsets not read back yet."""
        now_ms = int(time.time() * 1000)
        records = self.records
        segs = iter(self.segs)
        seg = next(segs, None)
        offset, stop = commit, min(self.top + 1, self.next_offset)
        while offset < stop:
            while seg is not None and seg.first + len(seg.msgs) <= offset:
                seg = next(segs, None)
            if seg is not None and offset >= seg.first:
                first = seg.first
                for lo, hi, text in spans(seg, offset - first, stop - first):
                    if text is not None:
                        yield first + lo, hi - lo, text
                    else:  # converted: a Record now, or settled since
                        for at in range(first + lo, first + hi):
                            yield at, 1, _record_text(records.get(at), now_ms)
                offset = min(stop, first + len(seg.msgs))
                continue
            end = stop if seg is None else min(stop, seg.first)
            for at in range(offset, end):
                yield at, 1, _record_text(records.get(at), now_ms)
            offset = end
        for offset in sorted(self.restored):
            if offset >= self.next_offset:
                state = self.restored[offset]
                yield offset, 1, state_text(state.count, state.due_ms)

    def snapshot(self) -> Snapshot:
        """The commit offset and the metadata describing the offsets above it."""
        commit = self.commit_point()
        text, _ = encode_runs(commit, self.runs(commit))
        return (self.topic, self.partition, commit, text)


def _record_text(rec: Record | None, now_ms: int) -> str:
    """The state text of an offset outside the segments (None: settled or skipped)."""
    if rec is None:
        return "s"
    if rec.count == 0:
        return ""
    if not rec.due:
        return "1" if rec.count == 1 else state_text(rec.count)
    due = int(rec.due * 1000)
    return state_text(rec.count, due if due > now_ms else 0)
