"""Publishing: SendMessage for one message, SendMessageBatch chunks for many.

Chunks hold at most 10 entries and 1 MiB (SQS's per-call limits, counted as SQS counts
them). Several chunks are in flight at once (as many as the connection's pool has
threads), except that a chunk waits for every earlier
chunk that shares a fifo group with it (entries of one call keep their order within a
group; two calls in flight do not). Failed entries are retried where SQS says the fault
was its own and the group order allows it (every entry has a deduplication id, so a
retried entry that SQS did accept is suppressed, not doubled); otherwise the publish
raises, saying how many SQS accepted: nothing it refused is reported as published.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from brokerkit.backends import BrokerRefused, MessageTooLarge, Outgoing, PublishResult
from brokerkit.backends.sqs._codec import encode
from brokerkit.backends.sqs._link import BATCH, Link

__all__ = ["MESSAGE_LIMIT", "publish"]

MESSAGE_LIMIT = 1024 * 1024
"""SQS's limit per message and per SendMessageBatch call (body + attributes), in bytes."""
_RETRIES = 3


def _entries(messages: Sequence[Outgoing], dedup: Sequence[str | None]) -> list[tuple[Any, int]]:
    out = []
    for i, message in enumerate(messages):
        entry, size = encode(message)
        if dedup[i] is not None:
            entry["MessageDeduplicationId"] = dedup[i]
        if size > MESSAGE_LIMIT:
            raise MessageTooLarge(
                f"message {i} is {size} bytes on the wire (body, headers and brokerkit's "
                f"attributes); SQS takes at most {MESSAGE_LIMIT}"
            )
        out.append((entry, size))
    return out


def _chunks(entries: list[tuple[Any, int]]) -> list[list[int]]:
    chunks: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, (_, size) in enumerate(entries):
        if current and (len(current) == BATCH or total + size > MESSAGE_LIMIT):
            chunks.append(current)
            current, total = [], 0
        current.append(i)
        total += size
    if current:
        chunks.append(current)
    return chunks


async def publish(
    link: Link,
    url: str,
    messages: Sequence[Outgoing],
    dedup: Sequence[str | None],
    grouped: Sequence[bool],
) -> list[PublishResult]:
    """Publish ``messages`` in order; ``dedup`` overrides dedup ids, ``grouped`` marks the
    messages whose fifo group is the user's (only those constrain concurrency)."""
    entries = _entries(messages, dedup)
    if len(entries) == 1:
        entry = entries[0][0]
        reply = await link.call("send_message", QueueUrl=url, **entry)
        return [PublishResult(str(reply["MessageId"]))]
    ids: list[str | None] = [None] * len(entries)
    last: dict[str, asyncio.Task[None]] = {}
    tasks: list[asyncio.Task[None]] = []
    for chunk in _chunks(entries):
        groups = {entries[i][0]["MessageGroupId"] for i in chunk if grouped[i]}
        after = {last[g] for g in groups if g in last}
        # a chunk that waits for nobody goes to the pool at once: its threads (``threads=``)
        # bound how many calls are in flight, and a thread that finishes one call takes the
        # next without a trip through the event loop
        started = None if after else _start(link, url, entries, chunk)
        task = asyncio.ensure_future(_send_chunk(link, url, entries, chunk, ids, after, started))
        for g in groups:
            last[g] = task
        tasks.append(task)
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            accepted = sum(1 for i in ids if i is not None)
            if isinstance(outcome, BrokerRefused | MessageTooLarge):
                outcome.args = (
                    f"{outcome.args[0]} ({accepted} of the {len(ids)} messages were accepted)",
                )
            raise outcome
    return [PublishResult(i) for i in ids if i is not None]


def _start(
    link: Link, url: str, entries: list[tuple[Any, int]], todo: list[int]
) -> asyncio.Future[Any]:
    batch = [{"Id": str(i), **entries[i][0]} for i in todo]
    return link.start("send_message_batch", QueueUrl=url, Entries=batch)


async def _send_chunk(
    link: Link,
    url: str,
    entries: list[tuple[Any, int]],
    chunk: list[int],
    ids: list[str | None],
    after: set[asyncio.Task[None]],
    started: asyncio.Future[Any] | None,
) -> None:
    if after:
        await asyncio.gather(*after)  # an earlier chunk of one of its groups failed: raise
    todo = list(chunk)
    for attempt in range(_RETRIES + 1):
        future = started if started is not None else _start(link, url, entries, todo)
        started = None
        with link.errors:
            reply = await future
        for ok in reply.get("Successful") or ():
            ids[int(ok["Id"])] = str(ok["MessageId"])
        failed = sorted(reply.get("Failed") or (), key=lambda f: int(f["Id"]))
        if not failed:
            return
        first = failed[0]
        code = str(first.get("Code", ""))
        retry = not any(f.get("SenderFault") for f in failed) and attempt < _RETRIES
        todo = [int(f["Id"]) for f in failed]
        if retry:
            # order within a group: a failed entry must not follow an accepted later one
            lowest = todo[0]
            later_groups = {entries[i][0]["MessageGroupId"] for i in chunk if i > lowest and ids[i]}
            retry = not any(entries[i][0]["MessageGroupId"] in later_groups for i in todo)
        if not retry:
            if code in ("MessageTooLong", "BatchRequestTooLong"):
                raise MessageTooLarge(f"SQS refused message {first['Id']}: {code}")
            raise BrokerRefused(
                f"SQS refused message {first['Id']} of the batch: {code}: "
                f"{first.get('Message', '')}",
                code=code,
            )
        await asyncio.sleep(0.1 * 2**attempt)
