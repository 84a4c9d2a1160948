"""Fetch flow control of a consumer thread: hold first, pause only a stuck partition.

The event loop publishes what it holds above each partition's commit point (offsets,
bytes: ``ConsumerThread.backlog``). When a partition holds too much (``PAUSE_SPAN`` /
``PAUSE_BYTES``) the thread must stop handing it records until the commit point has
moved (below ``RESUME_SPAN`` / ``RESUME_BYTES``). There are two ways, and they cost
very differently:

* **hold**: the thread stops calling ``consume`` for a moment. librdkafka keeps what it
  prefetched and stops fetching by itself at its own queue limits (``queued.min.messages``,
  ``queued.max.messages.kbytes``); the next ``consume`` continues from its local queue
  at once. A busy consumer drains its backlog in milliseconds, so this is the common
  case. It stops every partition of the consumer, and rebalance callbacks (served by
  ``consume``) wait meanwhile, so a hold lasts at most ``HOLD``.
* **pause**: ``Consumer.pause`` of that one partition. librdkafka purges the partition's
  prefetched records, and after ``resume`` its fetcher starts again only at the broker
  thread's next periodic wake-up (measured: ~0.5-1 s per pause, however short the pause
  was; the resume op does not wake the broker thread). Pausing on every high-water mark
  made a one-partition backlog cost ~1 s per ``PAUSE_SPAN`` offsets: consumption got
  slower the more was waiting (43k msgs/s at 20 000 waiting, 10k at 100 000). So a
  partition is paused only once it stayed over its limit for ``HOLD``: a stuck
  partition (its head nacked with a delay, a slow handler), whose other partitions and
  rebalances must keep flowing.

Thread-side only, except ``backlog`` which the loop writes (one dict item per write).
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from brokerkit.backends.kafka._partition import (
    PAUSE_BYTES,
    PAUSE_SPAN,
    RESUME_BYTES,
    RESUME_SPAN,
    Key,
)

__all__ = ["HOLD", "FlowControl"]

LOG = logging.getLogger(__name__)

HOLD = 0.5
"""Longest the thread holds off ``consume`` for a full partition before pausing it."""


class FlowControl:
    """Which partitions are full, held or paused; see the module docstring."""

    __slots__ = ("_full", "backlog", "paused")

    def __init__(self) -> None:
        self.backlog: dict[Key, tuple[int, int]] = {}
        """(offsets, bytes) held above each partition's commit point: written by the loop."""
        self._full: dict[Key, float] = {}
        """Partitions over their limit (not back under the resume mark), since when."""
        self.paused: set[Key] = set()

    def hold(self, consumer: Any, assigned: set[Key], now: float) -> bool:
        """Update the state from the backlog; True while ``consume`` must wait (a
        partition is full and not paused yet). Pauses what stayed full for ``HOLD``,
        resumes what is back under its resume mark."""
        backlog, full, paused = self.backlog, self._full, self.paused
        to_pause: list[Key] = []
        to_resume: list[Key] = []
        holding = False
        for key in assigned:
            span, size = backlog.get(key, (0, 0))
            since = full.get(key)
            if since is None:
                if span >= PAUSE_SPAN or size >= PAUSE_BYTES:
                    full[key] = now
                    holding = True
                continue
            if span < RESUME_SPAN and size < RESUME_BYTES:
                del full[key]
                if key in paused:
                    to_resume.append(key)
            elif key not in paused:
                if now - since >= HOLD:
                    to_pause.append(key)
                else:
                    holding = True
        for key in [k for k in full if k not in assigned]:
            del full[key]
        paused.intersection_update(assigned)
        try:
            if to_pause:
                consumer.pause([TopicPartition(t, p) for t, p in to_pause])
                paused.update(to_pause)
            if to_resume:
                consumer.resume([TopicPartition(t, p) for t, p in to_resume])
                paused.difference_update(to_resume)
        except KafkaException as exc:
            LOG.debug("kafka pause/resume: %s", exc)
        return holding
