"""The consumer's fetch buffer: hand-out order, lease ends, put-backs, give-back, one fetch."""

from __future__ import annotations

import asyncio
from typing import Any

from brokerkit._fetchbuffer import FetchBuffer
from brokerkit.backends import NO_EXTRAS, NO_HEADERS, Delivery


def _d(name: str, attempt: int = 1) -> Delivery[Any]:
    return Delivery(name, b"", NO_HEADERS, None, None, attempt, name, NO_EXTRAS)


async def _filled(buffer: FetchBuffer, *batches: list[Delivery[Any]]) -> None:
    for batch in batches:

        async def receive(batch: list[Delivery[Any]] = batch) -> list[Delivery[Any]]:
            return batch

        buffer.start(receive())
        assert buffer.fetch is not None
        await buffer.finish_fetch()
        assert buffer.fetch is None


def _ids(buffer: FetchBuffer) -> list[str]:
    out = []
    while (d := buffer.take()) is not None:
        out.append(d.id)
    return out


async def test_batches_are_handed_out_in_arrival_order_each_with_its_lease_end() -> None:
    buffer = FetchBuffer(ack_timeout=30.0)
    assert buffer.take() is None
    await _filled(buffer, [_d("a"), _d("b")])
    first_end = asyncio.get_running_loop().time() + 30.0
    await asyncio.sleep(0.01)
    await _filled(buffer, [_d("c")])
    assert buffer.count == 3
    assert buffer.take() is not None and buffer.lease_end <= first_end + 0.005
    a_end = buffer.lease_end
    assert [buffer.take().id, buffer.count] == ["b", 1]  # type: ignore[union-attr]
    assert buffer.take().id == "c" and buffer.lease_end > a_end  # type: ignore[union-attr]
    assert buffer.take() is None and buffer.count == 0


async def test_put_back_front_comes_next_after_the_current_batch() -> None:
    buffer = FetchBuffer(ack_timeout=30.0)
    await _filled(buffer, [_d("a"), _d("b")], [_d("c")])
    assert buffer.take().id == "a"  # type: ignore[union-attr]
    buffer.put_back_front(_d("x", 3), 123.0)
    assert buffer.count == 3
    assert buffer.take().id == "b"  # type: ignore[union-attr]
    assert (buffer.take().id, buffer.lease_end) == ("x", 123.0)  # type: ignore[union-attr]
    assert buffer.take().id == "c"  # type: ignore[union-attr]


async def test_drain_empties_it_and_splits_off_what_ran_out() -> None:
    buffer = FetchBuffer(ack_timeout=30.0)
    await _filled(buffer, [_d("a"), _d("b")])
    buffer.take()
    buffer.put_back_front(_d("old"), 5.0)  # ran out at 5
    buffer.put_back_front(_d("new"), 1e18)
    leased, ran_out = buffer.drain(now=10.0)
    assert [d.id for d in leased] == ["b", "new"]
    assert [d.id for d in ran_out] == ["old"]  # returned too: the closer gives it back
    assert buffer.count == 0 and buffer.take() is None


async def test_a_failed_or_cancelled_fetch_adds_nothing_and_collect_runs_once() -> None:
    buffer = FetchBuffer(ack_timeout=30.0)

    async def fails() -> list[Delivery[Any]]:
        raise OSError("down")

    buffer.start(fails())
    await buffer.finish_fetch()
    assert buffer.fetch is None and buffer.count == 0
    gate = asyncio.Event()

    async def slow() -> list[Delivery[Any]]:
        await gate.wait()
        return [_d("a")]

    buffer.start(slow())
    task = buffer.fetch
    assert task is not None
    gate.set()
    await asyncio.wait([task])
    buffer.collect(task)
    buffer.collect(task)  # the done callback, or a second caller: no second copy
    await asyncio.sleep(0)
    assert buffer.count == 1 and _ids(buffer) == ["a"]


async def test_what_is_still_buffered_near_its_lease_end_is_given_back_in_one_call() -> None:
    given: asyncio.Queue[list[str]] = asyncio.Queue()
    buffer = FetchBuffer(2.0, lambda ds: given.put_nowait([d.id for d in ds]))  # margin 0.5 s
    loop = asyncio.get_running_loop()
    fetched = loop.time()
    await _filled(buffer, [_d("a"), _d("b"), _d("c")])
    assert buffer.take().id == "a"  # type: ignore[union-attr]
    await asyncio.sleep(0.2)
    assert given.empty()  # 1.8 s left of 2: kept
    await _filled(buffer, [_d("d")])  # a later batch: a later lease end
    # given back before the lease (2 s) ran out: at 1.5 s
    assert await asyncio.wait_for(given.get(), 2.0) == ["b", "c"]
    assert loop.time() - fetched < 2.0
    assert buffer.count == 1
    assert await asyncio.wait_for(given.get(), 2.0) == ["d"]
    assert buffer.count == 0 and buffer.take() is None


async def test_nothing_is_given_back_once_the_closer_stops_it() -> None:
    given: list[list[Delivery[Any]]] = []
    buffer = FetchBuffer(0.2, given.append)
    await _filled(buffer, [_d("a")])
    buffer.stop_giving_back()
    assert [d.id for d in buffer.drain(0.0)[0]] == ["a"]
    await _filled(buffer, [_d("b")])  # fetched while closing: the closer's to handle
    await asyncio.sleep(0.3)  # past b's lease: the give-back would have run by now
    assert given == []


async def test_a_drain_before_a_last_attempt_leaves_giving_back_on() -> None:
    given: asyncio.Queue[list[str]] = asyncio.Queue()
    buffer = FetchBuffer(0.4, lambda ds: given.put_nowait([d.id for d in ds]))
    await _filled(buffer, [_d("a")])
    assert [d.id for d in buffer.drain(0.0)[0]] == ["a"]  # _alone's give-back
    await _filled(buffer, [_d("b")])
    assert await asyncio.wait_for(given.get(), 2.0) == ["b"]
