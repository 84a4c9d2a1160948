"""Handing records to librdkafka's producer and collecting their delivery reports.

``Batch`` counts down the reports of one ``publish`` call; ``produce`` hands over one
record, waiting (bounded) while librdkafka's queue is full; ``produce_plain`` hands over
the plain records of a call (no key, no headers) in ``produce_batch`` calls.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from brokerkit.backends import ErrorMap, Outgoing, PublishResult, publish_results

__all__ = [
    "MESSAGE_SET",
    "Batch",
    "Headers",
    "PartitionTurn",
    "plain_bodies",
    "produce",
    "produce_plain",
]

Headers = list[tuple[str, str | bytes | None]]
MESSAGE_SET = 500
"""Records per ``produce_batch`` call, and librdkafka's ``batch.num.messages`` (set by
``KafkaLink``): a partition holding this many unsent records sends them at once instead
of waiting out ``linger``, so a plain ``publish_many`` of 500 goes at once, while smaller
calls and records produced one by one (fifo groups, dedup ids, headers) still share
requests for up to ``linger``. 4 tasks each awaiting ``publish_many(500)``: 0.46-0.51 of
the flush-once raw producer with librdkafka's 10 000, 0.65-0.67 with 500 (2026-12-05)."""
PRODUCE_BATCH = hasattr(Producer, "produce_batch")
"""confluent-kafka 2.12 and later: plain records go in batches (``produce_plain``)."""
_FULL_WAIT = 30.0
"""Longest ``produce`` waits for room in librdkafka's queue."""
_unknown_offsets = itertools.count(1)
"""Numbers the records delivered without an offset (``unknown_offset_id``)."""


async def produce(
    producer: Producer,
    topic: str,
    body: bytes,
    key: bytes | None,
    headers: Headers | None,
    on_delivery: Callable[[KafkaError | None, Any], None],
    errors: ErrorMap,
) -> None:
    """``Producer.produce``; waits (bounded) while librdkafka's queue is full."""
    with errors:
        try:
            producer.produce(topic, value=body, key=key, headers=headers, on_delivery=on_delivery)
            return
        except BufferError:
            pass
        deadline = time.monotonic() + _FULL_WAIT
        while True:
            await asyncio.sleep(0.005)
            try:
                producer.produce(
                    topic, value=body, key=key, headers=headers, on_delivery=on_delivery
                )
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise


def unknown_offset_id(partition: int) -> str:
    """The id of a record that librdkafka reported delivered without an offset:
    ``"<partition>-?<n>"``, ``n`` unique in the process.

    librdkafka does so for records acknowledged implicitly (a send whose fate was unknown,
    a timeout or a dropped connection, then a later batch of the partition succeeded, so
    the broker has them) and for a resend the broker answered as a duplicate
    (``DUPLICATE_SEQUENCE_NUMBER``, "treat as success, however offset and timestamp will
    be invalid"). The record is written; where, the producer is not told.
    """
    return f"{partition}-?{next(_unknown_offsets)}"


def plain_bodies(messages: Sequence[Outgoing]) -> list[bytes] | None:
    """The bodies for ``produce_plain`` if every message is plain (no fifo_group, dedup id
    or headers) and this confluent-kafka has ``produce_batch``, else None."""
    if not PRODUCE_BATCH:
        return None
    for m in messages:
        if m.headers or m.fifo_group is not None or m.dedup_id is not None:
            return None
    return [m.body for m in messages]


class PartitionTurn:
    """Which partition of one topic the next plain records go to: the same one while
    they fit in its ``MESSAGE_SET``, then the next in turn.

    librdkafka sends a partition's records at once when ``MESSAGE_SET`` of them wait,
    instead of after ``linger``. A ``publish_many`` of 500 fills one alone; the
    coalescer's batches of 250 (many tasks each awaiting ``publish()``) fill one two by
    two, where turning at each call sent each batch alone after ``linger`` or a flush.
    A call of a whole set starts a partition of its own, so it is sent at once.
    """

    __slots__ = ("_filled", "_turn")

    def __init__(self) -> None:
        self._turn = 0
        self._filled = 0

    def next(self, partitions: int, records: int) -> int:
        """The partition (of ``partitions``) for the next ``records`` records (at most
        ``MESSAGE_SET``)."""
        if self._filled + records > MESSAGE_SET:
            self._turn += 1
            self._filled = 0
        self._filled += records
        return self._turn % partitions


def produce_plain(
    producer: Producer,
    topic: str,
    next_partition: Callable[[int], int],
    bodies: list[bytes],
    batch: Batch,
) -> tuple[list[int], bool]:
    """Hand ``bodies`` (records without key or headers) to librdkafka in ``produce_batch``
    calls of up to ``MESSAGE_SET``, each to the partition ``next_partition`` gives for
    that many records. Returns the indexes it did not take (its queue full, a partition
    unknown...), to be handed over one by one, and whether a partition was unknown to it
    (the topic has fewer partitions than when it was declared).

    One call and one callback for ``MESSAGE_SET`` records instead of a ``produce`` and a
    callback object per record (0.77 us less per record, measured 2026-12-05). Their
    reports carry no index: each chunk goes to one partition (its callback is that
    partition's, ``Batch.run_report``), and in one partition of an idempotent producer
    the offsets follow the order the records were produced in, so ``Batch.results``
    pairs them by offset. (librdkafka's own partitioner sticks keyless
    records to one partition for a while too; a large call is spread by its chunks.)
    ``batch.run_taken`` counts what was handed over, also when a call raised.
    """
    failed: list[int] = []
    unknown = False
    slots = batch.run_slots
    for start in range(0, len(bodies), MESSAGE_SET):
        records: list[dict[str, Any]] = [
            {"value": body} for body in bodies[start : start + MESSAGE_SET]
        ]
        partition = next_partition(len(records))
        taken = producer.produce_batch(
            topic, records, partition=partition, on_delivery=batch.run_report(partition)
        )
        batch.run_taken += taken
        mine = slots.setdefault(partition, [])
        if taken == len(records):
            mine.extend(range(start, start + taken))
            continue
        for i, record in enumerate(records, start):
            error = record.get("_error")
            if error is None:
                mine.append(i)
            else:
                failed.append(i)
                unknown = unknown or error.code() == KafkaError._UNKNOWN_PARTITION
    return failed, unknown


class Batch:
    """The delivery reports of one ``publish`` call, counted down where they are served.

    Reports are served by ``poll`` on the poll thread or on the event loop's
    thread (``publish`` polls too). Each keeps what its record's id needs, never the
    report's ``Message``; the last one completes the batch's future: at once when served
    on the loop's own thread, else with one ``call_soon_threadsafe`` per batch (not one
    future per record).

    Records handed over by ``produce_plain`` (the *run*) report to their partition's
    ``run_report`` instead, without an index: their offsets are matched to the call's
    records in ``results``, partition by partition.

    Why not the ``Message``: one kept per record until the call returns is an object the
    garbage collector tracks and then scans, young and, having survived, old (a full
    collection every ~70 000 records). Freed as soon as its report returns (an int kept
    instead), 4 tasks each awaiting ``publish_many(500)`` ran ~1.2x faster (2026-12-05).
    """

    __slots__ = (
        "_counted",
        "_error",
        "_errors",
        "_last",
        "_loop",
        "_loop_thread",
        "future",
        "reports",
        "run_offsets",
        "run_slots",
        "run_taken",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int, errors: ErrorMap):
        self._loop = loop
        self._loop_thread = threading.get_ident()  # made on the loop's thread
        self._errors = errors
        self._counted = itertools.count()
        """Each report (and each record ``shrink`` gives up on) takes one number;
        ``next`` is atomic, so exactly one taker gets the last number and wakes the loop."""
        self._last = size - 1
        self._error: KafkaError | None = None
        self.reports: list[str | None] = [None] * size
        """The id of each record reported with its index (``report``)."""
        self.run_offsets: dict[int, list[int | None]] = {}
        """Per partition, the offsets the run's reports gave, in the order they came."""
        self.run_slots: dict[int, list[int]] = {}
        """Per partition, the indexes of the run's records sent to it, in produce order."""
        self.run_taken = 0
        """How many records ``produce_plain`` handed over."""
        self.future: asyncio.Future[None] = loop.create_future()
        self.future.add_done_callback(_retrieve)
        if size == 0:
            self.future.set_result(None)

    def report(self, index: int, err: KafkaError | None, msg: Any) -> None:
        """librdkafka's delivery report (whichever thread called ``poll``)."""
        if err is None:
            offset = msg.offset()
            self.reports[index] = (
                f"{msg.partition()}-{offset}"
                if offset is not None
                else unknown_offset_id(msg.partition())
            )
        elif self._error is None:
            self._error = err
        if next(self._counted) == self._last:
            self._wake()

    def run_report(self, partition: int) -> Callable[[KafkaError | None, Any], None]:
        """The delivery report callback of the run's records sent to ``partition``."""
        keep = self.run_offsets.setdefault(partition, []).append
        counted, last = self._counted, self._last

        def report(err: KafkaError | None, msg: Any) -> None:
            if err is None:
                keep(msg.offset())
            elif self._error is None:
                self._error = err
            if next(counted) == last:
                self._wake()

        return report

    def shrink(self, produced: int) -> None:
        """Only ``produced`` records were handed over (a produce call failed)."""
        for _ in range(len(self.reports) - produced):
            if next(self._counted) == self._last:
                self._wake()

    def results(self) -> list[PublishResult]:
        """One ``PublishResult`` per record, id ``"<partition>-<offset>"`` (all reports in).

        The run's records are paired with their reports by offset, partition by partition
        (an idempotent producer writes one partition's records in the order they were
        produced). Where a report has no offset (``unknown_offset_id``), its record cannot
        be told from the others of its partition in this call: each of them gets an
        ``unknown_offset_id`` rather than a guess. A report outside the run has its index:
        only that record does.
        """
        run, out = self.run_offsets, self.reports
        if len(run) == 1:
            ((partition, offsets),) = run.items()
            if len(offsets) == len(out) and None not in offsets:  # the common case: one chunk
                offsets.sort()  # produce order (they come in it anyway)
                prefix = f"{partition}-"
                return publish_results([prefix + str(offset) for offset in offsets])
        for partition, got in run.items():
            mine = self.run_slots[partition]
            if None in got:
                for slot in mine:
                    out[slot] = unknown_offset_id(partition)
                continue
            got.sort()  # produce order
            prefix = f"{partition}-"
            for slot, offset in zip(mine, got, strict=True):
                out[slot] = prefix + str(offset)
        return publish_results(out)  # type: ignore[arg-type]  # every slot is filled

    def _wake(self) -> None:
        if threading.get_ident() == self._loop_thread:
            # served by a poll(0) of publish: no self-pipe write, no extra loop turn
            self._finish()
            return
        try:
            self._loop.call_soon_threadsafe(self._finish)
        except RuntimeError:  # the event loop is gone: nobody awaits this batch
            pass

    def _finish(self) -> None:
        if self.future.done():
            return
        if self._error is not None:
            failure = KafkaException(self._error)
            mapped = self._errors.translate(failure)
            exc: BaseException = mapped if mapped is not None else failure
            exc.__cause__ = failure if mapped is not None else None
            self.future.set_exception(exc)
        else:
            self.future.set_result(None)


def _retrieve(fut: asyncio.Future[None]) -> None:
    """Mark an abandoned batch's error as seen (the caller got the produce error instead)."""
    if not fut.cancelled():
        fut.exception()
