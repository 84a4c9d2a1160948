"""Leases (implicit in the PEL, reclaimed by TAKE) and acks, through the Receiver API.

Drives ``RedisBackend`` through the backend seam only (``subscribe`` -> ``Receiver``:
``receive`` / ``ack`` / ``nack`` / ``extend`` / ``aclose``) against the shared test Redis
(``BROKERKIT_REDIS_URL``, default 127.0.0.1:6379/0) with fresh random queue names; the
server side is observed with a raw client on the documented key layout
(docs/backends/redis.md). Skipped when no Redis answers there.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from _redis import opened_backend, url_with

import brokerkit
from brokerkit.backends import Delivery, QueueRef, Receiver, ReceiverSettings
from brokerkit.backends.redis_streams import RedisBackend

SYNC_ACKS = "ack_flush_interval=0"  # every ack is its own call, answered before ack returns


@dataclass
class Env:
    backend: RedisBackend
    raw: aioredis.Redis
    queue: QueueRef

    @property
    def stream(self) -> str:
        return f"brokerkit:{{{self.queue.name}}}:s"

    async def receiver(self, ack_timeout: float) -> Receiver[Any]:
        return await self.backend.subscribe(self.queue, "g", ReceiverSettings(ack_timeout))

    async def publish(self, n: int, fifo: str | None = None) -> None:
        msgs = [brokerkit.Outgoing(b"m%d" % i, fifo_group=fifo) for i in range(n)]
        await self.backend.publish(self.queue, msgs)

    async def pending(self) -> int:
        total = 0
        for stream in (self.stream, self.stream + "f"):
            summary = await self.raw.xpending(stream, "g")
            total += int(summary["pending"])
        return total


async def _env(query: str) -> AsyncIterator[Env]:
    backend = await opened_backend(url_with(query))
    raw = aioredis.Redis(connection_pool=backend.client.connection_pool)
    queue = QueueRef(f"t-lease-{uuid.uuid4().hex[:10]}")
    try:
        yield Env(backend, raw, queue)
    finally:
        await backend.delete_queue(queue.name)
        await backend.aclose()


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    async for e in _env(SYNC_ACKS):
        yield e


@pytest.fixture
async def coalescing() -> AsyncIterator[Env]:
    async for e in _env(""):  # the default ack_flush_interval: acks are coalesced
        yield e


async def take(r: Receiver[Any], n: int, wait: float = 2.0) -> list[Delivery[Any]]:
    got: list[Delivery[Any]] = []
    while len(got) < n:
        batch = await r.receive(n - len(got), wait)
        assert batch, f"only {len(got)} of {n} arrived"
        got += batch
    return got


async def until(what: str, condition: Callable[[], Awaitable[bool]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for: {what}"
        await asyncio.sleep(0.02)


async def test_fresh_batch_is_leased_by_the_read_alone(env: Env) -> None:
    await env.publish(600)
    r = await env.receiver(30)
    got = await take(r, 600)
    assert [d.body for d in got] == [b"m%d" % i for i in range(600)]
    assert all(d.attempt == 1 for d in got)
    # the lease is the PEL entry itself (owner + delivery time): nothing else is written
    assert await env.pending() == 600
    assert await env.raw.zcard(f"{env.stream}:g:g:due") == 0
    consumers = await env.raw.xinfo_consumers(env.stream, "g")
    assert [c["name"].rsplit(b"/", 1)[1] for c in consumers] == [b"L30000"]
    for d in got:
        await r.ack(d)
    assert await env.pending() == 0
    await r.aclose()


async def test_a_lease_runs_out_by_its_owners_ack_timeout_not_the_readers(env: Env) -> None:
    await env.publish(20)
    holder = await env.receiver(30)
    held = await take(holder, 20)
    short = await env.receiver(0.2)  # sweeps often, with its own short lease
    assert await short.receive(20, 1.0) == []  # the holder's 30 s leases still hold
    for d in held:
        await holder.ack(d)
    assert await env.pending() == 0
    await holder.aclose()
    await short.aclose()


async def test_leases_taken_over_cannot_be_settled_by_their_old_holder(env: Env) -> None:
    await env.publish(150)
    a = await env.receiver(0.2)
    old = await take(a, 150)
    b = await env.receiver(30)
    new = await take(b, 150, wait=5.0)  # TAKE reclaims a's leases once they ran out
    assert sorted(d.id for d in new) == sorted(d.id for d in old)
    assert all(d.attempt == 2 for d in new)
    # the lease token (consumer, delivery count) checked by Redis itself: extend and nack
    # go straight to their scripts, ack is refused by a's own clock before that
    with pytest.raises(brokerkit.LeaseExpired):
        await a.extend(old[0], 0.2)
    with pytest.raises(brokerkit.LeaseExpired):
        await a.nack(old[1], 0.0)
    for d in old[2:]:
        with pytest.raises(brokerkit.LeaseExpired):
            await a.ack(d)
    assert await env.pending() == 150  # all still b's
    for d in new:
        await b.ack(d)
    assert await env.pending() == 0
    await a.aclose()
    await b.aclose()


async def test_acks_beyond_the_batched_pel_check_are_checked_alone(env: Env) -> None:
    # acking only the newest few while holding many older ones: the ACK script's one
    # XPENDING (oldest first, cut short) misses them, so each is checked on its own
    await env.publish(400)
    r = await env.receiver(30)
    got = await take(r, 400)
    for d in got[-5:]:
        await r.ack(d)
    assert await env.pending() == 395
    for d in got[:-5]:
        await r.ack(d)
    assert await env.pending() == 0
    await r.aclose()


async def test_an_extended_lease_is_acked_after_its_first_deadline(env: Env) -> None:
    # extend renews the lease on the server and in the receiver's own book (the receipt
    # itself never changes): an ack after the first deadline is still accepted
    await env.publish(1)
    r = await env.receiver(0.5)
    (d,) = await take(r, 1)
    receipt = d.receipt
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:  # keep it leased well past its first 0.5 s
        await r.extend(d, 0.5)
        await asyncio.sleep(0.1)
    assert d.receipt is receipt
    await r.ack(d)
    assert await env.pending() == 0
    await r.aclose()


async def test_fifo_acks_advance_their_group(env: Env) -> None:
    await env.publish(3, fifo="f")
    await env.publish(3)
    r = await env.receiver(30)
    first = await take(r, 4)  # the fifo head and the three plain ones; the rest are parked
    assert sorted((d.fifo_group or "", d.body) for d in first) == [
        ("", b"m0"),
        ("", b"m1"),
        ("", b"m2"),
        ("f", b"m0"),
    ]
    assert await r.receive(1, 0.3) == []  # m1 of "f" waits for its head
    for d in first:
        await r.ack(d)
    nxt = await take(r, 1)
    assert nxt[0].fifo_group == "f" and nxt[0].body == b"m1" and nxt[0].attempt == 1
    await r.ack(nxt[0])
    last = await take(r, 1)
    assert last[0].body == b"m2"
    await r.ack(last[0])
    assert await env.pending() == 0
    await r.aclose()


async def test_a_busy_plain_stream_does_not_starve_fifo_entries(env: Env) -> None:
    await env.publish(1000)
    await env.publish(1, fifo="f")
    r = await env.receiver(30)
    first = await r.receive(100, 2.0) + await r.receive(100, 2.0)
    # the two sources take turns: the second call asks TAKE first, which routes the fifo entry
    assert any(d.fifo_group == "f" for d in first)
    for d in first:
        await r.ack(d)
    await r.aclose()


async def test_headerless_deliveries_share_one_read_only_mapping(env: Env) -> None:
    # Plain entries without headers share NO_HEADERS (no dict per message): nobody can
    # change another message's headers through it, and headed entries keep their own.
    out = brokerkit.Outgoing
    await env.backend.publish(env.queue, [out(b"a"), out(b"b")])
    await env.backend.publish(env.queue, [out(b"c", headers={"k": "v"})])
    r = await env.receiver(30)
    a, b, c = await take(r, 3)
    assert a.headers == b.headers == {} and a.headers is b.headers
    with pytest.raises(TypeError):
        a.headers["x"] = "y"  # type: ignore[index]
    assert b.headers == {} and c.headers == {"k": "v"}
    await r.aclose()


async def test_coalesced_acks_queued_during_a_flush_are_recorded(coalescing: Env) -> None:
    # A flush records what was queued when it began (and any full batch); a partial batch
    # queued meanwhile is left to the flush loop's next round -- which must come, though
    # no further ack rings for it (an ack rings only when the queue was empty).
    env = coalescing
    await env.publish(1100)
    r = await env.receiver(30)
    got = await take(r, 1100)
    for d in got[:1000]:
        await r.ack(d)
    await until("the first coalesced batch recorded", lambda: _below(env, 1100), 5)
    for d in got[1000:]:
        await r.ack(d)
    await until("every coalesced ack recorded, without closing", lambda: _below(env, 1), 5)
    await r.aclose()


async def _below(env: Env, n: int) -> bool:
    return await env.pending() < n


async def test_released_entries_come_back_uncounted_and_in_order(env: Env) -> None:
    # release (fetched, never shown) gives the delivery count back, and entries released
    # together become due in the order given: with equal ZSET scores '1-10' sorted before
    # '1-9' and a poison waited behind every neighbour released with it (issue 16)
    await env.publish(30)
    a = await env.receiver(30)
    first = await take(a, 30)
    await a.release(first)
    b = await env.receiver(30)
    again = await take(b, 30)
    assert [d.id for d in again] == [d.id for d in first]
    assert all(d.attempt == 1 for d in again)
    for d in again:
        await b.ack(d)
    await a.aclose()
    await b.aclose()


async def test_expired_leases_come_back_together_one_at_a_time(env: Env) -> None:
    # a reader asking for one message at a time (prefetch=1) reclaims a dead holder's
    # entries one per call: each call that reclaimed all it asked for sweeps again at
    # once, instead of one entry per sweep interval + blocking read (~0.3 s each)
    await env.publish(20)
    dead = await env.receiver(0.2)
    held = await take(dead, 20)
    r = await env.receiver(30)
    await until("the leases ran out", lambda: _idle_past(env, 0.25), 5)
    started = time.monotonic()
    got = [d for _ in range(20) for d in await r.receive(1, 2.0)]
    took = time.monotonic() - started
    assert sorted(d.id for d in got) == sorted(d.id for d in held)
    assert all(d.attempt == 2 for d in got)
    assert took < 2.0, f"20 expired entries reclaimed one at a time in {took:.2f}s"
    for d in got:
        await r.ack(d)
    await dead.aclose()
    await r.aclose()


async def test_the_ack_of_a_redelivery_is_recorded_before_it_returns(coalescing: Env) -> None:
    # a redelivered message may sit next to a crash: its ack is never coalesced (a
    # coalesced ack lost with the process would cost it an attempt)
    env = coalescing
    await env.publish(1)
    a = await env.receiver(30)
    [d] = await take(a, 1)
    await a.nack(d, 0.0)
    [again] = await take(a, 1)
    assert again.attempt == 2
    await a.ack(again)
    assert await env.pending() == 0
    await a.aclose()


async def _idle_past(env: Env, seconds: float) -> bool:
    entries = await env.raw.xpending_range(env.stream, "g", "-", "+", 100)
    return bool(entries) and all(e["time_since_delivered"] >= seconds * 1000 for e in entries)
