"""A small publish sent at once, by a thread of its own, instead of after ``linger.ms``.

librdkafka holds a record up to ``linger.ms`` for more to share its request. A publish of
64 or more records made while no other one is in flight ends with ``flush(1 ms)`` on the
loop (``KafkaBackend.publish``); a smaller one used to wait out the linger: one awaited
``publish()`` took 2.5 ms with the default 2 ms, and 50 tasks each publishing one message
at a time got 17k msgs/s. librdkafka sends at once while a ``flush`` runs, but ``flush``
blocks its caller until the reports are in (or its timeout), which the loop must not do
for every small message; ``flush(0)`` returns before librdkafka's broker thread looks,
and the record still waits out the linger. So such a publish asks this thread to flush:
the loop goes on at once, the record is sent at once, and its report is served here as
soon as it arrives (the last report of a call wakes the loop, as from the poll thread).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import Producer

__all__ = ["Sender"]

_log = logging.getLogger(__name__)

FLUSH_SLICE = 0.005
"""One flush of the thread lasts at most this; it flushes again while the asking call is
unconfirmed and records are in the producer. While a flush runs, linger is off for every
record: one flush of 0.1 s (which under load lasts its whole timeout, the producer never
being empty) measured 129k-140k msgs/s for 500 tasks publishing at once, against 142k
without the thread; slices that stop once the asking call is confirmed, 131k-141k
against 124k-143k in five alternating runs. One slice alone was too short: a record of a
topic new to the producer waited for metadata past it, then out the linger."""
FLUSH_CAP = 1.0
"""Longest the thread flushes for one call (a broker that does not answer); the poll
thread serves what comes later."""


class Sender:
    """The thread that flushes when ``send_now`` asks (see the module docstring)."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self._wanted = threading.Event()
        self._done: Callable[[], bool] = _never_asked
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name="brokerkit-kafka-sender", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def send_now(self, done: Callable[[], bool]) -> None:
        """Have the records in the producer sent now, until ``done()`` (the asking call is
        confirmed); the loop does not wait for it."""
        self._done = done
        self._wanted.set()

    async def stop(self) -> None:
        self._stopping = True
        self._wanted.set()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, 5.0)

    def _run(self) -> None:
        producer = self._producer
        while True:
            self._wanted.wait()
            if self._stopping:
                return
            self._wanted.clear()  # before flushing: a later ask is seen after this one
            done = self._done
            # a record of a topic new to the producer waits for its metadata first: one
            # short flush would end before it is sent, and it would wait out the linger
            give_up = time.monotonic() + FLUSH_CAP
            try:
                while not self._stopping and len(producer) and not done():
                    producer.flush(FLUSH_SLICE)
                    if time.monotonic() > give_up:
                        break
            except Exception:  # a fatal producer error: publish reports it, not this thread
                _log.debug("kafka sender flush failed", exc_info=True)


def _never_asked() -> bool:
    return True
