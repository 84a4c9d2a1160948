"""The NATS backend's pipelined JetStream publishes (``_publisher.py``) on a real server.

Each reply is matched to its message by a token that is never reused; an error reply
raises at once (nats-py's ``publish_async`` left such a future unresolved until its
timeout: ``APIError.from_error`` raises inside its reply handler); the number of messages
awaiting replies is bounded; closing fails the calls still waiting. A stand-in
responder (a plain subscriber answering on the subject) plays the server where a test
needs a reply late, wrong or never. Skipped when no server answers at the test URL.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

import nats
import nats.errors
import nats.js.errors
import pytest
from _nats import URL, nats_backend  # noqa: F401
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

import brokerkit
from brokerkit.backends import BrokerRefused, QueueRef
from brokerkit.backends.nats import NatsBackend, _publisher
from brokerkit.backends.nats._publisher import JetStreamPublisher


@pytest.fixture(name="nc")
async def client() -> AsyncIterator[NATS]:
    try:
        nc = await nats.connect(URL, allow_reconnect=False, connect_timeout=2)
    except (nats.errors.Error, OSError):
        pytest.skip("no NATS server at the test URL")
    try:
        yield nc
    finally:
        await nc.close()


@pytest.fixture(name="subject")
async def stream_subject(nc: NATS) -> AsyncIterator[str]:
    """A subject of a fresh stream (deleted after) taking messages of at most 48 bytes,
    headers included."""
    tag = uuid.uuid4().hex[:10]
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=f"tpub_{tag}", subjects=[f"tpub.{tag}"], max_msg_size=48))
    try:
        yield f"tpub.{tag}"
    finally:
        await js.delete_stream(f"tpub_{tag}")


async def test_acks_come_back_in_message_order_with_their_sequences(nc: NATS, subject: str) -> None:
    publisher = JetStreamPublisher(nc)
    first = await publisher.publish([(subject, b"%d" % i, None) for i in range(300)], 5.0)
    again = await publisher.publish([(subject, b"x", {"Nats-Msg-Id": "same"})] * 2, 5.0)
    assert first == [(seq, False) for seq in range(1, 301)]
    assert again == [(301, False), (301, True)]  # the second one within the dedup window
    await publisher.aclose()


async def test_an_error_reply_raises_at_once_the_first_in_message_order(
    nc: NATS, subject: str
) -> None:
    publisher = JetStreamPublisher(nc)
    items = [(subject, b"small", None), (subject, b"x" * 100, None), (subject, b"y" * 101, None)]
    started = time.monotonic()
    with pytest.raises(nats.js.errors.APIError) as caught:
        await publisher.publish(items, 30.0)
    assert time.monotonic() - started < 5.0  # not the 30 s timeout
    assert caught.value.err_code == 10054  # message size exceeds maximum allowed
    # the small one before it was stored; the failed call left nothing waiting
    assert await publisher.publish([(subject, b"ok", None)], 5.0) == [(2, False)]
    assert not publisher._waiting
    await publisher.aclose()


async def test_no_stream_for_the_subject_raises_at_once(nc: NATS) -> None:
    publisher = JetStreamPublisher(nc)
    started = time.monotonic()
    with pytest.raises(nats.js.errors.NoStreamResponseError):
        await publisher.publish([(f"nostream.{uuid.uuid4().hex}", b"x", None)], 30.0)
    assert time.monotonic() - started < 5.0
    await publisher.aclose()


async def test_a_late_reply_to_a_call_that_gave_up_is_never_taken_for_another(nc: NATS) -> None:
    subject = f"fake.{uuid.uuid4().hex[:10]}"
    seq = 0

    async def respond(msg: Msg) -> None:  # the first message is answered late
        nonlocal seq
        seq += 1
        mine = seq
        if mine == 1:
            await asyncio.sleep(0.5)  # nats-py runs this handler's messages one at a time
        await nc.publish(msg.reply, json.dumps({"stream": "fake", "seq": mine}).encode())

    responder = await nc.subscribe(subject, cb=respond)
    publisher = JetStreamPublisher(nc)
    with pytest.raises(nats.errors.TimeoutError):
        await publisher.publish([(subject, b"late", None)], 0.2)
    assert await publisher.publish([(subject, b"next", None)], 5.0) == [(2, False)]
    await responder.unsubscribe()
    await publisher.aclose()


async def test_the_wait_restarts_while_replies_make_progress(nc: NATS) -> None:
    subject = f"fake.{uuid.uuid4().hex[:10]}"
    seq = 0

    async def respond(msg: Msg) -> None:  # 8 replies, 0.1 s apart: 0.8 s in all
        nonlocal seq
        seq += 1
        await asyncio.sleep(0.1)
        await nc.publish(msg.reply, json.dumps({"stream": "fake", "seq": seq}).encode())

    responder = await nc.subscribe(subject, cb=respond)
    publisher = JetStreamPublisher(nc)
    acks = await publisher.publish([(subject, b"x", None)] * 8, 0.3)
    assert [s for s, _ in acks] == list(range(1, 9))
    await responder.unsubscribe()
    await publisher.aclose()


async def test_a_call_beyond_the_pending_bound_waits_for_room(
    nc: NATS, subject: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_publisher, "MAX_PENDING", 7)
    most = 0
    send = nc.publish

    async def counting(*args: object, **kwargs: object) -> None:
        nonlocal most
        most = max(most, len(publisher._waiting))
        await send(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(nc, "publish", counting)
    publisher = JetStreamPublisher(nc)  # sends with the counting publish
    acks = await asyncio.gather(
        publisher.publish([(subject, b"a%d" % i, None) for i in range(40)], 5.0),
        publisher.publish([(subject, b"b%d" % i, None) for i in range(40)], 5.0),
    )
    assert sorted(s for call in acks for s, _ in call) == list(range(1, 81))
    assert most <= 7
    await publisher.aclose()


async def test_closing_fails_the_calls_still_waiting(nc: NATS) -> None:
    subject = f"fake.{uuid.uuid4().hex[:10]}"
    arrived = asyncio.Event()

    async def never_answer(msg: Msg) -> None:
        arrived.set()

    responder = await nc.subscribe(subject, cb=never_answer)
    publisher = JetStreamPublisher(nc)
    call = asyncio.ensure_future(publisher.publish([(subject, b"x", None)], 30.0))
    await asyncio.wait_for(arrived.wait(), 5.0)
    await publisher.aclose()
    with pytest.raises(nats.errors.ConnectionClosedError):
        await asyncio.wait_for(call, 5.0)
    await responder.unsubscribe()


async def test_the_backend_maps_a_stream_refusal_to_broker_refused(backend: NatsBackend) -> None:
    """Through the backend: a JetStream error reply is BrokerRefused (not a timeout)."""
    queue = QueueRef(f"t-pubref-{uuid.uuid4().hex[:10]}")
    await backend.declare(queue)
    layout = await backend._stream(queue)
    js = backend.link.js
    info = await js.stream_info(layout.stream)
    info.config.max_msg_size = 16
    await js.update_stream(info.config)
    try:
        started = time.monotonic()
        with pytest.raises(BrokerRefused):
            await backend.publish(queue, [brokerkit.Outgoing(b"z" * 64)])
        assert time.monotonic() - started < 5.0
    finally:
        await backend.delete_queue(queue.name)
