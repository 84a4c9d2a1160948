"""browse and stats: read-only JetStream API calls (no consumer made, none changed).

* browse -> ``STREAM.MSG.GET`` (``js.get_msg(seq, next=True)``) message by message over
  the stream's subjects, from the lowest ack floor of any consumer group on that
  message's slot: no consumer is created, so no ``num_delivered`` changes and nothing
  is left behind. A message is shown while some group's durable for its slot has not
  acked it up to its ack floor (every retained message when there is no group yet).
  NATS does not publish acks above a floor, so a message of the unordered slot acked
  out of order still shows until the floor passes it.
* stats -> ``STREAM.INFO`` and ``CONSUMER.LIST`` (``consumers_info``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime

import nats.js.errors
from nats.js.api import ConsumerInfo

from brokerkit.backends import Delivery, QueueStats
from brokerkit.backends.nats._layout import QueueLayout, decode_headers
from brokerkit.backends.nats._link import NatsLink

__all__ = ["browse_stream", "stats_stream"]

_DURABLE = re.compile(r"^(?:u|p(\d+))_(.+)$")
_SLOT = re.compile(r"\.(?:u|p\.(\d+))$")


def _slot_of_durable(name: str) -> tuple[str, int] | None:
    """(group, slot) of a brokerkit durable (``u_G`` slot 0, ``p<n>_G`` slot n + 1)."""
    found = _DURABLE.match(name)
    if found is None:
        return None
    return found.group(2), 0 if found.group(1) is None else int(found.group(1)) + 1


def _slot_of_subject(subject: str) -> int:
    found = _SLOT.search(subject)
    if found is None:
        return -1
    return 0 if found.group(1) is None else int(found.group(1)) + 1


def _groups(consumers: Sequence[ConsumerInfo]) -> dict[str, dict[int, ConsumerInfo]]:
    out: dict[str, dict[int, ConsumerInfo]] = {}
    for info in consumers:
        found = _slot_of_durable(info.name)
        if found is not None:
            out.setdefault(found[0], {})[found[1]] = info
    return out


async def _consumers(link: NatsLink, stream: str) -> list[ConsumerInfo]:
    with link.errors(f"list the consumers of {stream!r}"):
        return list(await link.js.consumers_info(stream))


def _floor(info: ConsumerInfo) -> int:
    return info.ack_floor.stream_seq if info.ack_floor is not None else 0


async def browse_stream(
    link: NatsLink, layout: QueueLayout, limit: int, *, dead_letters: bool
) -> list[Delivery[None]]:
    """Up to ``limit`` messages some group still needs, in stream order (``attempt`` 0)."""
    if limit <= 0:
        return []
    groups = _groups(await _consumers(link, layout.stream))
    floors: dict[int, int] = {}  # slot -> lowest ack floor of any group (0: a group lacks it)
    for durables in groups.values():
        for slot in range(layout.partitions + 1):
            held = durables.get(slot)
            floor = _floor(held) if held is not None else 0
            floors[slot] = min(floors.get(slot, floor), floor)
    start = min(floors.values(), default=0) + 1
    out: list[Delivery[None]] = []
    js = link.js
    with link.errors(f"browse {layout.stream!r}"):
        while len(out) < limit:
            try:
                msg = await js.get_msg(layout.stream, seq=start, subject=layout.wildcard, next=True)
            except nats.js.errors.NotFoundError:
                break
            seq = msg.seq or start
            start = seq + 1
            if groups and seq <= floors.get(_slot_of_subject(msg.subject or ""), 0):
                continue  # every group acked it
            user, fifo_group, msg_id, defect = decode_headers(msg.headers, msg.subject, layout)
            dedup_id = None if dead_letters else msg_id
            extras = {"stream_sequence": seq, "published": msg.time}
            body = msg.data or b""
            out.append(
                Delivery(str(seq), body, user, fifo_group, dedup_id, 0, None, extras, defect)
            )
    return out


async def stats_stream(link: NatsLink, layout: QueueLayout, group: str | None) -> QueueStats:
    """ready = the group's ``num_pending`` (not yet delivered to it) summed over its
    durables; in flight and delayed are None (NATS counts leased, nacked-with-delay and
    run-out deliveries together as ``num_ack_pending``). A group not created yet would
    receive every retained message (``state.messages``). Without a group: what the one
    group still needs (``num_pending + num_ack_pending``), every retained message when
    there is none, None when several groups share the stream (NATS cannot tell their
    union)."""
    consumers = await _consumers(link, layout.stream)
    with link.errors(f"stream info of {layout.stream!r}"):
        state = (await link.js.stream_info(layout.stream)).state
    oldest = await browse_stream(link, layout, 1, dead_letters=False)
    age = None
    born = oldest[0].extras["published"] if oldest else None
    if isinstance(born, datetime):  # the server's clock at publish: exact as clocks agree
        born = born if born.tzinfo else born.replace(tzinfo=UTC)
        age = max(0.0, (datetime.now(UTC) - born).total_seconds())
    groups = _groups(consumers)
    if group is None:
        if not groups:
            return QueueStats(ready=state.messages, oldest_age=age)
        if len(groups) > 1:
            return QueueStats(oldest_age=age)
        (only,) = groups.values()
        needed = sum((c.num_pending or 0) + (c.num_ack_pending or 0) for c in only.values())
        return QueueStats(ready=needed, oldest_age=age)
    durables = groups.get(group)
    if not durables:
        return QueueStats(ready=state.messages, oldest_age=age)
    ready = sum(c.num_pending or 0 for c in durables.values())
    return QueueStats(ready=ready, oldest_age=age)
