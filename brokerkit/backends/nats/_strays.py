"""StraySweeper: messages on a subject of a queue's stream that no durable consumer reads.

A queue's stream takes every subject under ``<root>.>``, but brokerkit's durables filter
only ``<root>.u`` and ``<root>.p.<n>`` (``n`` below the partition count): a message a
foreign producer publishes on any other subject of the stream (``<root>.x``,
``<root>.p.99``) gets its PubAck and would be delivered to no one. So each receiver looks
for such subjects every ``SWEEP_EVERY`` seconds, in a task of its own (one stream info
request with per-subject counts; nothing when there is none), and moves every message it
finds onto ``<root>.u``, where every consumer group receives it like any other message
(as a foreign one, or dead-lettered when corrupt):

1. the copy is published with the original's body and headers, except the ``Nats-``
   headers (they steer the server: a ``Nats-Rollup`` would purge ``.u``, a
   ``Nats-Expected-*`` would fail), with ``Nats-Msg-Id = brokerkit-stray:<stream seq>``;
   its PubAck is awaited;
2. then the original is deleted (``delete_msg``).

Two receivers sweeping at once, or a crash between the steps, store no second copy
within the stream's dedup window; a step that fails is tried again at the next sweep.
"""

from __future__ import annotations

import asyncio
import logging

import nats.js.errors

from brokerkit.backends.nats._errors import BEST_EFFORT
from brokerkit.backends.nats._layout import DEDUP_HEADER, QueueLayout
from brokerkit.backends.nats._link import NatsLink

__all__ = ["SWEEP_EVERY", "StraySweeper", "sweep"]

SWEEP_EVERY = 2.0
"""Seconds between a receiver's looks for messages on subjects no durable reads."""
MOVES_PER_SWEEP = 100
"""Most messages one sweep moves (the rest wait for the next)."""
STRAY_ID = "brokerkit-stray:"
"""The Nats-Msg-Id of a moved copy: this, then the original's stream sequence."""

_NO_SUCH_SEQUENCE = 10043
"""JetStream's error code when the message to delete is gone already."""

_log = logging.getLogger("brokerkit.nats")


async def sweep(link: NatsLink, layout: QueueLayout) -> int:
    """Move what waits on the stream's unread subjects onto ``<root>.u``; return how many."""
    js = link.js
    try:
        info = await js.stream_info(layout.stream, subjects_filter=layout.wildcard)
    except nats.js.errors.NotFoundError:  # deleted meanwhile
        return 0
    read = set(layout.filters())
    strays = [s for s, n in (info.state.subjects or {}).items() if n and s not in read]
    target = layout.subject(None)
    moved = 0
    for subject in strays:
        seq = 1
        while moved < MOVES_PER_SWEEP:
            try:
                msg = await js.get_msg(layout.stream, seq=seq, subject=subject, next=True)
            except nats.js.errors.NotFoundError:
                break
            seq = (msg.seq or seq) + 1
            headers = {k: v for k, v in (msg.headers or {}).items() if k[:5].lower() != "nats-"}
            headers[DEDUP_HEADER] = f"{STRAY_ID}{seq - 1}"
            await js.publish(target, msg.data or b"", headers=headers)
            try:
                await js.delete_msg(layout.stream, seq - 1)
            except nats.js.errors.APIError as exc:
                if exc.err_code != _NO_SUCH_SEQUENCE:
                    raise
                continue  # a racing sweeper moved it
            moved += 1
    return moved


class StraySweeper:
    """One receiver's periodic ``sweep`` of its stream, in a task of its own."""

    def __init__(self, link: NatsLink, layout: QueueLayout) -> None:
        self._link = link
        self._layout = layout
        self._due = 0.0
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def poke(self, now: float) -> None:
        """Start a sweep if one is due (``now``: the loop's clock) and none is running."""
        if now < self._due or (self._task is not None and not self._task.done()):
            return
        self._due = now + SWEEP_EVERY
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            moved = await sweep(self._link, self._layout)
        except BEST_EFFORT as exc:  # tried again at the next sweep; said once per outage
            level = logging.DEBUG if self._failing else logging.WARNING
            self._failing = True
            _log.log(level, "%s: moving stray messages failed: %s", self._layout.stream, exc)
            return
        self._failing = False
        if moved:
            _log.warning(
                "%s: moved %d message(s) from subjects no consumer reads onto %s",
                self._layout.stream,
                moved,
                self._layout.subject(None),
            )

    async def aclose(self) -> None:
        """Stop a running sweep (what it left undone is done by the next one)."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])
