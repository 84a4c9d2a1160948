"""Handing records to librdkafka's producer and collecting their delivery reports.

``Batch`` counts down the reports of one ``publish`` call; ``produce`` hands over one
record, waiting (bounded) while librdkafka's queue is full.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from brokerkit.backends import ErrorMap, PublishResult, publish_results

__all__ = ["Batch", "Headers", "produce"]

Headers = list[tuple[str, str | bytes | None]]
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


class Batch:
    """The delivery reports of one ``publish`` call, counted down where they are served.

    Reports are served by ``poll`` on the poll thread or on the event loop's
    thread (``publish`` polls too). Each stores its record's ``Message``; the
    last one completes the batch's future: at once when served on the loop's own
    thread, else with one ``call_soon_threadsafe`` per batch (not one future per
    record). The ids are built on the loop in ``results``.
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
        self.reports: list[Any] = [None] * size
        self.future: asyncio.Future[None] = loop.create_future()
        self.future.add_done_callback(_retrieve)
        if size == 0:
            self.future.set_result(None)

    def report(self, index: int, err: KafkaError | None, msg: Any) -> None:
        """librdkafka's delivery report (whichever thread called ``poll``)."""
        if err is None:
            self.reports[index] = msg
        elif self._error is None:
            self._error = err
        if next(self._counted) == self._last:
            self._wake()

    def shrink(self, produced: int) -> None:
        """Only ``produced`` records were handed over (a produce call failed)."""
        for _ in range(len(self.reports) - produced):
            if next(self._counted) == self._last:
                self._wake()

    def results(self) -> list[PublishResult]:
        """One ``PublishResult`` per record, id ``"<partition>-<offset>"`` (all reports in);
        ``unknown_offset_id`` for a record librdkafka delivered without an offset."""
        ids = [f"{m.partition()}-{m.offset()}" for m in self.reports]
        if "N" in "".join(ids):  # "<partition>-None": one join, no check per record
            ids = [
                unknown_offset_id(m.partition()) if m.offset() is None else i
                for m, i in zip(self.reports, ids, strict=True)
            ]
        return publish_results(ids)

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
