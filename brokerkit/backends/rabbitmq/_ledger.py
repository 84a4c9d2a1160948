"""Deduplication with every bit of state in RabbitMQ: a ledger stream per queue.

Invariant: for a dedup id ``d``, the message delivered is the one whose record comes
first, in stream order, among the records of ``d`` whose window is still open; every
other copy published inside that window is acked unseen. The stream is one totally
ordered log, so every reader that applies the same rule to it agrees on the winner.

* A publisher stamps each message with its dedup id, publish time and window end
  (``_codec.DEDUP_STAMP_HEADER``); nothing else happens at publish time (``duplicate``
  is None: the publisher cannot tell).
* A receiver tails ``<prefix>.<queue>.ledger`` from ``now - window - 60 s`` on start,
  keeping ``dedup id -> (message id, window end)`` of each id's first open record.
* Before a message with a dedup id is handed out: if the ledger names it, it is a
  redelivery (deliver); if it names another message whose window is open at this
  message's publish time, it is a duplicate (ack, never delivered). Otherwise the
  receiver appends a record for it (publisher confirm), waits until its own tail read
  it back (so every earlier record has been read too), and applies the rule again.

Crash cases: before the append, nothing changed (the message is redelivered and decided
again); after the append but before the ack, the redelivery finds its own record (same
message id: delivered again, at-least-once); a duplicate acked unseen is only ever acked
after the winner's record was confirmed and read back, so a restart rebuilds the same
decision from the stream. Copies racing on several consumers each append; the first
record wins for all of them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import UTC, datetime, timedelta

import aiormq
from pamqp.commands import Basic

from brokerkit.backends import BrokerRefused
from brokerkit.backends.rabbitmq._codec import new_id
from brokerkit.backends.rabbitmq._link import Link
from brokerkit.backends.rabbitmq._topology import Topology, stream_arguments

__all__ = ["Ledger"]

_log = logging.getLogger(__name__)

_HORIZON_MARGIN = 60.0
_PREFETCH = 1000
_PRUNE_EVERY = 1024


class Ledger:
    """The dedup ledger of one queue, as read by one connection."""

    def __init__(self, link: Link, topology: Topology, window: float) -> None:
        self._link = link
        self._stream = topology.ledger
        self._horizon = window + _HORIZON_MARGIN
        self._first: dict[str, tuple[str, int]] = {}
        self._waiting: dict[str, asyncio.Future[None]] = {}
        self._channel: aiormq.abc.AbstractChannel | None = None
        self._starting: asyncio.Future[None] | None = None
        self._applied = 0

    async def admit(self, dedup_id: str, message_id: str, stamp: tuple[int, int] | None) -> bool:
        """True to deliver this message, False for a duplicate inside an open window."""
        published = stamp[0] if stamp else int(time.time() * 1000)
        until = stamp[1] if stamp else published + int(self._horizon * 1000)
        await self._started()
        verdict = self._verdict(dedup_id, message_id, published)
        if verdict is not None:
            return verdict
        nonce = new_id()
        seen = asyncio.get_running_loop().create_future()
        self._waiting[nonce] = seen
        record = {"d": dedup_id, "m": message_id, "t": published, "u": until, "n": nonce}
        try:
            publisher = await self._link.publisher()
            with self._link.errors:
                confirm = await publisher.basic_publish(
                    json.dumps(record, separators=(",", ":")).encode(),
                    routing_key=self._stream,
                    properties=Basic.Properties(delivery_mode=2),
                    mandatory=True,
                    timeout=self._link.options.request_timeout,
                )
            if not isinstance(confirm, Basic.Ack):
                raise BrokerRefused(f"the dedup ledger {self._stream!r} refused a record")
            await asyncio.wait_for(seen, self._link.options.request_timeout)
        finally:
            self._waiting.pop(nonce, None)
        verdict = self._verdict(dedup_id, message_id, published)
        return bool(verdict)

    def _verdict(self, dedup_id: str, message_id: str, published: int) -> bool | None:
        first = self._first.get(dedup_id)
        if first is None:
            return None
        if first[0] == message_id:
            return True  # a redelivery of the winner
        if published < first[1]:
            return False  # a duplicate inside the winner's window
        return None  # the window closed: this one needs a record of its own

    async def _started(self) -> None:
        channel = self._channel
        if channel is not None and not channel.is_closed:
            return
        if self._starting is None or self._starting.done():
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        link = self._link
        await link.ensure(self._stream, stream_arguments())
        self._first.clear()  # rebuilt from the stream, from the horizon on
        channel, _ = await link.channel()
        with link.errors:
            await channel.basic_qos(prefetch_count=_PREFETCH)
            start = datetime.now(UTC) - timedelta(seconds=self._horizon)
            await channel.basic_consume(
                self._stream,
                lambda message: self._on_record(channel, message),
                arguments={"x-stream-offset": start},
            )
        self._channel = channel

    async def _on_record(
        self, channel: aiormq.abc.AbstractChannel, message: aiormq.abc.DeliveredMessage
    ) -> None:
        try:
            record = json.loads(message.body)
            dedup_id, message_id = str(record["d"]), str(record["m"])
            published, until = int(record["t"]), int(record["u"])
            nonce = str(record.get("n", ""))
        except (ValueError, KeyError, TypeError):
            record = None
        if record is not None:
            first = self._first.get(dedup_id)
            if first is None or published >= first[1]:
                self._first[dedup_id] = (message_id, until)
            seen = self._waiting.pop(nonce, None)
            if seen is not None and not seen.done():
                seen.set_result(None)
            self._applied += 1
            if self._applied % _PRUNE_EVERY == 0:
                self._prune()
        tag = getattr(message.delivery, "delivery_tag", None)
        if isinstance(tag, int) and not channel.is_closed:
            await channel.basic_ack(tag, wait=False)

    def _prune(self) -> None:
        now = int(time.time() * 1000) - int(_HORIZON_MARGIN * 1000)
        for key in [k for k, (_, until) in self._first.items() if until < now]:
            del self._first[key]

    async def aclose(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None and not channel.is_closed:
            try:
                await asyncio.wait_for(channel.close(), 5)
            except (aiormq.exceptions.AMQPError, OSError, TimeoutError, RuntimeError):
                pass
