"""The Kafka hand-out schedule (``HandOut`` on the core's LeaseBook) over ``Partition``s.

Pure logic: no broker, no consumer thread. Records are fed to ``Partition.read`` as
stand-ins of consumed confluent-kafka messages and admitted the way the receiver does.
A batch holds ``Record``s (fifo_group, dedup id, restored state, redeliveries) and runs of
plain records; ``Batch.entries()`` lists ``(partition, offset, count, receipt)``; a
receipt is the lease token.
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

_plain_run = run  # the ``records`` variant replaces ``run``


@pytest.fixture(autouse=True, params=["plain", "records"])
def _kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test twice: plain records (runs of a segment) and ``Record``s (each with a
    dedup id of its own, so each goes through the ``LeaseBook``)."""
    if request.param == "records":

        def with_ids(start: int, end: int, partition: int = 0, **kw: object) -> list[StubMessage]:
            return [
                StubMessage(o, partition, dedup_id=f"{partition}-{o}", **kw)  # type: ignore[arg-type]
                for o in range(start, end)
            ]

        monkeypatch.setitem(globals(), "run", with_ids)


def _setup(
    partitions: int = 1, ack_timeout: float = 30.0, metadata: str | None = None
) -> tuple[HandOut, list[Partition]]:
    parts = [Partition("t", p, 0, 0, metadata, 300.0) for p in range(partitions)]
    return HandOut(ack_timeout), parts


def _feed(schedule: HandOut, part: Partition, msgs: list[StubMessage], now: float) -> None:
    schedule.admit(part, part.read(msgs), now)


def _offsets(batch: Batch) -> list[int]:
    return batch.offsets()


def _tokens(batch: Batch) -> list[int]:
    return [token for *_, token in batch.entries()]


def _counts(batch: Batch) -> list[tuple[int, int]]:
    return [(offset, count) for _, offset, count, _ in batch.entries()]


def _settle_all(schedule: HandOut, batch: Batch, now: float) -> None:
    for token in _tokens(batch):
        schedule.settle(token, now)


def test_in_order_settles_walk_the_window_through_a_long_partition() -> None:
    schedule, (part,) = _setup()
    _feed(schedule, part, run(0, 600), 0.0)
    _feed(schedule, part, run(600, 1000), 0.0)
    seen: list[int] = []
    while len(seen) < 1000:
        taken = schedule.take(500, 1.0)
        assert taken, f"stalled at {len(seen)}"
        assert all(offset < part.commit_point() + WINDOW for offset in taken.offsets())
        seen.extend(_offsets(taken))
        _settle_all(schedule, taken, 1.0)
        schedule.apply_moved(1.0)
    assert seen == list(range(1000))
    assert not part.records and not part.beyond and len(schedule) == 0 and not part.fresh
    assert part.commit_point() == 1000


def test_a_settle_of_the_lowest_asks_for_one_window_check_per_run() -> None:
    calls: list[int] = []
    schedule = HandOut(30.0, lambda: calls.append(1))
    part = Partition("t", 0, 0, 0, None, 300.0)
    _feed(schedule, part, run(0, 300), 0.0)
    taken = schedule.take(500, 1.0)
    assert len(taken) == WINDOW
    for token in _tokens(taken)[:50]:
        schedule.settle(token, 1.0)
    assert calls == [1]  # the receiver schedules one apply_moved for the run
    assert part.commit_point() == 50
    schedule.apply_moved(1.0)
    assert _offsets(schedule.take(500, 1.0)) == list(range(WINDOW, WINDOW + 50))


def test_an_expired_lease_counts_the_next_attempt_and_a_late_settle_is_refused() -> None:
    schedule, (part,) = _setup(ack_timeout=5.0)
    _feed(schedule, part, run(0, 10), 0.0)
    taken = schedule.take(10, 0.0)
    tokens = _tokens(taken)
    assert [count for _, count in _counts(taken)] == [1] * 10
    for token in tokens[:4]:
        schedule.settle(token, 1.0)
    schedule.extend(tokens[9], 60.0, 1.0)
    again = schedule.take(10, 6.0)
    assert _offsets(again) == list(range(4, 9))
    assert all(rec.count == 2 for rec in again.records)
    with pytest.raises(LeaseExpired):
        schedule.settle(tokens[5], 6.0)  # the stale receipt of a record handed out again
    assert not schedule.holds(tokens[5], 6.0) and schedule.holds(_tokens(again)[1], 6.0)
    schedule.settle(tokens[9], 6.0)  # extended: still held
    assert part.commit_point() == 4


def test_staged_records_get_their_lease_at_hand_over_and_go_back_uncounted() -> None:
    schedule, parts = _setup(partitions=2, ack_timeout=5.0)
    _feed(schedule, parts[0], run(0, 3, 0), 0.0)
    _feed(schedule, parts[1], run(0, 3, 1), 0.0)
    _feed(schedule, parts[0], run(3, 6, 0), 0.0)
    assert schedule.stage(9, 0.0)
    assert not schedule.stage(9, 0.0)  # one staged batch at a time
    assert all(count == 1 for _, count in _counts(schedule.staged))
    back = schedule.unstage([parts[1]])  # e.g. partition 1 revoked
    assert sorted(r.offset for r in back) == [0, 1, 2] and all(r.count == 0 for r in back)
    first = schedule.hand_over(4, 100.0)  # a staged record has no deadline until now
    rest = schedule.hand_over(10, 100.0)
    assert _offsets(first) == [0, 1, 2, 3] and _offsets(rest) == [4, 5]
    assert not schedule.hand_over(10, 100.0)
    schedule.settle(_tokens(first)[0], 104.0)
    again = schedule.take(10, 106.0)  # the hand-over's lease (5 s) ran out
    assert sorted((p.partition, o, c) for p, o, c, _ in again.entries()) == [
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
    batch = schedule.hand_over(10, 1.0)
    assert [(p.partition, o) for p, o, _, _ in batch.entries()] == [(1, 0), (1, 1)]
    assert all(schedule.holds(t, 1.0) for t in _tokens(batch))


def test_give_back_uncounts_and_skips_what_is_no_longer_held() -> None:
    schedule, (part,) = _setup(ack_timeout=5.0)
    _feed(schedule, part, run(0, 3), 0.0)
    tokens = _tokens(schedule.take(3, 0.0))
    schedule.settle(tokens[0], 0.0)
    back = schedule.give_back(tokens, 1.0)
    assert [r.offset for r in back] == [1, 2] and all(r.count == 0 for r in back)
    assert _counts(schedule.take(3, 1.0)) == [(1, 1), (2, 1)]
    _, _, commit, meta = part.snapshot()
    assert (commit, decode_metadata(commit, meta)) == (1, {1: OffsetState(1), 2: OffsetState(1)})


def test_a_fifo_group_goes_out_one_at_a_time_and_a_nack_keeps_it_held() -> None:
    schedule, (part,) = _setup()
    msgs = [StubMessage(o, fifo_group="g" if o < 3 else None) for o in range(5)]
    _feed(schedule, part, msgs, 0.0)
    taken = schedule.take(10, 0.0)
    assert _offsets(taken) == [0, 3, 4]
    schedule.nack(_tokens(taken)[0], 2.0, 0.0)
    assert part.records[0].due > time.time()  # wall clock: committed in the metadata
    assert not schedule.take(10, 1.0)  # 1 waits behind 0, and 0 is not due yet
    again = schedule.take(10, 2.0)
    assert _counts(again) == [(0, 2)]
    schedule.settle(_tokens(again)[0], 2.0)
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
    assert not schedule.take(10, now + 55.0)  # not before the committed due time
    late = schedule.take(10, now + 61.0)
    assert _counts(late) == [(0, 2)]


def test_a_revoked_partition_stops_going_out_but_keeps_its_state() -> None:
    schedule, parts = _setup(partitions=2, ack_timeout=5.0)
    _feed(schedule, parts[0], run(0, 4, 0), 0.0)
    _feed(schedule, parts[1], run(0, 2, 1), 0.0)
    tokens = _tokens(schedule.take(3, 0.0))  # 0-0, 0-1, 0-2
    schedule.revoke([parts[0]])
    assert schedule.leased_in(parts[0])
    schedule.nack(tokens[0], 0.0, 1.0)  # back, but not out again while revoking
    schedule.settle(tokens[1], 1.0)
    others = schedule.take(10, 1.0)
    assert [(p.partition, o) for p, o, _, _ in others.entries()] == [(1, 0), (1, 1)]
    _settle_all(schedule, others, 1.0)
    assert not schedule.take(10, 10.0)  # 0-2's lease ended: not out again either
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
    tokens = _tokens(schedule.take(2, 0.0))
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
    tokens = _tokens(schedule.take(4, 0.0))
    before = part.snapshot()
    held = schedule.leased(tokens[0], 1.0)
    assert held[0] is part
    settling = part.snapshot_settling(held[1])
    assert part.snapshot() == before and schedule.holds(tokens[0], 1.0)  # nothing changed
    assert part.commit_point() == 0
    schedule.settle(tokens[0], 1.0)
    assert part.snapshot() == settling and settling[2] == 1
    settling = part.snapshot_settling(schedule.leased(tokens[2], 1.0)[1])  # in the metadata
    schedule.settle(tokens[2], 1.0)
    assert part.snapshot() == settling
    with pytest.raises(LeaseExpired):
        schedule.leased(tokens[3], 6.0)  # ran out
    with pytest.raises(LeaseExpired):
        schedule.leased(tokens[0], 1.0)  # settled


def test_plain_records_that_leave_their_run_are_settled_as_records() -> None:
    schedule, (part,) = _setup(ack_timeout=5.0)
    _feed(schedule, part, _plain_run(0, 6, body=b"xy"), 0.0)
    assert part.backlog() == (6, 12)
    taken = schedule.take(10, 0.0)
    assert not taken.records and len(taken.runs) == 1  # one lease entry for the batch
    tokens = _tokens(taken)
    schedule.nack(tokens[1], 0.0, 0.0)  # leaves the run: a Record, count 1
    schedule.give_back([tokens[4]], 0.0)  # uncounted
    schedule.settle(tokens[0], 0.0)
    _, _, commit, meta = part.snapshot()
    assert (commit, decode_metadata(commit, meta)) == (
        1,
        {1: OffsetState(1), 2: OffsetState(1), 3: OffsetState(1), 5: OffsetState(1)},
    )
    again = schedule.take(10, 0.0)
    assert _counts(again) == [(1, 2), (4, 1)]
    for token in (*_tokens(again), tokens[2], tokens[3], tokens[5]):
        schedule.settle(token, 1.0)
    schedule.apply_moved(1.0)
    assert part.commit_point() == 6 and part.backlog() == (0, 0)
    assert not part.records and not part.segs and len(schedule) == 0
    with pytest.raises(LeaseExpired):
        schedule.settle(tokens[1], 1.0)  # its run lease ended with the nack


def test_plain_records_after_a_fifo_group_keep_the_commit_point_below_it() -> None:
    schedule, (part,) = _setup()
    msgs = [StubMessage(0, fifo_group="g"), *_plain_run(1, 4), StubMessage(4, dedup_id="d")]
    _feed(schedule, part, [*msgs, *_plain_run(5, 7)], 0.0)
    taken = schedule.take(10, 0.0)
    assert sorted(taken.offsets()) == list(range(7))
    assert len(taken.records) == 2 and len(taken.runs) == 2
    for _, offset, _, token in taken.entries():
        if offset:
            schedule.settle(token, 0.0)
    assert part.commit_point() == 0
    schedule.settle(_tokens(taken)[0], 0.0)
    assert part.commit_point() == 7


def _expected_states(part: Partition) -> dict[int, OffsetState]:
    """The committed state of every offset, offset by offset (the reference)."""
    out: dict[int, OffsetState] = {}
    commit = part.commit_point()
    for offset in range(commit, min(part.top + 1, part.next_offset)):
        rec = part.records.get(offset)
        seg = next((s for s in part.segs if s.first <= offset < s.end), None)
        if seg is not None and seg.state[offset - seg.first] != 2:
            byte, index = seg.state[offset - seg.first], offset - seg.first
            if byte == 1:
                out[offset] = OffsetState(SETTLED)
            elif index < seg.taken:
                out[offset] = OffsetState(1)
        elif rec is None:
            out[offset] = OffsetState(SETTLED)
        elif rec.count:
            due = int(rec.due * 1000)
            out[offset] = OffsetState(rec.count, due if due > time.time() * 1000 else 0)
    return out


@pytest.mark.parametrize("seed", range(30))
def test_the_snapshot_of_mixed_records_matches_the_state_offset_by_offset(seed: int) -> None:
    import random

    rng = random.Random(seed)
    schedule, (part,) = _setup(ack_timeout=5.0)
    msgs = []
    for o in range(400):
        kind = rng.random()
        if kind < 0.1:
            msgs.append(StubMessage(o, fifo_group=f"g{rng.randrange(3)}"))
        elif kind < 0.15:
            msgs.append(StubMessage(o, dedup_id=f"d{rng.randrange(40)}"))
        else:
            msgs.append(StubMessage(o))
    held: list[int] = []
    now = 0.0
    for start in range(0, 400, 50):
        _feed(schedule, part, msgs[start : start + 50], now)
        held.extend(_tokens(schedule.take(rng.randrange(1, 120), now)))
        rng.shuffle(held)
        for _ in range(rng.randrange(len(held) + 1)):
            token = held.pop()
            action = rng.random()
            if action < 0.7:
                schedule.settle(token, now)
            elif action < 0.8:
                schedule.nack(token, rng.choice([0.0, 30.0]), now)
            elif action < 0.9:
                schedule.give_back([token], now)
            else:
                schedule.extend(token, 60.0, now)
                held.insert(0, token)
        schedule.apply_moved(now)
        now += rng.choice([0.5, 6.0])  # sometimes every lease not extended runs out
        held = [t for t in held if schedule.holds(t, now)]
        _, _, commit, meta = part.snapshot()
        unsettled = [o for o in part.records] + [
            seg.first + i for seg in part.segs for i, b in enumerate(seg.state) if b == 0
        ]
        assert commit == min(unsettled, default=part.next_offset)  # the lowest unsettled
        assert decode_metadata(commit, meta) == _expected_states(part)


def test_run_tokens_never_meet_book_tokens_however_many_runs_were_leased(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long-lived process leases runs without end (prefetch 1: one per message); a
    run's token must never fall into the LeaseBook's range (2**40 and up) or stop
    naming its lease (the old encoding did after 2**29 runs: every ack LeaseExpired)."""
    import itertools

    from brokerkit.backends.kafka import _segments

    monkeypatch.setattr(_segments, "_run_ids", itertools.count(1 << 45))
    schedule, (part,) = _setup()
    _feed(schedule, part, _plain_run(0, 3), 0.0)
    _feed(schedule, part, [StubMessage(3, dedup_id="d")], 0.0)
    taken = schedule.take(10, 0.0)
    tokens = _tokens(taken)
    assert len(set(tokens)) == 4 and len(taken.runs) == 1 and len(taken.records) == 1
    for token in tokens:
        assert schedule.holds(token, 0.0)
        schedule.settle(token, 0.0)
    schedule.apply_moved(0.0)
    assert part.commit_point() == 4 and len(schedule) == 0
