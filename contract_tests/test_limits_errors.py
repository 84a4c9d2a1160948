"""Limits (CONTRACT section 2) and errors (section 8): bad input fails before any I/O."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable
from urllib.parse import parse_qs, urlsplit

import pytest

import brokerkit

from ._helpers import (
    WAIT,
    SecretURL,
    eventually,
    nothing_within,
    receive,
    receive_n,
    with_param,
)

BAD_NAMES = ["", "a" * 65, "a.b", "a b", "żółw", "-lead", "_lead", "a/b", "trail\n", "a\nb"]
BAD_TOKENS = ["", "a" * 129, "a b", "żółw", "tab\there", "trail\n"]
GOOD_TOKENS = ["x" * 128, "order.42:v1", "a-b_c/d|e~!#$%&'()*+,;<=>?@[]^`{}", "~"]
"""Legal fifo_group and dedup_id values (SQS's rule), hostile to naive mappings."""


def _full_headers() -> dict[str, str]:
    """32 headers, 8 KiB in all, with case, non-ASCII, newlines and separators to keep."""
    headers = {}
    for i in range(32):
        key = f"X-Hdr-{i:02d}"
        headers[key] = ""
    budget = 8192 - sum(len(k.encode()) for k in headers)
    pattern = "żółw ✓ a\nb\r\n;,=:\"' \t{}[]"
    for i, key in enumerate(headers):
        share = budget // 32 + (1 if i < budget % 32 else 0)
        value = ""
        while len((value + pattern[len(value) % len(pattern)]).encode()) <= share:
            value += pattern[len(value) % len(pattern)]
        headers[key] = value
    return headers


@pytest.mark.behaviour("limits")
async def test_limits_256kib_body_and_32_headers_round_trip_byte_exact(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    body = os.urandom(256 * 1024)
    headers = _full_headers()
    assert sum(len(k.encode()) + len(v.encode()) for k, v in headers.items()) <= 8192
    await broker.publish(queue, body, headers=headers, fifo_group="big")
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        assert msg.body == body
        assert dict(msg.headers) == headers
        await msg.ack()


@pytest.mark.behaviour("limits")
async def test_limits_oversize_body_and_headers_are_refused_and_nothing_is_sent(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    too_big = b"\0" * (broker.capabilities.max_message_bytes + 1)
    with pytest.raises(brokerkit.MessageTooLarge):
        await broker.publish(queue, too_big)
    with pytest.raises(brokerkit.MessageTooLarge):  # nothing of a batch is partially published
        await broker.publish_many(queue, [brokerkit.Outgoing(b"ok"), brokerkit.Outgoing(too_big)])
    with pytest.raises(brokerkit.InvalidMessage):
        await broker.publish(queue, b"x", headers={f"h{i}": "v" for i in range(33)})
    with pytest.raises(brokerkit.InvalidMessage):
        await broker.publish(queue, b"x", headers={"h": "v" * 8192})
    await _only_sentinel_arrives(broker, queue, group)


@pytest.mark.behaviour("limits")
async def test_limits_body_of_exactly_max_message_bytes_is_carried(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    body = os.urandom(broker.capabilities.max_message_bytes)
    await broker.publish(queue, body)
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        assert msg.body == body
        await msg.ack()


@pytest.mark.behaviour("limits")
async def test_limits_longest_and_oddest_legal_groups_and_dedup_ids_are_carried(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    for i, token in enumerate(GOOD_TOKENS):
        await broker.publish(queue, f"{i}".encode(), fifo_group=token, dedup_id=token)
    async with broker.consumer(queue, group) as consumer:
        got = {m.body: m for m in await receive_n(consumer, len(GOOD_TOKENS))}
    for i, token in enumerate(GOOD_TOKENS):
        msg = got[f"{i}".encode()]
        assert (msg.fifo_group, msg.dedup_id) == (token, token)


async def _only_sentinel_arrives(broker: brokerkit.Broker, queue: str, group: str) -> None:
    await broker.publish(queue, b"sentinel")
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        assert msg.body == b"sentinel", f"a refused message was published: {msg!r}"
        await msg.ack()
        assert await nothing_within(consumer, 1.0) is None


@pytest.mark.behaviour("errors")
async def test_errors_bad_names_raise_invalid_name_before_io(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    for name in BAD_NAMES:
        with pytest.raises(brokerkit.InvalidName):
            await broker.publish(name, b"x")
        with pytest.raises(brokerkit.InvalidName):
            broker.consumer(name)
        with pytest.raises(brokerkit.InvalidName):
            broker.consumer(queue, group=name)
    for token in BAD_TOKENS:
        with pytest.raises(brokerkit.InvalidName):
            await broker.publish(queue, b"x", fifo_group=token)
        with pytest.raises(brokerkit.InvalidName):
            await broker.publish(queue, b"x", dedup_id=token)
    await _only_sentinel_arrives(broker, queue, group)


def _closed_port() -> int:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _dead_url(broker_url: str) -> tuple[str, int] | None:
    """``broker_url`` pointed at a closed port (and the port), None without a network address."""
    parsed = brokerkit.BrokerURL.parse(broker_url)
    port = _closed_port()
    if parsed.hosts:
        hosts = ",".join(str(h) for h in parsed.hosts)
        return SecretURL(broker_url.replace(hosts, f"127.0.0.1:{port}", 1)), port
    endpoint = parse_qs(urlsplit(broker_url).query).get("endpoint", [""])[0]
    if endpoint:  # endpoint-style URLs (sqs://?endpoint=http://host:port)
        netloc = urlsplit(endpoint).netloc
        return SecretURL(broker_url.replace(netloc, f"127.0.0.1:{port}", 1)), port
    return None


@pytest.mark.behaviour("errors")
async def test_errors_bad_names_on_an_unopened_broker_at_a_closed_port_are_invalid_name(
    broker_url: str, queue: str
) -> None:
    """ "Before any I/O": a broker nobody listens for still refuses bad names at once."""
    dead = _dead_url(broker_url)
    broker = brokerkit.connect(dead[0] if dead else broker_url)  # in-process: unopened is all
    try:

        async def refused(call: Awaitable[object]) -> None:
            with pytest.raises(brokerkit.InvalidName):
                await asyncio.wait_for(call, 5.0)  # BrokerUnavailable only after a retry

        for name in BAD_NAMES:
            await refused(broker.publish(name, b"x"))
            await refused(broker.publish_many(name, [brokerkit.Outgoing(b"x")]))
            await refused(broker.redrive(name))
            await refused(broker.delete_queue(name))
            with pytest.raises(brokerkit.InvalidName):
                broker.consumer(name)
            with pytest.raises(brokerkit.InvalidName):
                broker.dead_letters(name)
            with pytest.raises(brokerkit.InvalidName):
                broker.consumer(queue, group=name)
        for token in BAD_TOKENS:
            await refused(broker.publish(queue, b"x", fifo_group=token))
            await refused(broker.publish(queue, b"x", dedup_id=token))
            await refused(
                broker.publish_many(
                    queue, [brokerkit.Outgoing(b"x"), brokerkit.Outgoing(b"y", token)]
                )
            )
    finally:
        await broker.aclose()


@pytest.mark.behaviour("errors")
async def test_errors_bad_bodies_headers_and_arguments(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    for body in ("text", None, 42, [b"x"]):
        with pytest.raises(brokerkit.InvalidMessage):
            await broker.publish(queue, body)  # type: ignore[arg-type]
    for headers in ({"a": 1}, {1: "a"}, {"a": b"x"}, ["a"], {"x-brokerkit-dlq-reason": "spoof"}):
        with pytest.raises(brokerkit.InvalidMessage):
            await broker.publish(queue, b"x", headers=headers)  # type: ignore[arg-type]
    with pytest.raises(brokerkit.InvalidArgument):
        broker.consumer(queue, max_attempts=0)
    for bad in (-1.0, 0, float("nan"), "5"):
        with pytest.raises(brokerkit.InvalidArgument):
            broker.consumer(queue, ack_timeout=bad)  # type: ignore[arg-type]
    await _only_sentinel_arrives(broker, queue, group)


@pytest.mark.behaviour("errors")
async def test_errors_settling_twice_and_negative_delay(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    await broker.publish(queue, b"x")
    async with broker.consumer(queue, group) as consumer:
        msg = await receive(consumer)
        with pytest.raises(brokerkit.InvalidArgument):
            await msg.nack(delay=-1)
        assert not msg.settled  # the bad call settled nothing
        await msg.ack()
        for settle in (msg.ack(), msg.nack(), msg.dead_letter("late"), msg.extend()):
            with pytest.raises(brokerkit.AlreadySettled):
                await settle


@pytest.mark.behaviour("errors")
async def test_errors_settling_after_the_lease_expired_raises(
    broker: brokerkit.Broker, queue: str, group: str
) -> None:
    ack_timeout = 1.0
    await broker.publish(queue, b"x")
    async with broker.consumer(queue, group, ack_timeout=ack_timeout, close_timeout=0) as consumer:
        msg = await receive(consumer)
        received = time.monotonic()
        await eventually(lambda: time.monotonic() > received + ack_timeout + 0.1, what="lease end")
        with pytest.raises(brokerkit.LeaseExpired):
            await msg.ack()
        with pytest.raises(brokerkit.LeaseExpired):
            await msg.extend()


@pytest.mark.behaviour("errors")
async def test_errors_use_after_aclose_raises_resource_closed(broker_url: str, queue: str) -> None:
    broker = brokerkit.connect(broker_url)
    await broker.open()
    consumer = broker.consumer(queue)
    await consumer.open()
    await consumer.aclose()
    await consumer.aclose()  # idempotent
    with pytest.raises(brokerkit.ResourceClosed):
        await consumer.__anext__()
    await broker.aclose()
    await broker.aclose()
    with pytest.raises(brokerkit.ResourceClosed):
        await broker.publish(queue, b"x")
    with pytest.raises(brokerkit.ResourceClosed):
        broker.consumer(queue)


@pytest.mark.behaviour("errors")
async def test_errors_aclose_while_a_consumer_is_blocked(broker_url: str, queue: str) -> None:
    broker = brokerkit.connect(broker_url)
    await broker.open()
    consumer = broker.consumer(queue)
    await consumer.open()
    blocked = asyncio.ensure_future(consumer.__anext__())
    await asyncio.sleep(0)  # let it block
    await asyncio.wait_for(broker.aclose(), WAIT)
    with pytest.raises((StopAsyncIteration, brokerkit.ResourceClosed)):
        await asyncio.wait_for(blocked, WAIT)


@pytest.mark.behaviour("errors")
async def test_errors_config_unknown_scheme_and_parameter_never_echo_password(
    broker_url: str,
) -> None:
    with pytest.raises(brokerkit.ConfigError, match="nope"):
        brokerkit.connect("nope://host")
    url = with_param(broker_url, "no_such_option", "1")
    parsed = brokerkit.BrokerURL.parse(url)
    if parsed.hosts:
        hosts = ",".join(str(h) for h in parsed.hosts)
        url = url.replace(hosts, "user:s3cr3t-pw@" + hosts, 1)
    with pytest.raises(brokerkit.ConfigError) as info:
        brokerkit.connect(url)
    assert "s3cr3t-pw" not in str(info.value) and "s3cr3t-pw" not in repr(info.value)
    if parsed.hosts:
        assert "no_such_option" in str(info.value)
        assert "s3cr3t-pw" not in repr(brokerkit.BrokerURL.parse(url))


@pytest.mark.behaviour("errors")
async def test_errors_broker_down_raises_broker_unavailable_naming_host_and_port(
    broker_url: str,
) -> None:
    dead = _dead_url(broker_url)
    if dead is None:  # in-process (memory://): no network, nothing to be down, no retry
        broker = brokerkit.connect(broker_url)
        await asyncio.wait_for(broker.open(), 1.0)
        await broker.aclose()
        return
    url, port = dead
    broker = brokerkit.connect(url)
    with pytest.raises(brokerkit.BrokerUnavailable) as info:
        await asyncio.wait_for(broker.open(), 60)
    assert str(port) in str(info.value)
    await broker.aclose()
