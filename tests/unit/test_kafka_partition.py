"""One owned partition's state (``Partition``), as pure logic: no broker, no thread.

Records are fed to ``read`` as stand-ins of consumed confluent-kafka messages. Plain
records (no fifo_group, dedup id or restored state) go into segments; the others are
``Record``s (``_ids`` gives each record a dedup id of its own to get those).
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


def _ids(start: int, stop: int, **kw: object) -> list[StubMessage]:
    return [StubMessage(o, dedup_id=str(o), **kw) for o in range(start, stop)]  # type: ignore[arg-type]


def _part(commit: int = 0, metadata: str | None = None, start: int | None = None) -> Partition:
    return Partition("t", 0, commit, commit if start is None else start, metadata, 2.0)


def test_read_hands_out_the_window_and_keeps_the_rest_beyond_in_offset_order() -> None:
    part = _part()
    first = part.read(_ids(0, 150))
    second = part.read(_ids(150, 600))
    assert [r.offset for r in first + second] == list(range(WINDOW))
    assert [r.offset for r in part.beyond] == list(range(WINDOW, 600))
    assert part.read(_ids(0, 600)) == []  # read again (a seek back): nothing new
    assert part.next_offset == 600 and len(part.records) == 600


def test_plain_records_go_into_segments_of_consecutive_offsets() -> None:
    part = _part()
    assert part.read(run(0, 150)) == [] and part.read(run(150, 600)) == []
    assert [(seg.first, seg.end) for seg in part.segs] == [(0, 600)]
    assert part.read(run(0, 600)) == []  # read again: nothing new
    part.read([*run(600, 602), StubMessage(602, fifo_group="g"), *run(603, 605)])
    part.read(run(607, 609))  # a gap (e.g. compacted or transaction markers)
    assert [(seg.first, seg.end) for seg in part.segs] == [
        (0, 602),
        (603, 605),
        (607, 609),
    ]
    assert list(part.records) == [602] and part.fresh == part.segs
    assert part.backlog()[0] == 609 and part.commit_point() == 0


def test_settling_moves_the_commit_point_and_admits_the_next_records_in_order() -> None:
    part = _part(commit=10, start=10)
    out = part.read(_ids(10, 10 + WINDOW + 50))
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
    assert [(r.offset, r.count) for r in out] == [(0, 2), (2, 1)]  # 3: plain (never out)
    assert [(seg.first, seg.end) for seg in part.segs] == [(3, 4)]
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
    out = part.read(_ids(10, 20))
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
    out = part.read(_ids(0, RESUME_SPAN + 100, body=b"x" * 10))
    assert part.backlog() == (RESUME_SPAN + 100, 10 * (RESUME_SPAN + 100))
    assert not part.may_resume()
    for rec in out[:99]:
        part.settle(rec)
    assert not part.may_resume()
    part.settle(out[99])
    part.settle(out[100])
    assert part.may_resume()


def test_a_plain_record_turned_into_a_record_is_not_settled_by_a_stale_synchronous_ack() -> None:
    """A synchronous ack names a plain record by (segment, index); if its lease ran out
    and it left the range (``convert``) while the ack's commit was on its way, the ack's
    snapshot must leave it as it is now: held, counted, and delivered again."""
    part = _part(commit=10)
    part.read(run(10, 14))
    seg = part.segs[0]
    held = (seg, 1)  # offset 11, as the ack named it
    assert part.unsettled(held)
    part.top = 13
    rec = part.convert(seg, 1, 1, 0.0)  # its lease ran out: a Record from now on
    assert not part.unsettled(held) and part.unsettled(rec)
    part.snapshot_settling(held)  # the stale ack's commit, built before it noticed
    _, _, commit, text = part.snapshot()
    assert commit == 10 and decode_metadata(commit, text)[11] == OffsetState(1)
    for index in (0, 2, 3):
        part.settle_plain(seg, index)
    assert part.commit_point() == 11  # offset 11 is still held, by its Record
    part.settle(rec)
    assert part.commit_point() == 14
