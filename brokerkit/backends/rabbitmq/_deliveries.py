"""A consumer's deliveries handed to its callback in the channel's reader, not a task each.

aiormq runs every delivery's consumer callback in a task of its own
(``Channel._on_deliver_frame``: ``create_task``, its wrapper, the channel's future store
and a done callback): 10-20 us of the 80-100 us of CPU a delivery cost a receiver
(docs/backends/rabbitmq.md, Throughput). A receiver's callback is synchronous and short:
it files the delivery and returns. ``consume`` registers such a callback so the channel's
reader calls it as soon as the delivery's body is read, in delivery order, on the
reader's task. An exception from it is logged, as aiormq logs a failed callback task,
and the channel reads on.

This leans on aiormq 7.x channel internals (``_on_deliver_frame``, ``_get_frame``,
``_read_content``, ``consumers``). Where a channel lacks them, ``consume`` is plain
``basic_consume``: the callback still gets every delivery, through aiormq's task. Other
consumers on the channel (any not made here), and a delivery for a consumer tag aiormq
already dropped (cancelled), keep aiormq's path.
"""

from __future__ import annotations

import logging
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import aiormq
from pamqp.commands import Basic
from pamqp.header import ContentHeader

__all__ = ["consume", "direct_callbacks"]

_log = logging.getLogger(__name__)

Callback = Callable[[aiormq.abc.DeliveredMessage], None]

_NEEDED = ("_on_deliver_frame", "_get_frame", "_read_content", "consumers", "number")
_tables: weakref.WeakKeyDictionary[Any, dict[str, Callback]] = weakref.WeakKeyDictionary()


async def consume(
    channel: aiormq.abc.AbstractChannel,
    queue: str,
    callback: Callback,
    **kwargs: Any,
) -> Basic.ConsumeOk:
    """``channel.basic_consume(queue, callback, **kwargs)`` with ``callback`` called
    directly by the channel's reader (see the module docstring)."""
    as_aiormq_takes: Any = callback  # aiormq wraps a plain function (``tools.awaitable``)
    table = direct_callbacks(channel)
    if table is None:
        return await channel.basic_consume(queue, as_aiormq_takes, **kwargs)
    # the tag is ours before the request goes out: deliveries may come before ConsumeOk
    tag = kwargs.pop("consumer_tag", None) or f"ctag{channel.number}.{uuid.uuid4().hex}"
    table[tag] = callback
    try:
        return await channel.basic_consume(queue, as_aiormq_takes, consumer_tag=tag, **kwargs)
    except BaseException:
        table.pop(tag, None)
        raise


def direct_callbacks(channel: Any) -> dict[str, Callback] | None:
    """The channel's table of direct callbacks by consumer tag (its reader installed on
    first use), or None where the channel lacks the internals it needs."""
    table = _tables.get(channel)
    if table is not None:
        return table
    if not all(hasattr(channel, name) for name in _NEEDED):
        return None
    table = {}
    channel._on_deliver_frame = _reader_for(channel, table)  # the instance's, not the class's
    _tables[channel] = table
    return table


def _reader_for(channel: Any, table: dict[str, Callback]) -> Callable[[Basic.Deliver], Any]:
    """``Channel._on_deliver_frame``, calling a direct callback instead of a task."""
    aiormqs_own = channel._on_deliver_frame
    get_frame, read_content = channel._get_frame, channel._read_content

    async def on_deliver_frame(frame: Basic.Deliver) -> None:
        tag = frame.consumer_tag
        # aiormq drops a tag from its consumers at basic.cancel, or at the broker's cancel
        callback = table.get(tag) if tag is not None and tag in channel.consumers else None
        if callback is None:  # not ours, or cancelled: aiormq's own path (task, or dropped)
            await aiormqs_own(frame)
            return
        header = await get_frame()
        if not isinstance(header, ContentHeader):  # as aiormq checks it
            raise ValueError(f"Unexpected frame {header!r} instead of ContentHeader", header)
        message = await read_content(frame, header)
        try:
            callback(message)
        except Exception:
            _log.exception("RabbitMQ consumer callback failed (consumer %s)", frame.consumer_tag)

    return on_deliver_frame
