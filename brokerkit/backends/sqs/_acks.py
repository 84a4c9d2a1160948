"""Coalesced acks: DeleteMessageBatch of up to 10 receipt handles, within a bounded window.

``add`` returns at once; the handles go out when 10 are pending or ``interval`` seconds
after the first (``capabilities.ack_flush_interval``), and on ``flush`` (the receiver
flushes before a ReceiveMessage when a fifo group waits on an ack, and on close).

The window is kept by a timer thread, not by the event loop: the deletes it sends go
from that thread too. A loop timer fires only when the loop runs, so a loop held up (a
handler that blocks, a busy process) would stretch the window by as much: measured in
the broker restart behaviour, an ack that returned 0.19 s before the emulator was killed
came back with the loop 0.1 s late.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any

from brokerkit.backends.sqs._link import BATCH, Link, batches

__all__ = ["AckBatcher"]

_log = logging.getLogger(__name__)


class AckBatcher:
    def __init__(self, link: Link, queue_url: str, interval: float) -> None:
        self._link = link
        self._url = queue_url
        self._interval = interval
        self._lock = threading.Lock()
        """Guards ``_pending``, ``_timer`` and ``_sending`` (the timer thread takes them too)."""
        self._pending: list[str] = []
        self._timer: threading.Timer | None = None
        self._sending: set[concurrent.futures.Future[None]] = set()
        self.urgent = False
        """True while a pending ack holds back a fifo group (flush before receiving)."""

    def add(self, handle: str, *, urgent: bool = False) -> None:
        with self._lock:
            self._pending.append(handle)
            self.urgent = self.urgent or urgent
            if len(self._pending) < BATCH:
                if self._timer is None:
                    # half the window: the rest is for the delete's round trip, so the
                    # ack is on SQS within the declared interval, not only sent by then
                    self._timer = threading.Timer(self._interval / 2, self._on_timer)
                    self._timer.daemon = True
                    self._timer.start()
                return
            handles = self._take()
        self._send(handles)

    def _take(self) -> list[str]:
        """What is pending, and no timer (under ``_lock``)."""
        handles, self._pending = self._pending, []
        self.urgent = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return handles

    def _on_timer(self) -> None:
        """The window ended (in the timer's thread): delete from here."""
        with self._lock:
            self._timer = None
            handles = self._take() if self._pending else []
            chunks = [(list(chunk), self._started()) for chunk in batches(handles)]
        for chunk, done in chunks:
            self._delete(chunk, done)

    def _started(self) -> concurrent.futures.Future[None]:
        """A delete on its way, which ``flush`` waits for (under ``_lock``)."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._sending.add(done)
        return done

    def _send(self, handles: list[str]) -> None:
        """From the loop: each chunk of 10 deleted in the link's executor."""
        for chunk in batches(handles):
            with self._lock:
                done = self._started()
            try:
                self._link.executor.submit(self._delete, list(chunk), done)
            except RuntimeError:  # the connection's executor is shut down: delete here
                self._delete(list(chunk), done)

    def _delete(self, handles: list[str], done: concurrent.futures.Future[None]) -> None:
        """DeleteMessageBatch, in a thread; failures are logged (the messages come back
        when their leases end)."""
        entries = [{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(handles)]
        try:
            reply: Any = self._link.run("delete_message_batch", QueueUrl=self._url, Entries=entries)
        except Exception as exc:
            _log.warning("SQS DeleteMessageBatch of %d acks failed: %s", len(entries), exc)
        else:
            for failed in reply.get("Failed") or ():
                _log.warning(
                    "SQS did not delete an acked message (%s: %s); it will be delivered again",
                    failed.get("Code"),
                    failed.get("Message"),
                )
        finally:
            with self._lock:
                self._sending.discard(done)
            done.set_result(None)

    async def flush(self) -> None:
        """Send everything pending and wait for every delete in flight."""
        with self._lock:
            handles = self._take() if self._pending else []
        if handles:
            self._send(handles)
        with self._lock:
            sending = list(self._sending)
        if sending:
            await asyncio.gather(*(asyncio.wrap_future(f) for f in sending))
