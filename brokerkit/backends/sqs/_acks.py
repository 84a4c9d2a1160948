"""Coalesced acks: DeleteMessageBatch of up to 10 receipt handles, within a bounded window.

``add`` returns at once; the handles go out when 10 are pending or ``interval`` seconds
after the first (``capabilities.ack_flush_interval``), and on ``flush`` (the receiver
flushes before a ReceiveMessage when a fifo group waits on an ack, and on close).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from brokerkit.backends.sqs._link import BATCH, Link, batches

__all__ = ["AckBatcher"]

_log = logging.getLogger(__name__)


class AckBatcher:
    def __init__(self, link: Link, queue_url: str, interval: float) -> None:
        self._link = link
        self._url = queue_url
        self._interval = interval
        self._pending: list[str] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.urgent = False
        """True while a pending ack holds back a fifo group (flush before receiving)."""

    def add(self, handle: str, *, urgent: bool = False) -> None:
        self._pending.append(handle)
        self.urgent = self.urgent or urgent
        if len(self._pending) >= BATCH:
            self._send(self._take())
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._on_timer)

    def _take(self) -> list[str]:
        handles, self._pending = self._pending, []
        self.urgent = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return handles

    def _on_timer(self) -> None:
        self._timer = None
        if self._pending:
            self._send(self._take())

    def _send(self, handles: list[str]) -> None:
        for chunk in batches(handles):
            task = asyncio.ensure_future(self._delete(list(chunk)))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _delete(self, handles: list[str]) -> None:
        entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(handles)]
        try:
            reply: Any = await self._link.call(
                "delete_message_batch", QueueUrl=self._url, Entries=entries
            )
        except Exception as exc:  # the messages come back when their leases end
            _log.warning("SQS DeleteMessageBatch of %d acks failed: %s", len(entries), exc)
            return
        for failed in reply.get("Failed") or ():
            _log.warning(
                "SQS did not delete an acked message (%s: %s); it will be delivered again",
                failed.get("Code"),
                failed.get("Message"),
            )

    async def flush(self) -> None:
        """Send everything pending and wait for every delete in flight."""
        if self._pending:
            self._send(self._take())
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
