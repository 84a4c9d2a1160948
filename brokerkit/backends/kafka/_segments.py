"""Range bookkeeping for plain records: consecutive offsets kept and leased as one.

A *plain* record has no fifo_group, no dedup id and no restored state (it was never
handed out as far as the commit metadata says). The common case of a queue is a long
stream of them, so they are not kept one object each:

* a ``Segment`` holds a run of consecutive plain offsets of one partition as read: the
  consumed confluent-kafka ``Message``s, a ``bytearray`` of their states, and ``taken``,
  how many from its start were handed out (plain records go out in offset order);
* a ``Run`` is one lease over consecutive records of one segment (a take's share of
  it): one token block, one deadline, one heap entry (``RunBook``).

A record of a segment whose lease ends without a settle (nack, lease expiry, release,
a count commit that failed, a revoke) leaves the range: it becomes a per-record
``Record`` (``Partition.convert``) scheduled by the ``LeaseBook`` like any other, and
its state byte says so (``CONVERTED``).

Receipts: a run's tokens are negative, ``~(run id << RUN_BITS | index in the run)``;
the ``LeaseBook``'s are positive (``2**40`` and up). Python's integers have no upper
bound, so however many runs a long-lived process leases, the two never collide and a
stale token of either kind names no live lease.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = [
    "CONVERTED",
    "OPEN",
    "RUN_BITS",
    "RUN_MASK",
    "RUN_TOKENS",
    "SETTLED_PLAIN",
    "Run",
    "RunBook",
    "Segment",
    "spans",
]

OPEN, SETTLED_PLAIN, CONVERTED = 0, 1, 2
"""State bytes: not settled (not handed out, or in a run); settled; now a ``Record``."""
RUN_BITS = 11
"""A run has at most ``2**RUN_BITS`` records (a take splits longer ones)."""
RUN_MASK = (1 << RUN_BITS) - 1
RUN_TOKENS = 0
"""Every run token is below this (negative); every ``LeaseBook`` token is above it."""
_run_ids = itertools.count(1)
"""One sequence for the whole process: a run's token block is unique in it."""


class Segment:
    """Consecutive plain offsets ``[first, first + len(msgs))`` of one partition."""

    __slots__ = ("first", "heads", "msgs", "part", "size", "state", "taken")

    def __init__(self, part: Any, first: int) -> None:
        self.part = part
        self.first = first
        self.msgs: list[Any] = []
        """The consumed ``Message``s (body, timestamp read at hand-out)."""
        self.heads: list[Mapping[str, str]] | None = None
        """Decoded user headers per record, once any record of the segment has some."""
        self.state = bytearray()
        self.taken = 0
        """Records ``[0, taken)`` were handed out (or staged): their count is 1."""
        self.size = 0
        """Body bytes held by the records still in the range."""

    @property
    def end(self) -> int:
        return self.first + len(self.msgs)

    def __repr__(self) -> str:
        return f"<Segment {self.part.partition}:{self.first}-{self.end} taken={self.taken}>"


_BYTES = {OPEN: b"\x00", SETTLED_PLAIN: b"\x01", CONVERTED: b"\x02"}


def spans(seg: Segment, lo: int, hi: int) -> Iterator[tuple[int, int, str | None]]:
    """The states of records ``[lo, hi)`` of ``seg`` as ``(start, end, text)`` spans of
    alike neighbours: ``"1"`` handed out (count 1), ``""`` not yet, ``"s"`` settled, None
    converted (the partition's ``Record`` says)."""
    state, taken = seg.state, seg.taken
    hi = min(hi, len(state))
    i = lo
    while i < hi:
        byte = state[i]
        end = hi
        for other, pattern in _BYTES.items():  # the next byte that differs
            if other != byte:
                found = state.find(pattern, i, end)
                if found >= 0:
                    end = found
        if byte == OPEN:
            if i < taken < end:
                yield i, taken, "1"
                yield taken, end, ""
            else:
                yield i, end, "1" if i < taken else ""
        elif byte == SETTLED_PLAIN:
            yield i, end, "s"
        else:
            yield i, end, None
        i = end


class Run:
    """One lease over records ``[lo, hi)`` of a segment; see the module docstring."""

    __slots__ = ("deadline", "extended", "hi", "ident", "lo", "out", "seg")

    def __init__(self, seg: Segment, lo: int, hi: int, deadline: float) -> None:
        self.seg = seg
        self.lo, self.hi = lo, hi
        self.ident = next(_run_ids)
        self.deadline = deadline
        self.out = hi - lo
        """Records of the run still leased (not settled, not converted)."""
        self.extended: dict[int, float] | None = None
        """Per-record deadlines set by ``extend`` (index -> deadline)."""

    @property
    def origin(self) -> int:
        """The token of segment record ``index`` is ``origin - index``."""
        return ~((self.ident << RUN_BITS) - self.lo)

    def tokens(self) -> range:
        first = ~(self.ident << RUN_BITS)
        return range(first, first - (self.hi - self.lo), -1)

    def deadline_of(self, index: int) -> float:
        ext = self.extended
        if ext is not None and index in ext:
            return ext[index]
        return self.deadline

    def __len__(self) -> int:
        return self.hi - self.lo

    def __repr__(self) -> str:
        return f"<Run {self.seg.part.partition}:{self.seg.first + self.lo}+{len(self)}>"


class RunBook:
    """The live runs of one receiver, by id, and their deadlines (a heap)."""

    __slots__ = ("_heap", "_order", "runs")

    def __init__(self) -> None:
        self.runs: dict[int, Run] = {}
        self._heap: list[tuple[float, int, int]] = []  # (deadline, order, run id)
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self.runs)

    def open(self, seg: Segment, lo: int, hi: int, deadline: float) -> Run:
        """A new run over ``[lo, hi)`` of ``seg`` (``deadline`` inf: staged, no heap entry)."""
        run = Run(seg, lo, hi, deadline)
        self.runs[run.ident] = run
        if deadline != float("inf"):
            heapq.heappush(self._heap, (deadline, next(self._order), run.ident))
        return run

    def start(self, run: Run, deadline: float) -> None:
        """Start a staged run's lease."""
        run.deadline = deadline
        heapq.heappush(self._heap, (deadline, next(self._order), run.ident))

    def find(self, token: int, now: float) -> tuple[Run, int] | None:
        """The live run and segment index ``token`` leases at ``now``, else None."""
        token = ~token
        run = self.runs.get(token >> RUN_BITS)
        if run is None:
            return None
        index = run.lo + (token & RUN_MASK)
        if index >= run.hi or run.seg.state[index] != OPEN:
            return None
        ext = run.extended
        deadline = ext.get(index, run.deadline) if ext is not None else run.deadline
        if deadline < now:
            return None
        return run, index

    def leased(self, token: int) -> tuple[Run, int] | None:
        """As ``find``, whether or not the deadline passed."""
        return self.find(token, -math.inf)

    def done_one(self, run: Run) -> None:
        """One record of ``run`` left it (settled or converted)."""
        run.out -= 1
        if not run.out:
            self.runs.pop(run.ident, None)

    def extend(self, run: Run, index: int, deadline: float) -> None:
        if run.extended is None:
            run.extended = {}
        run.extended[index] = deadline
        heapq.heappush(self._heap, (deadline, next(self._order), run.ident))

    def due(self, now: float) -> Iterator[tuple[Run, int]]:
        """The ``(run, index)`` whose lease ended by ``now`` (deadline <= now)."""
        heap, runs = self._heap, self.runs
        while heap and heap[0][0] <= now:
            _, _, ident = heapq.heappop(heap)
            run = runs.get(ident)
            if run is None:
                continue
            state = run.seg.state
            for index in range(run.lo, run.hi):
                if state[index] == OPEN and run.deadline_of(index) <= now:
                    yield run, index

    def next_deadline(self) -> float | None:
        heap, runs = self._heap, self.runs
        while heap and heap[0][2] not in runs:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def of(self, parts: Any) -> list[Run]:
        """The live runs of the partitions ``parts`` (a container)."""
        return [run for run in self.runs.values() if run.seg.part in parts]

    def drop(self, run: Run) -> None:
        self.runs.pop(run.ident, None)
