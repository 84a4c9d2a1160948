"""RedisReceiver: leases, settling and waiting for one consumer group of one stream."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import socket
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from redis import exceptions as rex

from brokerkit._errors import BrokerkitError, LeaseExpired
from brokerkit.backends.base import Delivery, Receiver, ReceiverSettings
from brokerkit.backends.redis_streams._keys import decode_entry, decode_fresh, encode_entry

if TYPE_CHECKING:
    from brokerkit.backends.redis_streams._backend import RedisBackend

__all__ = ["PARK", "RedisReceiver"]

log = logging.getLogger("brokerkit.redis")

PARK = "~park"
"""Pseudo consumer owning entries nobody holds: parked fifo entries, nacked ones."""
_ACK_BATCH = 512


def _consumer_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"


def _lost(delivery: Delivery) -> LeaseExpired:
    return LeaseExpired(f"the lease on message {delivery.id!r} was lost; it may be redelivered")


class RedisReceiver(Receiver):
    """One consumer (a unique Redis consumer name) of ``group`` on ``stream``.

    receive -> script TAKE (``XCLAIM`` due + ``XREADGROUP >``), then ``XREAD BLOCK`` on the
    stream and the group's bell; ack -> script ACK (coalesced up to
    ``ack_flush_interval`` for messages without a fifo_group); nack / release -> script
    NACK; dead_letter -> script DEAD; extend -> script EXTEND.
    """

    def __init__(
        self,
        backend: RedisBackend,
        stream: str,
        dlq: str,
        group: str,
        settings: ReceiverSettings,
    ) -> None:
        self._backend = backend
        self._stream = stream
        self._dlq = dlq
        self._group = group
        self._me = _consumer_name()
        self._due, self._bell, self._fprefix = backend.keys.group(stream, group)
        self._lease_ms = max(1, math.ceil(settings.ack_timeout * 1000))
        options = backend.options
        self._flush_interval = options.ack_flush_interval
        self._poll = options.poll_interval
        self._trim_interval = options.trim_interval
        self._next_trim = 0.0
        self._acks: list[Delivery] = []
        # id(delivery) -> loop time by which its lease surely still holds: taken *before*
        # the TAKE/EXTEND call, so never later than the server's due time. A coalesced ack
        # cannot learn of a lost lease in time; this lets ack() refuse a late one at once.
        self._deadline: dict[int, float] = {}
        self._ack_ready = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<RedisReceiver {self._stream} group={self._group!r} consumer={self._me!r}>"

    # -- receiving ---------------------------------------------------------------------------

    async def receive(self, max_messages: int, wait: float) -> list[Delivery]:
        """Lease up to ``max_messages``; block at most ``wait`` s (in slices of poll_interval)."""
        backend = self._backend
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        keys = (self._stream, self._due, self._bell)
        args = (self._group, self._me, max(1, max_messages), self._lease_ms, self._fprefix, PARK)
        while True:
            await self._maybe_trim(loop.time())
            holds_until = loop.time() + self._lease_ms / 1000
            reply = await self._take(keys, args)
            claimed, fresh = reply[4], reply[5]
            if claimed or fresh:
                out = [
                    decode_entry(claimed[i], claimed[i + 1], claimed[i + 2])
                    for i in range(0, len(claimed) - 2, 3)
                ]
                out += [decode_fresh(entry_id, flat) for entry_id, flat in fresh]
                deadline = self._deadline
                for delivery in out:
                    deadline[id(delivery)] = holds_until
                return out
            remaining = end - loop.time()
            if remaining <= 0:
                return []
            block = min(remaining, self._poll)
            now_ms, next_due = int(reply[0]), reply[1]
            if next_due is not None:
                block = min(block, max(float(next_due) - now_ms, 1.0) / 1000)
            cursor = reply[2] or b"0-0"
            bell = reply[3] or b"0-0"
            block_ms = max(1, int(block * 1000))
            await backend.command(
                "XREAD",
                "COUNT",
                1,
                "BLOCK",
                block_ms,
                "STREAMS",
                self._stream,
                self._bell,
                cursor,
                bell,
                patient=True,
            )

    async def _take(self, keys: Sequence[str], args: Sequence[Any]) -> list[Any]:
        backend = self._backend
        try:
            return list(await backend.script(backend.scripts.take, keys, args, patient=True))
        except BrokerkitError as exc:
            cause = exc.__cause__
            if not (isinstance(cause, rex.ResponseError) and "NOGROUP" in str(cause)):
                raise
        # the stream or group was deleted behind our back (FLUSHDB, DEL): recreate, retry once
        backend.forget_group(self._stream, self._group)
        await backend.ensure_group(self._stream, self._group)
        return list(await backend.script(backend.scripts.take, keys, args, patient=True))

    async def _maybe_trim(self, now: float) -> None:
        """Every ``trim_interval``: XTRIM MINID below what every consumer group still needs."""
        if now < self._next_trim:
            return
        self._next_trim = now + self._trim_interval
        backend = self._backend
        await backend.script(backend.scripts.trim, (self._stream,), (), patient=True)

    # -- settling ----------------------------------------------------------------------------

    async def ack(self, delivery: Delivery) -> None:
        """Script ACK. Without a fifo_group it is coalesced for up to ``ack_flush_interval``.

        Only while the lease surely holds for the whole flush interval: a late ack raises
        LeaseExpired at once, and one close to the deadline is sent synchronously.
        """
        holds_until = self._deadline.pop(id(delivery), math.inf)
        left = holds_until - asyncio.get_running_loop().time()
        if left <= 0:
            raise _lost(delivery)
        if (
            delivery.fifo_group is None
            and self._flush_interval > 0
            and left > 2 * self._flush_interval + 0.05
            and not self._closed
        ):
            self._acks.append(delivery)
            self._ack_ready.set()
            if self._flusher is None:
                self._flusher = asyncio.ensure_future(self._flush_loop())
            if len(self._acks) >= 8 * _ACK_BATCH:
                await self._flush()  # back-pressure on a caller acking faster than Redis
            return
        if await self._ack_now([delivery]):
            raise _lost(delivery)

    async def _ack_now(self, deliveries: Sequence[Delivery], *, patient: bool = False) -> list[Any]:
        packed = b"".join(
            b"%s %d %s\n" % (*d.receipt, d.fifo_group.encode() if d.fifo_group else b"")
            for d in deliveries
        )
        args = (self._group, self._me, self._fprefix, packed)
        backend = self._backend
        lost = await backend.script(
            backend.scripts.ack, (self._stream, self._due, self._bell), args, patient=patient
        )
        return list(lost)

    async def _flush_loop(self) -> None:
        # Never cancelled (a cancel landing inside a redis call may surface as a connection
        # error and be swallowed): aclose sets _closed and rings _ack_ready instead.
        while not self._closed:
            await self._ack_ready.wait()
            if not self._closed:
                await asyncio.sleep(self._flush_interval)
            self._ack_ready.clear()
            try:
                await self._flush()
            except BrokerkitError as exc:
                log.warning("brokerkit: coalesced acks not yet recorded, will retry: %s", exc)
                self._ack_ready.set()  # retry without waiting for the next ack

    async def _flush(self) -> None:
        async with self._flush_lock:
            while self._acks:
                batch = self._acks[:_ACK_BATCH]
                del self._acks[:_ACK_BATCH]
                try:
                    # lost leases: someone else holds them now
                    await self._ack_now(batch, patient=True)
                except BaseException:
                    self._acks[:0] = batch
                    raise

    async def nack(self, delivery: Delivery, delay: float) -> None:
        """Script NACK: due again ``delay`` s from now (server clock); a fifo head stays held."""
        self._deadline.pop(id(delivery), None)
        if await self._nack([delivery], delay, uncount=False):
            raise _lost(delivery)

    async def release(self, deliveries: Sequence[Delivery]) -> None:
        """Script NACK with delay 0, giving back the delivery count (not an attempt)."""
        for delivery in deliveries:
            self._deadline.pop(id(delivery), None)
        if deliveries:
            await self._nack(deliveries, 0.0, uncount=True)

    async def _nack(
        self, deliveries: Sequence[Delivery], delay: float, *, uncount: bool
    ) -> list[Any]:
        args: list[Any] = [self._group, self._me, PARK, math.ceil(delay * 1000), int(uncount)]
        for d in deliveries:
            args += d.receipt
        backend = self._backend
        keys = (self._stream, self._due, self._bell)
        return list(await backend.script(backend.scripts.nack, keys, args))

    async def dead_letter(self, delivery: Delivery, envelope: Mapping[str, str]) -> None:
        """Script DEAD: ``XADD`` the copy to the DLQ stream and ``XACK`` the original, at once."""
        self._deadline.pop(id(delivery), None)
        entry_id, count = delivery.receipt
        fields = encode_entry(
            delivery.body, delivery.fifo_group, None, {**delivery.headers, **envelope}
        )
        args = [
            self._group,
            self._me,
            self._fprefix,
            entry_id,
            count,
            delivery.fifo_group or "",
            *fields,
        ]
        backend = self._backend
        keys = (self._stream, self._due, self._bell, self._dlq)
        if not await backend.script(backend.scripts.dead, keys, args):
            raise _lost(delivery)

    async def extend(self, delivery: Delivery, ack_timeout: float) -> None:
        """Script EXTEND: the lease deadline in ``due`` moves to now + ``ack_timeout``."""
        entry_id, count = delivery.receipt
        lease_ms = max(1, math.ceil(ack_timeout * 1000))
        args = (self._group, self._me, entry_id, count, lease_ms)
        backend = self._backend
        holds_until = asyncio.get_running_loop().time() + lease_ms / 1000
        if not await backend.script(backend.scripts.extend, (self._stream, self._due), args):
            raise _lost(delivery)
        if id(delivery) in self._deadline:
            self._deadline[id(delivery)] = holds_until

    async def aclose(self) -> None:
        """Flush coalesced acks, then drop the consumer name if it holds nothing. Idempotent."""
        if self._closed:
            return
        self._closed = True
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            self._ack_ready.set()
            await asyncio.gather(flusher, return_exceptions=True)
        try:
            await self._flush()
        except BrokerkitError as exc:
            # unrecorded acks only mean redelivery (at-least-once), never loss
            log.warning("brokerkit: %d acks not recorded at close: %s", len(self._acks), exc)
        backend = self._backend
        try:
            await backend.script(
                backend.scripts.forget_consumer, (self._stream,), (self._group, self._me)
            )
        except BrokerkitError:
            pass
