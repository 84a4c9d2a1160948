"""Broker-side input (docs/contract.md, "Broker-side input"): a message written into a
brokerkit queue by the broker's own client, as a foreign producer, an older version or a
bug would, never stops the queue.

Each test publishes 3 good messages, writes one raw message of a kind with the broker's
own client (``contract_tests._raw``), publishes 3 more and consumes the queue and its DLQ
with a deadline: the 6 good ones are delivered, each with attempt 1; the raw one is
delivered as what it is (``bare``, no brokerkit fields at all) or dead-lettered with a
reason ``corrupt: <defect>`` (everything else); nothing is raised out of ``async for``
nor out of ``browse``. A URL whose backend has no raw writer here (a third party's) is
reported unsupported ("raw writer"), never passed.

The raw message is recognised by its body, which starts with a marker, or (where the
body cannot carry it: a Kafka tombstone) by a header whose value is the marker; a DLQ
copy whose body was left out (over the size limit) says so in its reason.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

import pytest
import pytest_asyncio

import brokerkit

from ._helpers import SCALE, WAIT, SecretURL, unsupported
from ._raw import NotApplicable, RawWriter, raw_writer

DEADLINE = 1.5 * WAIT
"""For the 6 good messages and the raw one (or its DLQ copy) to show up."""
_POLL = 0.5
"""How long one wait for the next message lasts before the stop flag is looked at."""

FIFO = pytest.mark.parametrize("fifo", [False, True], ids=["plain", "fifo"])


@pytest_asyncio.fixture
async def writer(broker_url: SecretURL) -> AsyncIterator[RawWriter]:
    made = raw_writer(broker_url.secret_url())
    if made is None:
        scheme = brokerkit.BrokerURL.parse(broker_url.secret_url()).scheme
        unsupported("raw writer", f"contract_tests._raw has no writer for {scheme}://")
    try:
        yield made
    finally:
        await made.aclose()


@dataclass
class Seen:
    """What a run of one kind saw: deliveries of the queue and of its DLQ, errors."""

    marker: bytes
    good: list[bytes]
    delivered: list[brokerkit.Message] = field(default_factory=list)
    dead: list[brokerkit.Message] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    refused: str = ""
    """Why the broker itself refused the raw message (NotApplicable), if it did."""

    def is_raw(self, body: bytes, headers: Mapping[str, str]) -> bool:
        return body.startswith(self.marker) or self.marker.decode() in headers.values()

    @property
    def raw_delivered(self) -> list[brokerkit.Message]:
        return [m for m in self.delivered if self.is_raw(m.body, m.headers)]

    @property
    def good_delivered(self) -> list[brokerkit.Message]:
        return [m for m in self.delivered if m.body in self.good]

    def story(self) -> str:
        def show(ms: list[brokerkit.Message]) -> list[tuple[bytes, int, str]]:
            out = []
            for m in ms:
                info = m.dead_letter_info
                out.append((m.body[:40], m.attempt, info.reason if info else ""))
            return out

        return (
            f"delivered {show(self.delivered)}; dead {show(self.dead)}; "
            f"errors {[repr(e) for e in self.errors]}"
        )


async def _drain(
    consumer: brokerkit.Consumer, into: list[brokerkit.Message], seen: Seen, stop: asyncio.Event
) -> None:
    """Take and ack whatever comes until ``stop``; an exception is recorded, not lost."""
    try:
        async with consumer:
            while not stop.is_set():
                try:
                    msg = await asyncio.wait_for(consumer.__anext__(), _POLL)
                except TimeoutError:
                    continue
                into.append(msg)
                await msg.ack()
    except Exception as exc:  # the assertion reports it
        seen.errors.append(exc)


async def _browse(broker: brokerkit.Broker, queue: str, *, dead: bool = False) -> None:
    if broker.capabilities.browse:  # must not raise, whatever is in the queue
        async for _ in broker.browse(queue, dead_letters=dead):
            pass


async def _run(
    broker: brokerkit.Broker, queue: str, writer: RawWriter, kind: str, *, fifo: bool
) -> Seen:
    """Publish 3, write the raw one, publish 3; consume the queue and its DLQ."""
    seen = Seen(f"raw-{kind}-{uuid.uuid4().hex[:8]}".encode(), [b"good-%d" % i for i in range(6)])
    group = f"g-{uuid.uuid4().hex[:8]}" if fifo else None
    for body in seen.good[:3]:
        await broker.publish(queue, body, fifo_group=group)
    try:
        await writer.write(queue, kind, seen.marker)
    except NotApplicable as exc:
        seen.refused = str(exc) or "refused"
    for body in seen.good[3:]:
        await broker.publish(queue, body, fifo_group=group)
    await _browse(broker, queue)
    stop = asyncio.Event()
    tasks = [
        asyncio.ensure_future(_drain(broker.consumer(queue), seen.delivered, seen, stop)),
        asyncio.ensure_future(_drain(broker.dead_letters(queue), seen.dead, seen, stop)),
    ]
    deadline = time.monotonic() + DEADLINE * SCALE
    try:
        while time.monotonic() < deadline and not seen.errors:
            done = len(seen.good_delivered) >= len(seen.good)
            if done and (seen.refused or seen.raw_delivered or seen.dead):
                break
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    await _browse(broker, queue)
    await _browse(broker, queue, dead=True)
    assert not seen.errors, f"raised out of async for: {seen.story()}"
    good = seen.good_delivered
    bodies = [m.body for m in good]
    assert sorted(bodies) == seen.good, f"not every good message delivered once: {seen.story()}"
    if fifo:
        assert bodies == seen.good, f"the fifo group's order broke: {seen.story()}"
    assert all(m.attempt == 1 for m in good), f"a neighbour paid an attempt: {seen.story()}"
    assert not [m for m in seen.dead if m.body in seen.good], f"an innocent died: {seen.story()}"
    return seen


def _assert_dead_letter(seen: Seen, *, body_kept: bool = True) -> brokerkit.Message:
    """The raw message went to the DLQ (once), with a reason naming its defect."""
    assert not seen.raw_delivered, f"a corrupt message was handed out: {seen.story()}"
    assert len(seen.dead) == 1, f"want its one DLQ copy: {seen.story()}"
    (dead,) = seen.dead
    info = dead.dead_letter_info
    assert info is not None and info.reason.startswith("corrupt: "), seen.story()
    assert len(info.reason) > len("corrupt: "), f"the reason names no defect: {seen.story()}"
    if body_kept:
        assert seen.is_raw(dead.body, dead.headers), f"its body was not kept: {seen.story()}"
    return dead


@FIFO
@pytest.mark.behaviour("broker-side input")
async def test_a_foreign_message_is_delivered_as_it_is(
    broker: brokerkit.Broker, queue: str, writer: RawWriter, fifo: bool
) -> None:
    seen = await _run(broker, queue, writer, "bare", fifo=fifo)
    assert not seen.dead, f"a well-formed foreign message was dead-lettered: {seen.story()}"
    raw = seen.raw_delivered
    assert len(raw) == 1 and raw[0].attempt == 1, f"want it once, attempt 1: {seen.story()}"
    assert all(type(k) is str and type(v) is str for k, v in raw[0].headers.items())


@FIFO
@pytest.mark.behaviour("broker-side input")
async def test_a_corrupt_brokerkit_field_is_dead_lettered_with_its_defect(
    broker: brokerkit.Broker, queue: str, writer: RawWriter, fifo: bool
) -> None:
    _assert_dead_letter(await _run(broker, queue, writer, "corrupt", fifo=fifo))


@FIFO
@pytest.mark.behaviour("broker-side input")
async def test_a_header_value_of_a_type_brokerkit_never_writes_is_dead_lettered(
    broker: brokerkit.Broker, queue: str, writer: RawWriter, fifo: bool
) -> None:
    dead = _assert_dead_letter(await _run(broker, queue, writer, "wrong_type", fifo=fifo))
    assert all(type(k) is str and type(v) is str for k, v in dead.headers.items())


@FIFO
@pytest.mark.behaviour("broker-side input")
async def test_a_body_over_max_message_bytes_is_dead_lettered_never_redelivered(
    broker: brokerkit.Broker,
    queue: str,
    writer: RawWriter,
    fifo: bool,
    record_property: Callable[[str, object], None],
) -> None:
    seen = await _run(broker, queue, writer, "oversize", fifo=fifo)
    if seen.refused:  # the broker itself refuses such a body: it can never be in a queue
        record_property("oversize", f"refused by the broker: {seen.refused}")
        assert not seen.raw_delivered and not seen.dead, seen.story()
        return
    dead = _assert_dead_letter(seen, body_kept=False)
    info = dead.dead_letter_info
    assert info is not None and "max_message_bytes" in info.reason, seen.story()
    if not seen.is_raw(dead.body, dead.headers):  # left out: the reason must say so
        assert "without" in info.reason, f"its body was dropped silently: {seen.story()}"


@FIFO
@pytest.mark.behaviour("broker-side input")
async def test_each_broker_specific_trap_is_delivered_or_dead_lettered(
    broker: brokerkit.Broker,
    new_queue: Callable[[str | None], str],
    writer: RawWriter,
    fifo: bool,
) -> None:
    for kind in writer.extra_kinds:
        seen = await _run(broker, new_queue(None), writer, kind, fifo=fifo)
        delivered, dead = seen.raw_delivered, seen.dead
        assert len(delivered) + len(dead) == 1, f"{kind}: want it once: {seen.story()}"
        if dead:
            info = dead[0].dead_letter_info
            assert info is not None and info.reason.startswith("corrupt: "), (kind, seen.story())
