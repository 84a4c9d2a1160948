"""browse and stats: the topic read by a consumer with no group of its own, and the
groups' committed offsets read through the AdminClient. Blocking; run in a thread.

Nothing is written: the reader ``assign()``s partitions (it never joins a group, never
commits, so no group appears on the broker), and commits are only read.

What "still in the queue" means (as on memory://): a record is shown and counted while
some brokerkit consumer group of the topic (Kafka group ``<topic>.<group>``) has not
settled it: at or above the group's committed offset and not ``SETTLED`` in its commit
metadata. With no group yet, every retained record is (a new group starts at the low
watermark). Records a consumer would skip as a duplicate dedup id are skipped too (the
reader replays the dedup window before its start, as a receiver does).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from brokerkit.backends import (
    NO_HEADERS,
    BrokerUnavailable,
    DedupWindow,
    Delivery,
    HostPort,
    QueueStats,
)
from brokerkit.backends.kafka._codec import TOMBSTONE, decode_headers
from brokerkit.backends.kafka._link import KafkaLink
from brokerkit.backends.kafka._offsets import SETTLED, OffsetState, decode_metadata

__all__ = ["browse_topic", "stats_topic"]

_TIMEOUT = 10.0
_READ_DEADLINE = 30.0
_DEDUP_MARGIN_MS = 1000
"""Replay the dedup window this much further back (the receivers' own margin)."""


@dataclass(frozen=True, slots=True)
class _Commit:
    """One group's committed position on one partition and the states above it."""

    offset: int
    states: Mapping[int, OffsetState]

    def settled(self, offset: int) -> bool:
        if offset < self.offset:
            return True
        state = self.states.get(offset)
        return state is not None and state.count == SETTLED


def _partitions(admin: AdminClient, topic: str) -> list[int] | None:
    meta = admin.list_topics(topic=topic, timeout=_TIMEOUT).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        return None
    return sorted(meta.partitions)


def _groups(admin: AdminClient, topic: str) -> list[str]:
    listing = admin.list_consumer_groups(request_timeout=_TIMEOUT).result()
    return sorted(g.group_id for g in listing.valid if g.group_id.startswith(f"{topic}."))


def _commits(
    admin: AdminClient, group_id: str, topic: str, parts: list[int], low: Mapping[int, int]
) -> dict[int, _Commit]:
    """The group's commit per partition (no commit: the low watermark, as a new member)."""
    asked = ConsumerGroupTopicPartitions(group_id, [TopicPartition(topic, p) for p in parts])
    (future,) = admin.list_consumer_group_offsets([asked], request_timeout=_TIMEOUT).values()
    out: dict[int, _Commit] = {}
    for tp in future.result().topic_partitions:
        if tp.offset == OFFSET_INVALID or tp.offset < low[tp.partition]:
            out[tp.partition] = _Commit(low[tp.partition], {})
        else:
            out[tp.partition] = _Commit(tp.offset, decode_metadata(tp.offset, tp.metadata))
    return out


class _Reader:
    """A group-less consumer over one topic (``assign`` only, never a commit)."""

    def __init__(self, link: KafkaLink, topic: str) -> None:
        conf = link.admin_config()
        conf.update(
            {
                "group.id": f"brokerkit-browse-{secrets.token_hex(8)}",  # never joined
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": False,
                "fetch.wait.max.ms": 100,
            }
        )
        self.topic = topic
        with link.errors:
            self.consumer = Consumer(conf)

    def watermarks(self, parts: list[int]) -> tuple[dict[int, int], dict[int, int]]:
        low: dict[int, int] = {}
        high: dict[int, int] = {}
        for p in parts:
            tp = TopicPartition(self.topic, p)
            low[p], high[p] = self.consumer.get_watermark_offsets(tp, _TIMEOUT, cached=False)
        return low, high

    def offsets_since(self, parts: list[int], since_ms: int) -> dict[int, int]:
        asked = [TopicPartition(self.topic, p, since_ms) for p in parts]
        found = self.consumer.offsets_for_times(asked, timeout=_TIMEOUT)
        return {tp.partition: tp.offset for tp in found}

    def close(self) -> None:
        self.consumer.close()


def _state(
    admin: AdminClient, reader: _Reader, parts: list[int]
) -> tuple[dict[int, int], dict[int, int], dict[str, dict[int, _Commit]]]:
    """Watermarks, then each group's commits (a record published in between is above
    both: it counts as unsettled, as it is)."""
    low, high = reader.watermarks(parts)
    topic = reader.topic
    commits = {g: _commits(admin, g, topic, parts, low) for g in _groups(admin, topic)}
    return low, high, commits


def _needed(commits: list[dict[int, _Commit]], p: int, offset: int) -> bool:
    return not commits or any(not c[p].settled(offset) for c in commits)


def browse_topic(
    link: KafkaLink, admin: AdminClient, topic: str, limit: int, dedup_window: float | None
) -> list[Delivery[None]]:
    """Up to ``limit`` unsettled records, merged over partitions by (timestamp, partition,
    offset); ``attempt`` 0, ``extras`` the partition, offset and timestamp."""
    parts = _partitions(admin, topic) if limit > 0 else None
    if parts is None:
        return []
    with link.errors:
        reader = _Reader(link, topic)
        try:
            return _read(reader, link, admin, parts, limit, dedup_window)
        finally:
            reader.close()


def _read(
    reader: _Reader,
    link: KafkaLink,
    admin: AdminClient,
    parts: list[int],
    limit: int,
    dedup_window: float | None,
) -> list[Delivery[None]]:
    low, high, by_group = _state(admin, reader, parts)
    commits = list(by_group.values())
    start = {p: min((c[p].offset for c in commits), default=low[p]) for p in parts}
    begin = dict(start)
    windows: dict[int, DedupWindow] = {}
    clock = [0.0]
    if dedup_window is not None:
        since = int(time.time() * 1000) - int(dedup_window * 1000) - _DEDUP_MARGIN_MS
        for p, at in reader.offsets_since(parts, since).items():
            if at >= 0:
                begin[p] = max(low[p], min(begin[p], at))
            windows[p] = DedupWindow(dedup_window * 1000.0, clock=lambda: clock[0])
    active = {p for p in parts if begin[p] < high[p] and start[p] < high[p]}
    kept: dict[int, list[tuple[tuple[int, int, int], Delivery[None]]]] = {p: [] for p in parts}
    if active:
        reader.consumer.assign([TopicPartition(reader.topic, p, begin[p]) for p in active])
    deadline = time.monotonic() + _READ_DEADLINE
    while active and time.monotonic() < deadline:
        for msg in reader.consumer.consume(500, 0.5):
            part, offset = msg.partition(), msg.offset()
            if msg.error() is not None or part is None or offset is None or part not in active:
                continue
            p = part
            if offset + 1 >= high[p]:
                active.discard(p)
            if offset >= high[p]:
                continue
            raw: Any = msg.headers()
            headers: Mapping[str, str] = NO_HEADERS
            group = dedup = defect = None
            if raw:
                headers, group, dedup, defect = decode_headers(raw, msg.key)
            stamp = msg.timestamp()[1]
            if dedup is not None and p in windows:
                clock[0] = float(stamp)
                if windows[p].claim(dedup, "") is not None:
                    continue  # a consumer skips it as a duplicate
            if offset < start[p] or not _needed(commits, p, offset):
                continue
            extras: dict[str, Any] = {"partition": p, "offset": offset, "timestamp": stamp}
            value = msg.value()
            if value is None:
                defect = defect or TOMBSTONE
            body = value or b""
            delivery = Delivery(
                f"{p}-{offset}", body, headers, group, dedup, 0, None, extras, defect
            )
            kept[p].append(((stamp, p, offset), delivery))
            if len(kept[p]) >= limit:
                active.discard(p)
    if active:
        host = link.hosts[0] if link.hosts else HostPort("localhost", 9092)
        raise BrokerUnavailable(
            f"kafka: browsing {reader.topic!r} did not reach the end of partitions "
            f"{sorted(active)} within {_READ_DEADLINE:.0f} s",
            host=host.host,
            port=host.port,
        )
    merged = sorted((item for items in kept.values() for item in items), key=lambda i: i[0])
    return [d for _, d in merged[:limit]]


def stats_topic(
    link: KafkaLink, admin: AdminClient, topic: str, group_id: str | None
) -> QueueStats:
    """From the watermarks and committed offsets (see the docs page for what is exact)."""
    parts = _partitions(admin, topic)
    if parts is None:
        return QueueStats(ready=0) if group_id is None else QueueStats(0, None, 0)
    with link.errors:
        reader = _Reader(link, topic)
        try:
            low, high, by_group = _state(admin, reader, parts)
        finally:
            reader.close()
    commits = list(by_group.values())
    if group_id is None:
        needed = 0
        for p in parts:
            floor = min((c[p].offset for c in commits), default=low[p])
            needed += high[p] - floor
            # offsets in [floor, high) every group settled
            base = min(commits, key=lambda c: c[p].offset)[p] if commits else None
            if base is not None:
                needed -= sum(
                    1
                    for o, s in base.states.items()
                    if s.count == SETTLED and o < high[p] and not _needed(commits, p, o)
                )
        return QueueStats(ready=needed)
    mine = by_group.get(group_id)
    if mine is None:  # a new group would start at the low watermark
        return QueueStats(sum(high[p] - low[p] for p in parts), None, 0)
    now_ms = time.time() * 1000
    ready = delayed = 0
    for p in parts:
        commit = mine[p]
        fresh = high[p] - commit.offset  # records at or above the commit...
        for o, s in commit.states.items():
            if o < high[p]:
                fresh -= 1  # ...less those settled, counted or due later
                if s.count != SETTLED and s.due_ms > now_ms:
                    delayed += 1
        ready += fresh
    # in flight: a record with a delivery count is leased, or was nacked or lost its
    # lease and waits for a redelivery; the commit does not tell which
    return QueueStats(ready, None, delayed)
