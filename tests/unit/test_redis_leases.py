"""Leases (implicit in the PEL, reclaimed by TAKE) and the batched ACK against a real Redis.

Uses the shared test Redis (``BROKERKIT_REDIS_URL``, default 127.0.0.1:6379/0) with fresh
random queue names; skipped when no Redis answers there.
"""

from __future__ import annotations

import asyncio
import math
import os
import uuid
from collections.abc import AsyncIterator

import pytest

import brokerkit
from brokerkit.backends.base import Delivery, ReceiverSettings
from brokerkit.backends.redis_streams import RedisBackend
from brokerkit.backends.redis_streams._receiver import RedisReceiver

URL = os.environ.get("BROKERKIT_REDIS_URL", "redis://127.0.0.1:6379/0?ack_flush_interval=0")


@pytest.fixture
async def backend() -> AsyncIterator[RedisBackend]:
    broker = brokerkit.connect(URL)
    try:
        b = await broker._opened_backend()
    except brokerkit.BrokerUnavailable:
        await broker.aclose()
        pytest.skip(f"no Redis at {brokerkit.BrokerURL.parse(URL).redacted()}")
    assert isinstance(b, RedisBackend)
    queue = f"t-lease-{uuid.uuid4().hex[:10]}"
    b.test_queue = queue  # type: ignore[attr-defined]
    try:
        yield b
    finally:
        keys = await b.command("KEYS", f"{b.keys.base(queue)}*")
        if keys:
            await b.command("DEL", *keys)
        await broker.aclose()


async def receiver(b: RedisBackend, ack_timeout: float) -> RedisReceiver:
    r = await b.subscribe(b.test_queue, "g", ReceiverSettings(ack_timeout, 5, 1000))  # type: ignore[attr-defined]
    assert isinstance(r, RedisReceiver)
    return r


async def publish(b: RedisBackend, n: int, fifo: str | None = None) -> None:
    msgs = [brokerkit.Outgoing(b"m%d" % i, fifo_group=fifo) for i in range(n)]
    await b.publish(b.test_queue, msgs)  # type: ignore[attr-defined]


async def take(r: RedisReceiver, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    while len(got) < n:
        batch = await r.receive(n - len(got), 2.0)
        assert batch, f"only {len(got)} of {n} arrived"
        got += batch
    return got


async def pending(b: RedisBackend, r: RedisReceiver) -> int:
    total = 0
    for stream in (r._stream, r._fstream):
        summary = await b.command("XPENDING", stream, r._group)
        total += int(summary["pending"])
    return total


async def test_fresh_batch_is_leased_by_the_read_and_acked_in_one_call(
    backend: RedisBackend,
) -> None:
    await publish(backend, 600)
    r = await receiver(backend, 30)
    got = await take(r, 600)
    assert [d.body for d in got] == [b"m%d" % i for i in range(600)]
    assert all(d.attempt == 1 for d in got)
    # the lease is the PEL entry itself (owner + delivery time): nothing else is written
    assert await pending(backend, r) == 600
    assert r._me.endswith("/L30000")
    assert int(await backend.command("ZCARD", r._due)) == 0
    assert await r._ack_now(got) == []
    assert await pending(backend, r) == 0
    await r.aclose()


async def test_a_lease_runs_out_by_its_owners_ack_timeout_not_the_readers(
    backend: RedisBackend,
) -> None:
    await publish(backend, 20)
    holder = await receiver(backend, 30)
    held = await take(holder, 20)
    short = await receiver(backend, 0.2)  # sweeps often, with its own short lease
    assert await short.receive(20, 1.0) == []  # the holder's 30 s leases still hold
    assert await holder._ack_now(held) == []
    await holder.aclose()
    await short.aclose()


async def test_batched_ack_refuses_leases_taken_over(backend: RedisBackend) -> None:
    await publish(backend, 150)
    a = await receiver(backend, 0.2)
    old = await take(a, 150)
    await asyncio.sleep(0.3)
    b = await receiver(backend, 30)
    new = await take(b, 150)
    assert all(d.attempt == 2 for d in new)
    lost = await a._ack_now(old)  # a's leases ended and b holds them now: none may be acked
    assert sorted(lost) == sorted(d.receipt[0] for d in old)
    assert await pending(backend, b) == 150
    assert await b._ack_now(new) == []
    assert await pending(backend, b) == 0
    await a.aclose()
    await b.aclose()


async def test_ack_of_entries_beyond_the_batched_check_is_checked_alone(
    backend: RedisBackend,
) -> None:
    # acking only the newest few while holding many older ones: XPENDING's answer (oldest
    # first, cut short) misses them, so each is checked on its own -- right count acks,
    # a wrong count (a stale token) is refused
    await publish(backend, 400)
    r = await receiver(backend, 30)
    got = await take(r, 400)
    newest = got[-5:]
    stale = Delivery(
        newest[0].id, b"", {}, None, None, 7, (newest[0].receipt[0], 7, math.inf)
    )  # same entry, wrong delivery count
    assert await r._ack_now([stale]) == [stale.receipt[0]]
    assert await r._ack_now(newest) == []
    assert await pending(backend, r) == 395
    assert await r._ack_now(got[:-5]) == []
    assert await pending(backend, r) == 0
    await r.aclose()


async def test_fifo_entries_in_an_ack_batch_advance_their_group(backend: RedisBackend) -> None:
    await publish(backend, 3, fifo="f")
    await publish(backend, 3)
    r = await receiver(backend, 30)
    first = await take(r, 4)  # the fifo head and the three plain ones; the rest are parked
    assert sorted((d.fifo_group or "", d.body) for d in first) == [
        ("", b"m0"),
        ("", b"m1"),
        ("", b"m2"),
        ("f", b"m0"),
    ]
    assert await r._ack_now(first) == []
    nxt = await take(r, 1)
    assert nxt[0].fifo_group == "f" and nxt[0].body == b"m1" and nxt[0].attempt == 1
    await r._ack_now(nxt)
    last = await take(r, 1)
    assert last[0].body == b"m2"
    await r._ack_now(last)
    assert await pending(backend, r) == 0
    await r.aclose()


async def test_a_busy_plain_stream_does_not_starve_fifo_entries(backend: RedisBackend) -> None:
    await publish(backend, 1000)
    await publish(backend, 1, fifo="f")
    r = await receiver(backend, 30)
    first = await r.receive(100, 2.0) + await r.receive(100, 2.0)
    # the two sources take turns: the second call asks TAKE first, which routes the fifo entry
    assert any(d.fifo_group == "f" for d in first)
    assert await r._ack_now(first) == []
    await r.aclose()


async def test_headerless_deliveries_share_one_read_only_mapping(backend: RedisBackend) -> None:
    # Plain entries without headers share NO_HEADERS (no dict per message): nobody can
    # change another message's headers through it, and headed entries keep their own.
    q = backend.test_queue  # type: ignore[attr-defined]
    await backend.publish(q, [brokerkit.Outgoing(b"a"), brokerkit.Outgoing(b"b")])
    await backend.publish(q, [brokerkit.Outgoing(b"c", headers={"k": "v"})])
    r = await receiver(backend, 30)
    a, b, c = await take(r, 3)
    assert a.headers == b.headers == {} and a.headers is b.headers
    with pytest.raises(TypeError):
        a.headers["x"] = "y"  # type: ignore[index]
    assert b.headers == {} and c.headers == {"k": "v"}


async def test_acks_queued_during_a_flush_are_recorded_by_the_next_round(
    backend: RedisBackend,
) -> None:
    # A flush records what was queued when it began (and any full batch); a partial batch
    # queued meanwhile is left to the flush loop's next round -- which must come, though
    # no further ack rings for it (an ack rings only when the queue was empty).
    await publish(backend, 1100)
    r = await receiver(backend, 30)
    r._flush_interval, r._coalesce_min_left = 0.05, 0.15  # coalesce, as by default
    got = await take(r, 1100)
    for d in got[:1000]:
        await r.ack(d)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while not r._flush_lock.locked():  # the flush loop's flush has sent its first batch
        assert loop.time() < deadline, "the flush loop never flushed"
        await asyncio.sleep(0)
    for d in got[1000:]:
        await r.ack(d)
    while await pending(backend, r):
        assert loop.time() < deadline, f"{await pending(backend, r)} acks never recorded"
        await asyncio.sleep(0.02)
    assert not r._acks
    await r.aclose()
