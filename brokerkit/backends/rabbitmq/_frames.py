"""Many AMQP frames in one socket write, on an aiormq channel.

aiormq writes every ``basic_publish`` and every ``basic_ack`` as its own socket write
(profiled: the largest single cost of both publish and consume+ack). Here a batch of
publishes, or of acks, is marshalled into one ``ChannelFrame`` and queued once. The
publish confirms are registered exactly as ``Channel.basic_publish`` registers them
(``confirmations`` and ``message_id_delivery_tag`` under the channel's lock), so aiormq's
own reader resolves them (ack, nack, return) and fails them if the channel closes.

This leans on aiormq 6.x-7.x channel attributes; ``supported(channel)`` says whether the
channel has them, and callers fall back to the public, one-write-per-frame methods.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiormq
from aiormq.abc import ChannelFrame
from pamqp.body import ContentBody
from pamqp.commands import Basic
from pamqp.header import ContentHeader

__all__ = ["publish_batch", "send_acks", "supported"]

_NEEDED = ("confirmations", "message_id_delivery_tag", "delivery_tag", "write_queue", "lock")


def supported(channel: aiormq.abc.AbstractChannel) -> bool:
    return all(hasattr(channel, name) for name in _NEEDED) and bool(
        getattr(channel, "publisher_confirms", False)
    )


async def publish_batch(
    channel: Any, items: Sequence[tuple[str, bytes, Basic.Properties]]
) -> list[asyncio.Future[Any]]:
    """Queue ``items`` (routing key, body, properties) as one write; return each confirm.

    Each future resolves to ``Basic.Ack``, ``Basic.Nack`` or the returned message
    (mandatory, unroutable), as aiormq's ``basic_publish`` would return.
    """
    max_size = channel.max_content_size
    frames: list[Any] = []
    futures: list[asyncio.Future[Any]] = []
    async with channel.lock:
        confirmations = channel.confirmations
        by_id = channel.message_id_delivery_tag
        for routing_key, body, props in items:
            channel.delivery_tag += 1
            tag = channel.delivery_tag
            # the channel's own future, as aiormq's basic_publish makes it: a closing
            # connection fails it (else a publish in flight at a broker kill waits out
            # request_timeout for a confirm that cannot come)
            fut = channel.create_future()
            confirmations[tag] = fut
            message_id = str(props.message_id)
            by_id[message_id] = tag
            fut.add_done_callback(_forget(by_id, message_id, tag))
            futures.append(fut)
            frames.append(Basic.Publish(exchange="", routing_key=routing_key, mandatory=True))
            frames.append(ContentHeader(properties=props, body_size=len(body)))
            if len(body) < max_size:
                if body:
                    frames.append(ContentBody(body))
            else:
                frames.extend(
                    ContentBody(body[i : i + max_size]) for i in range(0, len(body), max_size)
                )
        # the connection's write queue is bounded (aiormq: 10 frames): wait for room, as
        # aiormq's own writes do (put_nowait raised QueueFull under a loaded soak run)
        await channel.write_queue.put(
            ChannelFrame.marshall(channel_number=channel.number, frames=frames)
        )
    return futures


def _forget(by_id: dict[str, int], message_id: str, tag: int) -> Any:
    def forget(_: asyncio.Future[Any]) -> None:
        if by_id.get(message_id) == tag:
            del by_id[message_id]

    return forget


async def send_acks(channel: Any, acks: Sequence[int], lowest_unacked: int | None) -> None:
    """Ack ``acks``: one ``multiple`` ack for those below the lowest tag still unacked (all
    of them when none is), single acks for the rest; in one write where supported."""
    below = [t for t in acks if lowest_unacked is None or t < lowest_unacked]
    singles = [t for t in acks if lowest_unacked is not None and t > lowest_unacked]
    up_to = max(below) if below else None
    if supported(channel):
        await _write_acks(channel, singles, up_to)
        return
    if up_to is not None:
        await channel.basic_ack(up_to, multiple=True, wait=False)
    for tag in singles:
        await channel.basic_ack(tag, wait=False)


async def _write_acks(channel: Any, tags: Sequence[int], multiple_up_to: int | None) -> None:
    """Queue one ``multiple`` ack (if given) and single acks for ``tags``, in one write."""
    frames: list[Any] = []
    if multiple_up_to is not None:
        frames.append(Basic.Ack(delivery_tag=multiple_up_to, multiple=True))
    frames.extend(Basic.Ack(delivery_tag=tag) for tag in tags)
    if frames:  # bounded queue: wait for room (see publish_batch)
        await channel.write_queue.put(
            ChannelFrame.marshall(channel_number=channel.number, frames=frames)
        )
