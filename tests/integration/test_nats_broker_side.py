"""NATS broker-side input beyond the contract suite: a foreign message's own NATS headers
reach the caller, a message on a subject no durable reads is moved where one does (its
server-steering headers dropped, once however many sweep), and a fifo_group published
onto another group's subject is dead-lettered. Runs against the shared test server
(``BROKERKIT_NATS_URL``, default nats://127.0.0.1:4222); skipped when none answers."""

from __future__ import annotations

import asyncio
import uuid

from _nats import URL, nats_backend  # noqa: F401  (the fixture ``backend``)

import brokerkit
from brokerkit.backends import FIFO_GROUP_HEADER
from brokerkit.backends.nats import NatsBackend
from brokerkit.backends.nats._layout import QueueLayout
from brokerkit.backends.nats._strays import STRAY_ID, sweep


def _layout(backend: NatsBackend, queue: str) -> QueueLayout:
    opts = backend.options
    return QueueLayout.of(opts.prefix, queue, dead_letters=False, partitions=opts.partitions)


async def _first(consumer: brokerkit.Consumer, within: float = 10.0) -> brokerkit.Message:
    """The first message ``consumer`` hands out, acked."""
    async with consumer:
        msg = await asyncio.wait_for(consumer.__anext__(), within)
        await msg.ack()
        return msg


async def test_a_foreign_message_keeps_its_nats_headers(backend: NatsBackend) -> None:
    queue = f"t-side-{uuid.uuid4().hex[:10]}"
    async with brokerkit.connect(URL) as broker:
        try:
            await broker.declare(queue)
            subject = _layout(backend, queue).subject(None)
            await backend.link.js.publish(subject, b"foreign", headers={"X-Trace": "t 1"})
            msg = await _first(broker.consumer(queue))
            assert (msg.body, dict(msg.headers), msg.attempt) == (b"foreign", {"X-Trace": "t 1"}, 1)
        finally:
            await broker.delete_queue(queue)


async def test_a_stray_subject_is_moved_once_without_its_server_headers(
    backend: NatsBackend,
) -> None:
    queue = f"t-side-{uuid.uuid4().hex[:10]}"
    async with brokerkit.connect(URL) as broker:
        try:
            await broker.declare(queue)
            layout = _layout(backend, queue)
            js = backend.link.js
            await broker.publish(queue, b"kept")  # moved as it was, the copy would be refused
            expect = {"Nats-Expected-Last-Subject-Sequence": "0", "k": "v"}
            stray = await js.publish(f"{layout.subject_root}.x", b"stray", headers=expect)
            moved = await asyncio.gather(sweep(backend.link, layout), sweep(backend.link, layout))
            assert sum(moved) >= 1
            assert await sweep(backend.link, layout) == 0  # the original is gone
            info = await js.stream_info(layout.stream, subjects_filter=layout.wildcard)
            assert info.state.subjects == {layout.subject(None): 2}, info.state.subjects
            copy = await js.get_last_msg(layout.stream, layout.subject(None))
            assert copy.data == b"stray"
            assert copy.headers == {"k": "v", "Nats-Msg-Id": f"{STRAY_ID}{stray.seq}"}
        finally:
            await broker.delete_queue(queue)


async def test_a_fifo_group_on_another_subject_is_dead_lettered(backend: NatsBackend) -> None:
    queue = f"t-side-{uuid.uuid4().hex[:10]}"
    async with brokerkit.connect(URL) as broker:
        try:
            await broker.declare(queue)
            subject = _layout(backend, queue).subject(None)  # not the group's partition
            await backend.link.js.publish(subject, b"astray", headers={FIFO_GROUP_HEADER: "g1"})
            main = asyncio.ensure_future(_first(broker.consumer(queue)))
            try:
                dead = await _first(broker.dead_letters(queue))
            finally:
                main.cancel()
                await asyncio.wait([main])
            assert main.cancelled(), "the corrupt message was handed out"
            info = dead.dead_letter_info
            assert dead.body == b"astray" and info is not None
            assert info.reason.startswith("corrupt: fifo_group header disagrees"), info.reason
            assert dead.fifo_group == "g1"
        finally:
            await broker.delete_queue(queue)
