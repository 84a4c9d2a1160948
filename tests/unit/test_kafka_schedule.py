"""The Kafka hand-out schedule (``HandOut`` on the core's LeaseBook) over ``Partition``s.

Pure logic: no broker, no consumer thread. Records are fed to ``Partition.read`` as
stand-ins of consumed confluent-kafka messages and admitted the way the receiver does.
A batch is ``(records, receipts)``; a receipt is the lease token.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("confluent_kafka")

from _kafka_stub import StubMessage, run

from brokerkit.backends import LeaseExpired
from brokerkit.backends.kafka._offsets import (
    SETTLED,
    OffsetState,
    decode_metadata,
    encode_metadata,
)
from brokerkit.backends.kafka._partition import RESUME_SPAN, WINDOW, Partition
from brokerkit.backends.kafka._schedule import Batch, HandOut


def _setup(
    partitions: int = 1, ack_timeout: float = 30.0, metadata: str | None = None
) -> tuple[HandOut, list[Partition]]:
    parts = [Partition("t", p, 0, 0, metadata, 300.0) for p in range(partitions)]
    return HandOut(ack_timeout), parts


def _feed(schedule: HandOut, part: Partition, msgs: list[StubMessage], now: float) -> None:
    schedule.admit(part, part.read(msgs), now)


def _offsets(batch: Batch) -> list[int]:
    return [rec.offset for rec in batch[0]]


def _settle_all(schedule: HandOut, batch: Batch, now: float) -> None:
    for token in batch[1]:
        schedule.settle(token, now)


def test_in_order_settles_walk_the_window_through_a_long_partition() -> None:
    schedule, (part,) = _setup()
    _feed(schedule, part, run(0, 600), 0.0)
    _feed(schedule, part, run(600, 1000), 0.0)
    seen: list[int] = []
    while len(seen) < 1000:
        taken = schedule.take(500, 1.0)
        assert taken[0], f"stalled at {len(seen)}"
        assert all(rec.offset < part.commit_point() + WINDOW for rec in taken[0])
        seen.extend(_offsets(taken))
        _settle_all(schedule, taken, 1.0)
        schedule.apply_moved(1.0)
    assert seen == list(range(1000))
    assert not part.records and not part.beyond and len(schedule) == 0
    assert part.commit_point() == 1000


def test_a_settle_of_the_lowest_asks_for_one_window_check_per_run() -> None:
    calls: list[int] = []
    schedule = HandOut(30.0, lambda: calls.append(1))
    part = Partition("t", 0, 0, 0, None, 300.0)
    _feed(schedule, part, run(0, 300), 0.0)
    records, tokens = schedule.take(500, 1.0)
    assert len(records) == WINDOW
    for token in tokens[:50]:
        schedule.settle(token, 1.0)
    assert calls == [1]  # the receiver schedules one apply_moved for the run
    assert part.commit_point() == 50
    schedule.apply_moved(1.0)
    assert _offsets(schedule.take(500, 1.0)) == list(range(WINDOW, WINDOW + 50))


def test_an_expired_lease_counts_the_next_attempt_and_a_late_settle_is_refused() -> None:
    schedule, (part,) = _setup(ack_timeout=5.0)
    _feed(schedule, part, run(0, 10), 0.0)
    records, tokens = schedule.take(10, 0.0)
    assert [rec.count for rec in records] == [1] * 10
    for token in tokens[:4]:
        schedule.settle(token, 1.0)
    schedule.extend(tokens[9], 60.0, 1.0)
    again = schedule.take(10, 6.0)
    assert _offsets(again) == list(range(4, 9))
    assert all(rec.count == 2 for rec in again[0])
    with pytest.raises(LeaseExpired):
        schedule.settle(tokens[5], 6.0)  # the stale receipt of a record handed out again
    assert not schedule.holds(tokens[5], 6.0) and schedule.holds(again[1][1], 6.0)
    schedule.settle(tokens[9], 6.0)  # extended: still held


def test_staged_records_get_their_lease_at_hand_over_and_go_back_uncounted() -> None:
    schedule, parts = _setup(partitions=2, ack_timeout=5.0)
    _feed(schedule, parts[0], run(0, 3, 0), 0.0)
    _feed(schedule, parts[1], run(0, 3, 1), 0.0)
    _feed(schedule, parts[0], run(3, 6, 0), 0.0)
    assert schedule.stage(9, 0.0)
    assert not schedule.stage(9, 0.0)  # one staged batch at a time
    assert all(rec.count == 1 for rec in schedule.staged[0])
    back = schedule.unstage([parts[1]])  # e.g. partition 1 revoked
    assert sorted(r.offset for r in back) == [0, 1, 2] and all(r.count == 0 for r in back)
    first = schedule.hand_over(4, 100.0)  # a staged record has no deadline until now
    rest = schedule.hand_over(10, 100.0)
    assert _offsets(first) == [0, 1, 2, 3] and _offsets(rest) == [4, 5]
    assert schedule.hand_over(10, 100.0) == ([], ())
    schedule.settle(first[1][0], 104.0)
    records, _ = schedule.take(10, 106.0)  # the hand-over's lease (5 s) ran out
    assert sorted((r.part.partition, r.offset, r.count) for r in records) == [
        (0, 1, 2),
        (0, 2, 2),
        (0, 3, 2),
        (0, 4, 2),
        (0, 5, 2),
        (1, 0, 1),
        (1, 1, 1),
        (1, 2, 1),
    ]


def test_a_hand_over_skips_staged_records_lost_meanwhile() -> None:
    schedule, parts = _setup(partitions=2)
    _feed(schedule, parts[0], run(0, 2, 0), 0.0)
    _feed(schedule, parts[1], run(0, 2, 1), 0.0)
    assert schedule.stage(10, 0.0)
    schedule.drop([parts[0]])  # lost: its staged records went with it
    records, tokens = schedule.hand_over(10, 1.0)
    assert [(r.part.partition, r.offset) for r in records] == [(1, 0), (1, 1)]
    assert all(schedule.holds(t, 1.0) for t in tokens)


def test_give_back_uncounts_and_skips_what_is_no_longer_held() -> None:
    schedule, (part,) = _setup(ack_timeout=5.0)
    _feed(schedule, part, run(0, 3), 0.0)
    _, tokens = schedule.take(3, 0.0)
    schedule.settle(tokens[0], 0.0)
    back = schedule.give_back(tokens, 1.0)
    assert [r.offset for r in back] == [1, 2] and all(r.count == 0 for r in back)
    assert [r.count for r in schedule.take(3, 1.0)[0]] == [1, 1]


def test_a_fifo_group_goes_out_one_at_a_time_and_a_nack_keeps_it_held() -> None:
    schedule, (part,) = _setup()
    msgs = [StubMessage(o, fifo_group="g" if o < 3 else None) for o in range(5)]
    _feed(schedule, part, msgs, 0.0)
    taken = schedule.take(10, 0.0)
    assert _offsets(taken) == [0, 3, 4]
    rec = schedule.nack(taken[1][0], 2.0, 0.0)
    assert rec.due > time.time()  # wall clock: committed in the metadata
    assert schedule.take(10, 1.0)[0] == []  # 1 waits behind 0, and 0 is not due yet
    again = schedule.take(10, 2.0)
    assert [(r.offset, r.count) for r in again[0]] == [(0, 2)]
    schedule.settle(again[1][0], 2.0)
    assert _offsets(schedule.take(10, 2.0)) == [1]


def test_a_restored_nack_delay_is_honoured_by_a_new_owner() -> None:
    due_ms = int(time.time() * 1000) + 60_000
    meta = encode_metadata(0, [(0, OffsetState(1, due_ms))])
    schedule, (part,) = _setup(metadata=meta)
    now = time.monotonic()
    _feed(schedule, part, run(0, 2), now)
    other = schedule.take(10, now)
    assert _offsets(other) == [1]
    _settle_all(schedule, other, now)
    assert schedule.take(10, now + 55.0)[0] == []  # not before the committed due time
    late = schedule.take(10, now + 61.0)
    assert [(r.offset, r.count) for r in late[0]] == [(0, 2)]


def test_a_revoked_partition_stops_going_out_but_keeps_its_state() -> None:
    schedule, parts = _setup(partitions=2, ack_timeout=5.0)
    _feed(schedule, parts[0], run(0, 4, 0), 0.0)
    _feed(schedule, parts[1], run(0, 2, 1), 0.0)
    _, tokens = schedule.take(3, 0.0)  # 0-0, 0-1, 0-2
    schedule.revoke([parts[0]])
    assert schedule.leased_in(parts[0])
    schedule.nack(tokens[0], 0.0, 1.0)  # back, but not out again while revoking
    schedule.settle(tokens[1], 1.0)
    others = schedule.take(10, 1.0)
    assert [(r.part.partition, r.offset) for r in others[0]] == [(1, 0), (1, 1)]
    _settle_all(schedule, others, 1.0)
    assert schedule.take(10, 10.0)[0] == []  # 0-2's lease ended: not out again either
    assert not schedule.leased_in(parts[0])
    _, _, commit, meta = parts[0].snapshot()  # what the revoke commits
    assert commit == 0
    assert decode_metadata(commit, meta) == {
        0: OffsetState(1),
        1: OffsetState(SETTLED),
        2: OffsetState(1),
    }


def test_a_dropped_partition_ends_its_leases_at_once() -> None:
    schedule, (part,) = _setup()
    _feed(schedule, part, run(0, 2), 0.0)
    _, tokens = schedule.take(2, 0.0)
    schedule.drop([part])
    assert part.gone and len(schedule) == 0
    with pytest.raises(LeaseExpired):
        schedule.settle(tokens[0], 0.0)


def test_apply_moved_names_the_partitions_whose_fetching_may_resume() -> None:
    schedule, (part,) = _setup()
    _feed(schedule, part, run(0, RESUME_SPAN + 100), 0.0)
    part.backlog()  # as the receiver publishes it for flow control
    resumed: list[Partition] = []
    for _ in range(3):
        _settle_all(schedule, schedule.take(500, 0.0), 0.0)
        resumed = schedule.apply_moved(0.0)
        if resumed:
            break
    assert resumed == [part]


def test_a_synchronous_ack_commits_the_settled_state_before_anything_changes() -> None:
    # KafkaReceiver._ack_now: the snapshot as it will be once settled, the record still
    # leased until that commit is recorded (and settled then, with the ack's own time)
    schedule, (part,) = _setup(ack_timeout=5.0)
    _feed(schedule, part, run(0, 4), 0.0)
    records, tokens = schedule.take(4, 0.0)
    before = part.snapshot()
    assert schedule.leased(tokens[0], 1.0) is records[0]
    settling = part.snapshot_settling(records[0])
    assert part.snapshot() == before and schedule.holds(tokens[0], 1.0)  # nothing changed
    assert part.commit_point() == 0
    schedule.settle(tokens[0], 1.0)
    assert part.snapshot() == settling and settling[2] == 1
    settling = part.snapshot_settling(records[2])  # above the commit point: in the metadata
    schedule.settle(tokens[2], 1.0)
    assert part.snapshot() == settling
    with pytest.raises(LeaseExpired):
        schedule.leased(tokens[3], 6.0)  # ran out
    with pytest.raises(LeaseExpired):
        schedule.leased(tokens[0], 1.0)  # settled
