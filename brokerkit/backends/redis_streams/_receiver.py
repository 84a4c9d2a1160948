"""RedisReceiver: leases, settling and waiting for one consumer group of one stream."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from brokerkit.backends import (
    BrokerRefused,
    Delivery,
    LeaseExpired,
    Outgoing,
    PublishCopy,
    Receiver,
    ReceiverSettings,
)
from brokerkit.backends.redis_streams._errors import MAPPED
from brokerkit.backends.redis_streams._keys import (
    FIFO_ID_PREFIX,
    Keys,
    Receipt,
    decode_entry,
    decode_plain,
    encode_entry,
)
from brokerkit.backends.redis_streams._link import RedisLink

__all__ = ["PARK", "RedisReceiver"]

log = logging.getLogger(__name__)

PARK = "~park"
"""Pseudo consumer owning entries nobody holds: parked fifo entries, nacked ones."""
_ACK_BATCH = 512
_ACK_BACKLOG = 32 * _ACK_BATCH
"""Coalesced acks queued beyond this make ``ack`` flush them itself (back-pressure)."""
_monotonic = time.monotonic  # the event loop's clock
_BARE_ACK_MARGIN = 1.0
"""Seconds every lease of a coalesced batch must still hold for it to go as a bare XACK."""
_TAKE_IDLE_SKIP = 0.01
"""How long a TAKE that found nothing lets full plain batches skip the next TAKE."""
_SWEEP_INTERVAL = 0.1
"""Longest pause between two looks for expired leases while a receiver keeps reading."""
_PRUNE_AT = 1024
"""Renewals kept before the ones that ran out (never settled here) are dropped."""


def _decode_taken(flat: Sequence[Any], holds_until: float) -> list[Delivery[Receipt]]:
    """TAKE's flat (kind, id, fields, count)*: kind ``f`` for an entry of the fifo twin."""
    return [
        decode_entry(flat[i + 1], flat[i + 2], flat[i + 3], holds_until, fifo=flat[i] == b"f")
        for i in range(0, len(flat), 4)
    ]


def _consumer_name(lease_ms: int) -> str:
    """Unique per receiver; ends in ``/L<lease ms>``, which is how other consumers of the
    group know when an entry this one holds has run out (see ``_lua.TAKE``)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}/L{lease_ms}"


def _lost(delivery: Delivery[Receipt]) -> LeaseExpired:
    return LeaseExpired(f"the lease on message {delivery.id!r} was lost; it may be redelivered")


class RedisReceiver(Receiver[Receipt]):
    """One consumer (a unique Redis consumer name) of ``group`` on a stream pair.

    receive -> ``XREADGROUP >`` on the plain stream (no script) and script TAKE (expired
    leases, due entries, the fifo twin's new entries routed by fifo_group), alternating
    which goes first; then ``XREAD BLOCK`` on both streams and the group's bell; ack ->
    script ACK (coalesced up to ``ack_flush_interval`` for messages without a fifo_group);
    nack / release -> script NACK; dead_letter -> script DEAD; extend -> script EXTEND.

    Receipts are never changed: a lease renewed by ``extend`` is remembered here, keyed by
    (delivery id, delivery count), until the delivery is settled.
    """

    release_uncounted = True  # release is script NACK with uncount: the count goes back

    def __init__(
        self,
        link: RedisLink,
        stream: str,
        dlq: str,
        group: str,
        settings: ReceiverSettings,
    ) -> None:
        self._link = link
        self._runner = link.run  # its ``heard``: when Redis last answered this connection
        self._stream = stream
        self._fstream = Keys.fifo(stream)
        self._dlq = dlq
        self._group = group
        self._lease_ms = max(1, math.ceil(settings.ack_timeout * 1000))
        self._me = _consumer_name(self._lease_ms)
        self._due, self._bell, _ = Keys.group(stream, group)
        self._fdue, _, self._fprefix = Keys.group(self._fstream, group)
        options = link.options
        self._flush_interval = options.ack_flush_interval
        # an ack is coalesced only while its lease holds longer than this (never if 0)
        self._coalesce_min_left = (
            2 * self._flush_interval + 0.05 if self._flush_interval > 0 else math.inf
        )
        self._poll = options.poll_interval
        self._sweep_interval = min(_SWEEP_INTERVAL, options.poll_interval)
        self._trim_interval = options.trim_interval
        self._next_trim = 0.0
        self._next_sweep = 0.0
        self._plain_first = False
        self._take_idle_until = 0.0
        self._renewed: dict[tuple[str, int], float] = {}  # (id, count) -> holds_until
        self._prune_at = _PRUNE_AT
        self._acks: list[Receipt] = []  # coalesced, with the holds_until in force
        self._ack_ready = asyncio.Event()
        self._flush_lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"<RedisReceiver {self._stream} group={self._group!r} consumer={self._me!r}>"

    # -- receiving ---------------------------------------------------------------------------

    async def receive(self, max_messages: int, wait: float) -> list[Delivery[Receipt]]:
        """Lease up to ``max_messages``; block at most ``wait`` s (in slices of poll_interval).

        The plain stream's new entries and TAKE's (expired, due, fifo) take turns going
        first, so neither can starve the other; except that while TAKE keeps finding
        nothing, a full plain batch skips it for up to ``_TAKE_IDLE_SKIP`` s (one script
        call less per batch under a busy plain stream).
        """
        loop = asyncio.get_running_loop()
        end = loop.time() + wait
        want = max(1, max_messages)
        while True:
            now = loop.time()
            await self._maybe_trim(now)
            holds_until = now + self._lease_ms / 1000
            plain_first = self._plain_first = not self._plain_first
            plain_first = plain_first or now < self._take_idle_until
            # holds_until (in each receipt) is taken *before* the calls, so never later than
            # the server's deadline: ack() refuses a late coalesced ack with it at once.
            out = await self._read_plain(want, holds_until) if plain_first else []
            reply: list[Any] | None = None
            if len(out) < want:
                reply = await self._take(want - len(out))
                taken = _decode_taken(reply[5], holds_until)
                self._take_idle_until = 0.0 if taken else now + _TAKE_IDLE_SKIP
                out += taken
                if not plain_first and len(out) < want:
                    out += await self._read_plain(want - len(out), holds_until)
            if out:
                return out
            assert reply is not None
            remaining = end - loop.time()
            if remaining <= 0:
                return []
            await self._block(reply, min(remaining, self._poll))

    async def _read_plain(self, count: int, holds_until: float) -> list[Delivery[Receipt]]:
        """``XREADGROUP GROUP g me COUNT n STREAMS <stream> >``: new plain entries, leased
        implicitly (PEL delivery time + our lease) by the read itself."""
        # The command name as bytes: redis-py's response callbacks are keyed by str, so the
        # reply comes back unparsed, without a dict built per entry (decode_plain reads it).
        args = (b"XREADGROUP", "GROUP", self._group, self._me, "COUNT", count)
        command = self._link.command
        reply = await self._nogroup_safe(
            lambda: command(*args, "STREAMS", self._stream, ">", patient=True)
        )
        if not reply:
            return []
        # RESP3 answers {stream: entries}, RESP2 [[stream, entries]]
        entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
        return decode_plain(entries, holds_until)

    async def _take(self, count: int) -> list[Any]:
        link = self._link
        now = asyncio.get_running_loop().time()
        sweep = now >= self._next_sweep
        if sweep:
            self._next_sweep = now + self._sweep_interval
        keys = (self._stream, self._due, self._fstream, self._fdue, self._bell)
        args = (self._group, self._me, count, self._fprefix, PARK, int(sweep))
        reply = list(
            await self._nogroup_safe(
                lambda: link.script(link.scripts.take, keys, args, patient=True)
            )
        )
        if sweep and int(reply[6]) >= count:
            self._next_sweep = 0.0  # perhaps more leases ran out: look again at the next call
        return reply

    async def _nogroup_safe(self, call: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await call()
        except BrokerRefused as exc:
            if "NOGROUP" not in str(exc):
                raise
        # the stream or group was deleted behind our back (FLUSHDB, DEL): recreate, retry once
        link = self._link
        link.forget_group(self._stream, self._group)
        await link.declare_group(self._stream, self._group)
        return await call()

    async def _block(self, reply: Sequence[Any], block: float) -> None:
        """``XREAD BLOCK`` on both streams (from the group's cursors) and the bell, for at
        most ``block`` s or until the next due time TAKE reported."""
        now_ms, next_due = int(reply[0]), reply[1]
        if next_due is not None:
            block = min(block, max(float(next_due) - now_ms, 1.0) / 1000)
        cursors = [c or b"0-0" for c in reply[2:5]]
        await self._link.command(
            "XREAD",
            "COUNT",
            1,
            "BLOCK",
            max(1, int(block * 1000)),
            "STREAMS",
            self._stream,
            self._fstream,
            self._bell,
            *cursors,
            patient=True,
            wait=block,
        )

    async def _maybe_trim(self, now: float) -> None:
        """Every ``trim_interval``: XTRIM MINID below what every consumer group still needs."""
        if now < self._next_trim:
            return
        self._next_trim = now + self._trim_interval
        link = self._link
        for stream in (self._stream, self._fstream):
            await link.script(link.scripts.trim, (stream,), (), patient=True)

    # -- settling ----------------------------------------------------------------------------

    def _renewal(self, delivery: Delivery[Receipt]) -> tuple[str, int] | None:
        """The key of the delivery's renewed lease, if ``extend`` renewed it."""
        key = (delivery.id, delivery.receipt[1])
        return key if key in self._renewed else None

    def _settled(self, deliveries: Iterable[Delivery[Receipt]]) -> None:
        """Forget the renewals of settled deliveries (called only when there are any)."""
        renewed = self._renewed
        for d in deliveries:
            renewed.pop((d.id, d.receipt[1]), None)

    async def ack(self, delivery: Delivery[Receipt]) -> None:
        """Script ACK. Without a fifo_group it is coalesced for up to ``ack_flush_interval``
        (and then sent as a bare ``XACK`` when its lease has time left, see _flush_batch).

        Only while the lease surely holds for the whole flush interval: a late ack raises
        LeaseExpired at once, and one close to the deadline is sent synchronously. Only on
        a first delivery: a redelivered message may be near a crash (the poison that
        killed its last consumer, or its neighbour), and an ack lost with a crashed process
        costs the message an attempt. And only while Redis answered this connection within
        the last flush interval: an ack must not return unrecorded into a network that went
        silent (cut, broker gone) longer ago than the coalescing window; it is sent
        synchronously instead, so it returns once recorded or raises (BrokerUnavailable,
        LeaseExpired).
        """
        receipt = delivery.receipt
        renewal = self._renewal(delivery) if self._renewed else None
        if renewal is not None:
            receipt = (receipt[0], receipt[1], self._renewed[renewal])
        now = _monotonic()
        left = receipt[2] - now
        if left <= 0:
            raise _lost(delivery)
        if (
            left > self._coalesce_min_left
            and delivery.fifo_group is None
            and delivery.attempt == 1
            and not self._closed
            and now - self._runner.heard <= self._flush_interval
        ):
            acks = self._acks
            if not acks:  # the flush loop takes every ack queued while it is awake
                self._ack_ready.set()
                if self._flusher is None:
                    self._flusher = asyncio.ensure_future(self._flush_loop())
            acks.append(receipt)
            if renewal is not None:
                self._renewed.pop(renewal, None)
            if len(acks) >= _ACK_BACKLOG:
                await self._flush()  # back-pressure on a caller acking faster than Redis
            return
        fifo = delivery.fifo_group
        lost = await self._ack_now([(receipt[0], receipt[1], fifo.encode() if fifo else b"")])
        if renewal is not None:
            self._renewed.pop(renewal, None)
        if lost:
            raise _lost(delivery)

    async def _ack_now(
        self, items: Iterable[tuple[bytes, int, bytes]], *, patient: bool = False
    ) -> list[Any]:
        """Script ACK of (entry id, delivery count, fifo_group or b"") each; the lost ids."""
        packed = b"".join(b"%s %d %s\n" % item for item in items)
        args = (self._group, self._me, self._fprefix, packed)
        keys = (self._stream, self._fstream, self._fdue, self._bell)
        link = self._link
        lost = await link.script(link.scripts.ack, keys, args, patient=patient)
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
            except MAPPED as exc:
                log.warning("brokerkit: coalesced acks not yet recorded, will retry: %s", exc)
                self._ack_ready.set()  # retry without waiting for the next ack

    async def flush_acks(self) -> None:
        """Record the coalesced acks queued now, without waiting for the flush loop."""
        if self._acks:
            await self._flush()

    async def _flush(self) -> None:
        """Record the acks queued now, and every full batch queued meanwhile.

        A partial batch queued meanwhile waits for the flush loop's next round (rung here),
        so a busy consumer sends full batches, not one small XACK per round trip.
        """
        async with self._flush_lock:
            acks = self._acks
            owed = len(acks)
            while acks and (owed > 0 or len(acks) >= _ACK_BATCH):
                batch = acks[:_ACK_BATCH]
                del acks[:_ACK_BATCH]
                try:
                    await self._flush_batch(batch)
                except BaseException:
                    acks[:0] = batch
                    raise
                owed -= len(batch)
            if acks:
                self._ack_ready.set()

    async def _flush_batch(self, batch: Sequence[Receipt]) -> None:
        """Record coalesced acks (all without a fifo_group).

        While every lease of the batch holds for ``_BARE_ACK_MARGIN`` more: a bare ``XACK``
        (script ACK_BARE). A lease can only be lost to a take-over after its deadline, which
        the command beats unless it stalls that long on its way. Otherwise script ACK, which
        checks each lease token (a lost one is not acked: someone else holds it now).
        """
        if min(r[2] for r in batch) - _monotonic() > _BARE_ACK_MARGIN:
            ids = b" ".join([r[0] for r in batch])
            link = self._link
            script = link.scripts.ack_bare
            await link.script(script, (self._stream,), (self._group, ids), patient=True)
        else:
            await self._ack_now([(r[0], r[1], b"") for r in batch], patient=True)

    async def nack(self, delivery: Delivery[Receipt], delay: float) -> None:
        """Script NACK: due again ``delay`` s from now (server clock); a fifo head stays held."""
        lost = await self._nack([delivery], delay, uncount=False)
        if self._renewed:
            self._settled([delivery])
        if lost:
            raise _lost(delivery)

    async def release(self, deliveries: Sequence[Delivery[Receipt]]) -> None:
        """Script NACK with delay 0, giving back the delivery count (not an attempt)."""
        if deliveries:
            await self._nack(deliveries, 0.0, uncount=True)
            if self._renewed:
                self._settled(deliveries)

    async def _nack(
        self, deliveries: Sequence[Delivery[Receipt]], delay: float, *, uncount: bool
    ) -> list[Any]:
        args: list[Any] = [self._group, self._me, PARK, math.ceil(delay * 1000), int(uncount)]
        for d in deliveries:
            args += (d.receipt[0], d.receipt[1], b"f" if d.id.startswith(FIFO_ID_PREFIX) else b"s")
        link = self._link
        keys = (self._stream, self._due, self._fstream, self._fdue, self._bell)
        return list(await link.script(link.scripts.nack, keys, args))

    async def dead_letter(
        self, delivery: Delivery[Receipt], copy: Outgoing, publish: PublishCopy
    ) -> None:
        """Script DEAD: ``XADD`` the copy to the DLQ stream and ``XACK`` the original, in one
        atomic step (so ``publish``, the seam's copy-then-ack path, is not used)."""
        entry_id, count, _ = delivery.receipt
        fields = encode_entry(copy.body, copy.fifo_group, None, copy.headers)
        fifo = delivery.id.startswith(FIFO_ID_PREFIX)  # its stream (a damaged entry's
        kind = b"f" if fifo else b"s"  # fifo_group may be None in the twin, or disagree)
        args = [self._group, self._me, self._fprefix, entry_id, count]
        args += (delivery.fifo_group or "", kind, *fields)
        link = self._link
        dlq = Keys.fifo(self._dlq) if copy.fifo_group is not None else self._dlq
        keys = (self._fstream if fifo else self._stream, self._fdue, self._bell, dlq)
        moved = await link.script(link.scripts.dead, keys, args)
        if self._renewed:
            self._settled([delivery])
        if not moved:
            raise _lost(delivery)

    async def extend(self, delivery: Delivery[Receipt], ack_timeout: float) -> None:
        """Script EXTEND: ``XCLAIM … JUSTID`` to ourselves restarts the lease, which lasts
        this receiver's ``ack_timeout`` (the one in its consumer name; the facade always
        passes that same value)."""
        entry_id, count, _ = delivery.receipt
        args = (self._group, self._me, entry_id, count)
        link = self._link
        holds_until = _monotonic() + self._lease_ms / 1000
        stream = self._stream if delivery.fifo_group is None else self._fstream
        if not await link.script(link.scripts.extend, (stream,), args):
            raise _lost(delivery)
        renewed = self._renewed
        renewed[(delivery.id, count)] = holds_until
        if len(renewed) > self._prune_at:  # renewals of deliveries whose lease ran out
            now = _monotonic()
            self._renewed = {k: v for k, v in renewed.items() if v > now}
            self._prune_at = max(_PRUNE_AT, 2 * len(self._renewed))

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
        except MAPPED as exc:
            # unrecorded acks only mean redelivery (at-least-once), never loss
            log.warning("brokerkit: %d acks not recorded at close: %s", len(self._acks), exc)
        link = self._link
        try:
            for stream in (self._stream, self._fstream):
                await link.script(link.scripts.forget_consumer, (stream,), (self._group, self._me))
        except MAPPED:
            pass
