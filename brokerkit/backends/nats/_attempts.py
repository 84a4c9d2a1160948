"""AttemptBook: how often a redelivered message was really handed out, kept on the server.

JetStream counts a delivery (``num_delivered``) when it *sends* a message, so whatever a
receiver fetched ahead and never handed out (its process killed while the caller held a
poison message, a release) is counted as an attempt too: a poison that kills its
consumers would push its neighbours past ``max_attempts``, into the DLQ. JetStream has
no uncounted ``-NAK``, so the receiver keeps its own count, durable (a killed process
cannot write anything down), in a stream beside the queue's::

    stream <prefix>_a_Q   subjects <prefix>.a.Q.>   max_msgs_per_subject = 1
        <prefix>.a.Q.<group>.<stream seq>           payload: an integer, as ASCII

A first delivery (``num_delivered == 1``) is attempt 1 and costs nothing: no record is
read or written on the hot path. A redelivery reads its record ``c`` (none: 0) and is
attempt ``c + 2`` (the first delivery is taken as handed out); before it is handed out
the record becomes ``c + 1``, and its PubAck is awaited, so a crash right after the
hand-out still counts it. A release (a delivery handed to the facade, never to the
caller) writes ``attempt - 2``: its next delivery has the same attempt. A delivery the
receiver gives back unseen (stale in its inbox, or there at close) is not counted either:
a redelivery's record was not raised (it was never taken), and a first delivery's record
is written down to -1 (``uncount_first``), since JetStream counted its send. Records
live ``max_age`` like the messages (the stream is created by ``declare`` or on the first
write that finds none, and deleted with the queue).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

from brokerkit.backends.nats._ackreply import ack_reply
from brokerkit.backends.nats._layout import QueueLayout
from brokerkit.backends.nats._link import NatsLink

__all__ = ["AttemptBook", "attempts_stream", "declare_attempts"]

_STREAM_EXISTS = 10058


def attempts_stream(prefix: str, queue: str) -> str:
    """The name of queue ``queue``'s attempts stream."""
    return f"{prefix}_a_{queue}"


class AttemptBook:
    """The hand-out counts of one consumer group's redeliveries from one queue."""

    def __init__(self, link: NatsLink, layout: QueueLayout, group: str) -> None:
        prefix, _, queue = layout.subject_root.split(".", 2)
        self._link = link
        self.stream = attempts_stream(prefix, queue)
        self._wildcard = f"{prefix}.a.{queue}.>"
        self._root = f"{prefix}.a.{queue}.{group}."
        self._made = False

    async def counts(self, seqs: Sequence[int]) -> list[int]:
        """The record of each stream sequence (0 where there is none)."""
        return list(await asyncio.gather(*(self._count(seq) for seq in seqs)))

    async def _count(self, seq: int) -> int:
        try:
            msg = await self._link.js.get_last_msg(self.stream, self._root + str(seq))
        except nats.js.errors.NotFoundError:  # no record, or no stream yet
            return 0
        try:
            return int(msg.data or b"0")
        except ValueError:
            return 0

    async def uncount_first(self, msgs: Sequence[Msg]) -> None:
        """First deliveries given back unseen: record -1, so the next is attempt 1 again."""
        replies = [ack_reply(m) for m in msgs]
        await self.record([(r.stream_seq, -1) for r in replies if r.num_delivered == 1])

    async def record(self, items: Sequence[tuple[int, int]]) -> None:
        """Write (stream sequence, count) each; returns once the server stored them all."""
        if not items:
            return
        try:
            await self._write(items)
        except nats.js.errors.NoStreamResponseError:
            if self._made:
                raise
            await self._make()  # the first record of this queue: no stream takes it yet
            await self._write(items)

    async def _write(self, items: Sequence[tuple[int, int]]) -> None:
        js = self._link.js
        timeout = self._link.options.request_timeout
        await asyncio.gather(
            *(
                js.publish(self._root + str(seq), b"%d" % count, timeout=timeout)
                for seq, count in items
            )
        )

    async def _make(self) -> None:
        await _add_stream(self._link, self.stream, self._wildcard)
        self._made = True


async def declare_attempts(link: NatsLink, prefix: str, queue: str) -> None:
    """Create queue ``queue``'s attempts stream (idempotent; ``declare`` calls it)."""
    await _add_stream(link, attempts_stream(prefix, queue), f"{prefix}.a.{queue}.>")


async def _add_stream(link: NatsLink, name: str, wildcard: str) -> None:
    opts = link.options
    config = StreamConfig(
        name=name,
        description="brokerkit attempts of redelivered messages",
        subjects=[wildcard],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE if opts.storage == "file" else StorageType.MEMORY,
        num_replicas=opts.replicas,
        max_age=opts.max_age,
        max_msgs_per_subject=1,
        discard=DiscardPolicy.OLD,
    )
    try:
        await link.js.add_stream(config)
    except nats.js.errors.BadRequestError as exc:
        if getattr(exc, "err_code", None) != _STREAM_EXISTS:
            raise
