"""One owned partition's state (``Partition``), as pure logic: no broker, no thread.

Records are fed to ``read`` as stand-ins of consumed confluent-kafka messages.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("confluent_kafka")

from _kafka_stub import StubMessage, run

from brokerkit.backends.kafka._offsets import (
    SETTLED,
    OffsetState,
    decode_metadata,
    encode_metadata,
)
from brokerkit.backends.kafka._partition import RESUME_SPAN, WINDOW, Partition


def _part(commit: int = 0, metadata: str | None = None, start: int | None = None) -> Partition:
    return Partition("t", 0, commit, commit if start is None else start, metadata, 2.0)


def test_read_hands_out_the_window_and_keeps_the_rest_beyond_in_offset_order() -> None:
    part = _part()
    first = part.read(run(0, 150))
    second = part.read(run(150, 600))
    assert [r.offset for r in first + second] == list(range(WINDOW))
    assert [r.offset for r in part.beyond] == list(range(WINDOW, 600))
    assert part.read(run(0, 600)) == []  # read again (a seek back): nothing new
    assert part.next_offset == 600 and len(part.records) == 600


def test_settling_moves_the_commit_point_and_admits_the_next_records_in_order() -> None:
    part = _part(commit=10, start=10)
    out = part.read(run(10, 10 + WINDOW + 50))
    assert part.commit_point() == 10
    assert part.settle(out[1]) is False  # not the lowest: the commit point stays
    assert part.commit_point() == 10
    assert part.admit() == []
    assert part.settle(out[0]) is True
    assert part.commit_point() == 12  # 11 was settled too
    assert [r.offset for r in part.admit()] == [10 + WINDOW, 10 + WINDOW + 1]
    assert part.settle(out[2]) is False  # `moved` still set: one check per run of settles


def test_records_below_the_commit_point_only_rebuild_the_dedup_memory() -> None:
    # assigned at commit 5, reading from 3 (the dedup window before it)
    part = _part(commit=5, start=3)
    out = part.read(
        [
            StubMessage(3, dedup_id="a", timestamp_ms=1_000),
            StubMessage(4, timestamp_ms=1_100),
            StubMessage(5, dedup_id="a", timestamp_ms=2_999),  # within 2 s of offset 3
            StubMessage(6, dedup_id="b", timestamp_ms=3_000),
            StubMessage(7, dedup_id="a", timestamp_ms=3_000),  # 2 s after 3: a new copy
            StubMessage(8, dedup_id="a", timestamp_ms=4_000),  # within 2 s of 7
        ]
    )
    assert [(r.offset, r.dedup_id) for r in out] == [(6, "b"), (7, "a")]
    # the skipped duplicates are settled: the metadata says so, they never come back
    assert part.top == 8
    _, _, commit, meta = part.snapshot()
    assert commit == 6
    assert decode_metadata(commit, meta) == {8: OffsetState(SETTLED)}


def test_headers_fifo_group_and_dedup_id_are_split_out_of_the_record_headers() -> None:
    part = _part()
    (rec,) = part.read([StubMessage(0, fifo_group="g", dedup_id="d", headers={"k": "v"})])
    assert (rec.fifo_group, rec.dedup_id, dict(rec.headers)) == ("g", "d", {"k": "v"})
    assert rec.body == b"0" and "0-0" in repr(rec) and "body" not in repr(rec)


def test_a_new_owner_honours_the_committed_states_above_the_commit_point() -> None:
    due_ms = int(time.time() * 1000) + 60_000
    meta = encode_metadata(
        0, [(0, OffsetState(2)), (1, OffsetState(SETTLED)), (2, OffsetState(1, due_ms))]
    )
    part = _part(metadata=meta)
    out = part.read(run(0, 4))
    assert [(r.offset, r.count) for r in out] == [(0, 2), (2, 1), (3, 0)]
    assert out[1].due == due_ms / 1000.0
    # the state is carried on until settled: a crash now loses none of it
    _, _, commit, text = part.snapshot()
    assert decode_metadata(commit, text) == {
        0: OffsetState(2),
        1: OffsetState(SETTLED),
        2: OffsetState(1, due_ms),
    }


def test_restored_states_not_read_back_yet_stay_in_the_snapshot() -> None:
    meta = encode_metadata(10, [(10, OffsetState(1)), (30, OffsetState(SETTLED))])
    part = _part(commit=10, metadata=meta)
    part.read(run(10, 12))
    _, _, commit, text = part.snapshot()
    assert decode_metadata(commit, text) == {10: OffsetState(1), 30: OffsetState(SETTLED)}


def test_snapshot_carries_settled_runs_and_counts_and_omits_never_delivered() -> None:
    part = _part(commit=10)
    out = part.read(run(10, 20))
    for rec in out[:6]:
        rec.count = 1
    out[0].count = 2
    part.top = 15
    part.settle(out[2])
    part.settle(out[3])
    topic, partition, commit, meta = part.snapshot()
    assert (topic, partition, commit) == ("t", 0, 10)
    states = decode_metadata(commit, meta)
    assert states[10] == OffsetState(2)
    assert states[11] == OffsetState(1)
    assert states[12] == states[13] == OffsetState(SETTLED)
    assert states[14] == states[15] == OffsetState(1)
    assert not any(o in states for o in range(16, 20))


def test_backlog_and_resume_follow_the_commit_point() -> None:
    part = _part()
    out = part.read(run(0, RESUME_SPAN + 100, body=b"x" * 10))
    assert part.backlog() == (RESUME_SPAN + 100, 10 * (RESUME_SPAN + 100))
    assert not part.may_resume()
    for rec in out[:99]:
        part.settle(rec)
    assert not part.may_resume()
    part.settle(out[99])
    part.settle(out[100])
    assert part.may_resume()
