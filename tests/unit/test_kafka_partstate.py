"""Pure bookkeeping of one owned partition: commit point, metadata runs, run encoding."""

from __future__ import annotations

import pytest

pytest.importorskip("confluent_kafka")

from brokerkit.backends.kafka._offsets import (
    SETTLED,
    DedupMemory,
    OffsetState,
    decode_metadata,
    encode_runs,
)
from brokerkit.backends.kafka._receiver import _Part, _Record


def _part(commit: int = 10, restored: dict[int, OffsetState] | None = None) -> _Part:
    return _Part("t", 0, commit, commit, restored or {}, DedupMemory(1.0))


def _read(part: _Part, offset: int, count: int = 0) -> _Record:
    rec = _Record(part, offset, b"x", {}, None, None, 0, count=count)
    part.records[offset] = rec
    part.next_offset = offset + 1
    if count:
        part.top = max(part.top, offset)
    return rec


def test_commit_point_is_the_lowest_unsettled_offset_and_only_moves_up() -> None:
    part = _part()
    assert part.commit_point() == 10
    for offset in range(10, 15):
        _read(part, offset, count=1)
    assert part.commit_point() == 10
    del part.records[11]
    assert part.commit_point() == 10  # 10 is still out
    del part.records[10]
    assert part.commit_point() == 12  # 11 was settled too
    for offset in (12, 13, 14):
        del part.records[offset]
    assert part.commit_point() == 15  # all settled: the next offset to read


def test_snapshot_carries_settled_runs_counts_and_restored_states() -> None:
    part = _part(restored={30: OffsetState(SETTLED), 31: OffsetState(SETTLED)})
    for offset in range(10, 20):
        _read(part, offset, count=1 if offset < 16 else 0)
    part.records[10].count = 2
    for offset in (12, 13):
        del part.records[offset]
    topic, partition, commit, meta = part.snapshot()
    assert (topic, partition, commit) == ("t", 0, 10)
    states = decode_metadata(commit, meta)
    assert states[10] == OffsetState(2)
    assert states[11] == OffsetState(1)
    assert states[12] == states[13] == OffsetState(SETTLED)
    assert all(states[o] == OffsetState(1) for o in (14, 15))
    assert not any(o in states for o in range(16, 20))  # never delivered: omitted
    assert states[30] == states[31] == OffsetState(SETTLED)


def test_encode_runs_reports_where_a_truncated_text_ends() -> None:
    runs = [(o, 1, "s" if o % 2 else "1") for o in range(0, 2000)]
    text, end = encode_runs(0, runs, budget=200)
    assert len(text) <= 200
    decoded = decode_metadata(0, text)
    assert max(decoded) == end - 1
    whole, end_all = encode_runs(0, runs[:5])
    assert end_all == -1 and len(decode_metadata(0, whole)) == 5
