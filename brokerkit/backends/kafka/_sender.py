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

from confluent_kafka import Producer

__all__ = ["Sender"]

_log = logging.getLogger(__name__)

FLUSH_WAIT = 0.005
"""Longest one flush blocks the thread (it returns as soon as every record in the producer
is confirmed). It only has to outlast the broker thread's wake-up, which sends what is
queued; reports that come later are the poll thread's. While it runs, linger is off for
every record: with 0.1 s, 500 tasks publishing at once measured 129k-140k msgs/s against
142k before; with 5 ms, 145k-151k."""


class Sender:
    """The thread that flushes when ``send_now`` asks (see the module docstring)."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self._wanted = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name="brokerkit-kafka-sender", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def send_now(self) -> None:
        """Have the records in the producer sent now (the loop does not wait for it)."""
        self._wanted.set()

    async def stop(self) -> None:
        self._stopping = True
        self._wanted.set()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, 5.0)

    def _run(self) -> None:
        while True:
            self._wanted.wait()
            if self._stopping:
                return
            self._wanted.clear()  # before the flush: a later ask gets a flush of its own
            try:
                self._producer.flush(FLUSH_WAIT)
            except Exception:  # a fatal producer error: publish reports it, not this thread
                _log.debug("kafka sender flush failed", exc_info=True)
