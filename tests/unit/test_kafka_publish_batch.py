"""``Batch``, the delivery reports of one Kafka ``publish``: who completes its future.

No broker: the reports are fed by hand, from the loop's thread (as ``publish``'s own
``poll(0)``/``flush`` serve them) and from another thread (as the poll thread does).
"""

from __future__ import annotations

import asyncio
import threading

import pytest

pytest.importorskip("confluent_kafka")

from _kafka_stub import StubMessage
from confluent_kafka import KafkaError

from brokerkit.backends import BrokerUnavailable, HostPort
from brokerkit.backends.kafka._errors import error_map
from brokerkit.backends.kafka._produce import MESSAGE_SET, Batch, PartitionTurn

ERRORS = error_map((HostPort("127.0.0.1", 9092),))


async def test_reports_served_on_the_loop_thread_complete_the_batch_at_once() -> None:
    batch = Batch(asyncio.get_running_loop(), 2, ERRORS)
    batch.report(0, None, StubMessage(10, 3))
    assert not batch.future.done()  # one report still missing
    batch.report(1, None, StubMessage(11, 3))
    # no loop turn in between: publish's own poll(0)/flush needs no self-pipe wake-up
    assert batch.future.done()
    await batch.future
    assert [r.id for r in batch.results()] == ["3-10", "3-11"]


async def test_reports_served_on_another_thread_wake_the_loop() -> None:
    batch = Batch(asyncio.get_running_loop(), 2, ERRORS)

    def poll_thread() -> None:
        batch.report(1, None, StubMessage(5, 0))
        batch.report(0, None, StubMessage(4, 0))

    thread = threading.Thread(target=poll_thread)
    thread.start()
    thread.join()
    assert not batch.future.done()  # completed on the loop, by call_soon_threadsafe
    await asyncio.wait_for(batch.future, 5.0)
    assert [r.id for r in batch.results()] == ["0-4", "0-5"]


async def test_a_failed_report_fails_the_whole_batch_on_either_path() -> None:
    loop = asyncio.get_running_loop()
    failed = KafkaError(KafkaError._MSG_TIMED_OUT)
    here = Batch(loop, 2, ERRORS)
    here.report(0, failed, None)
    here.report(1, None, StubMessage(1, 0))
    with pytest.raises(BrokerUnavailable, match=r"127\.0\.0\.1:9092"):
        await here.future
    there = Batch(loop, 1, ERRORS)
    thread = threading.Thread(target=there.report, args=(0, failed, None))
    thread.start()
    thread.join()
    with pytest.raises(BrokerUnavailable, match=r"127\.0\.0\.1:9092"):
        await asyncio.wait_for(there.future, 5.0)


async def test_a_shrunk_batch_completes_once_the_produced_records_reported() -> None:
    batch = Batch(asyncio.get_running_loop(), 3, ERRORS)
    batch.report(0, None, StubMessage(7, 0))
    batch.shrink(1)  # the second produce call failed: two records never handed over
    assert batch.future.done()


async def test_a_record_delivered_without_an_offset_gets_an_id_of_its_own() -> None:
    """librdkafka reports some records delivered with no offset (``Message.offset()``
    None): records acknowledged implicitly by a later batch's success after a send whose
    fate was unknown, or a resend the broker answered as a duplicate. Their ids used to be
    ``"<partition>-None"``, the same string for every such record."""
    batch = Batch(asyncio.get_running_loop(), 4, ERRORS)
    for index, offset in enumerate((None, 8, None, 9)):
        batch.report(index, None, StubMessage(offset, 2))
    await batch.future
    ids = [r.id for r in batch.results()]
    assert ids[1::2] == ["2-8", "2-9"]  # the others keep the broker's id
    assert len(set(ids)) == 4, ids  # one id each, even where the broker gave none
    for unknown in ids[0::2]:
        assert unknown.startswith("2-?"), ids  # its partition; the offset is not known
        assert "None" not in unknown, ids
    again = Batch(asyncio.get_running_loop(), 1, ERRORS)
    again.report(0, None, StubMessage(None, 2))
    await again.future
    assert again.results()[0].id not in ids  # unique in the process, not per call


async def test_a_run_is_matched_to_its_records_by_offset_whatever_the_report_order() -> None:
    # produce_plain sent records 0-2 to partition 2 and 3-4 to partition 0, in two
    # chunks: reports carry no index, and come in any order across threads
    batch = Batch(asyncio.get_running_loop(), 5, ERRORS)
    batch.run_slots = {2: [0, 1, 2], 0: [3, 4]}
    for offset, partition in ((41, 2), (7, 0), (40, 2), (42, 2), (6, 0)):
        batch.run_report(partition)(None, StubMessage(offset, partition))
    await asyncio.wait_for(batch.future, 5.0)
    assert [r.id for r in batch.results()] == ["2-40", "2-41", "2-42", "0-6", "0-7"]


async def test_records_the_run_did_not_take_keep_their_own_reports_and_places() -> None:
    # produce_batch took records 0, 2 and 4; 1 and 3 (queue full) went one by one after
    batch = Batch(asyncio.get_running_loop(), 5, ERRORS)
    batch.run_slots = {0: [0, 2, 4]}
    batch.report(3, None, StubMessage(9, 5))
    for offset in (10, 11, 12):
        batch.run_report(0)(None, StubMessage(offset, 0))
    batch.report(1, None, StubMessage(8, 4))
    await asyncio.wait_for(batch.future, 5.0)
    assert [r.id for r in batch.results()] == ["0-10", "4-8", "0-11", "5-9", "0-12"]


async def test_a_failed_report_of_the_run_fails_the_whole_call() -> None:
    batch = Batch(asyncio.get_running_loop(), 2, ERRORS)
    batch.run_slots = {1: [0, 1]}
    batch.run_report(1)(None, StubMessage(1, 1))
    batch.run_report(1)(KafkaError(KafkaError._MSG_TIMED_OUT), None)
    with pytest.raises(BrokerUnavailable):
        await asyncio.wait_for(batch.future, 5.0)


async def test_a_call_in_one_chunk_is_paired_by_offset_too() -> None:
    batch = Batch(asyncio.get_running_loop(), 3, ERRORS)
    batch.run_slots = {4: [0, 1, 2]}
    for offset in (12, 10, 11):
        batch.run_report(4)(None, StubMessage(offset, 4))
    await asyncio.wait_for(batch.future, 5.0)
    assert [r.id for r in batch.results()] == ["4-10", "4-11", "4-12"]


async def test_a_run_with_a_report_without_an_offset_names_none_of_that_partition() -> None:
    """A run's reports carry no index: paired by offset, a record without one cannot be
    placed, so no record of that partition in this call gets a guessed offset. The other
    partitions, and the records reported with their index, keep the broker's ids."""
    batch = Batch(asyncio.get_running_loop(), 6, ERRORS)
    batch.run_slots = {1: [0, 1, 2], 3: [3, 4]}
    for offset, partition in ((20, 1), (None, 1), (21, 1), (50, 3), (51, 3)):
        batch.run_report(partition)(None, StubMessage(offset, partition))
    batch.report(5, None, StubMessage(None, 0))  # produced one by one: its own report
    await asyncio.wait_for(batch.future, 5.0)
    ids = [r.id for r in batch.results()]
    assert ids[3:5] == ["3-50", "3-51"]
    assert all(i.startswith("1-?") for i in ids[:3]), ids
    assert ids[5].startswith("0-?"), ids
    assert len(set(ids)) == 6, ids
    one = Batch(asyncio.get_running_loop(), 2, ERRORS)  # the one-chunk shortcut too
    one.run_slots = {4: [0, 1]}
    one.run_report(4)(None, StubMessage(7, 4))
    one.run_report(4)(None, StubMessage(None, 4))
    await asyncio.wait_for(one.future, 5.0)
    assert all(r.id.startswith("4-?") for r in one.results())


def test_plain_records_fill_a_partition_with_a_message_set_before_the_turn_moves_on() -> None:
    turn = PartitionTurn()
    half = MESSAGE_SET // 2
    # two batches of half a set (the coalescer's) share a partition: librdkafka then
    # holds a full set for it and sends at once, instead of each after linger
    first = turn.next(6, half)
    assert turn.next(6, half) == first
    second = turn.next(6, MESSAGE_SET)  # a whole publish_many(500) fills one alone
    assert second == (first + 1) % 6
    third = turn.next(6, 1)
    assert third == (second + 1) % 6
    assert turn.next(6, MESSAGE_SET - 2) == third  # fits: 1 + 498
    assert turn.next(6, 2) == (third + 1) % 6  # does not fit in what is left (1)
    assert [turn.next(1, MESSAGE_SET) for _ in range(3)] == [0, 0, 0]  # one partition
    assert all(0 <= turn.next(3, 7) < 3 for _ in range(200))
