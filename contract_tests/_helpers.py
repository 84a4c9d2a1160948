"""Shared helpers of the contract suite: polling with deadlines, never sleep-and-hope."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
import uuid
from collections.abc import Awaitable, Callable

import brokerkit

SCALE = float(os.environ.get("BROKERKIT_TIMEOUT_SCALE", "1"))
"""Multiply every deadline (slow machines, remote brokers)."""

WAIT = 20.0 * SCALE
"""Deadline for something that should happen promptly (first delivery includes group joins)."""


def fresh(prefix: str = "bk") -> str:
    """A queue or group name no other test or run uses."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def with_param(url: brokerkit.BrokerURL, name: str, value: str) -> brokerkit.BrokerURL:
    """``url`` with the query parameter ``name`` set to ``value`` (added, or replaced)."""
    query = (*((k, v) for k, v in url.query if k != name), (name, value))
    return dataclasses.replace(url, query=query)


def with_hosts(url: brokerkit.BrokerURL, hosts: str) -> brokerkit.BrokerURL:
    """``url`` pointed at ``hosts`` (``host:port[,host:port]``), credentials and options kept."""
    return dataclasses.replace(
        url, hosts=brokerkit.BrokerURL.parse(f"{url.scheme}://{hosts}").hosts
    )


async def eventually(
    check: Callable[[], Awaitable[bool]] | Callable[[], bool],
    *,
    timeout: float = WAIT,
    interval: float = 0.05,
    what: str = "condition",
) -> None:
    """Poll ``check`` until it is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}")
        await asyncio.sleep(interval)


async def receive(consumer: brokerkit.Consumer, timeout: float = WAIT) -> brokerkit.Message:
    """The next message, or fail after ``timeout`` seconds (cancellation-safe iteration)."""
    try:
        return await asyncio.wait_for(consumer.__anext__(), timeout)
    except TimeoutError:
        raise AssertionError(f"no message on {consumer!r} within {timeout:.1f}s") from None


async def receive_n(
    consumer: brokerkit.Consumer, n: int, *, timeout: float = WAIT, ack: bool = True
) -> list[brokerkit.Message]:
    """``n`` messages (acked unless ``ack=False``) within one overall deadline."""
    out: list[brokerkit.Message] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"got {len(out)} of {n} messages within {timeout:.1f}s")
        msg = await receive(consumer, left)
        if ack:
            await msg.ack()
        out.append(msg)
    return out


async def nothing_within(consumer: brokerkit.Consumer, seconds: float) -> brokerkit.Message | None:
    """Return a message that arrives within ``seconds`` (a failure for the caller), else None."""
    try:
        return await asyncio.wait_for(consumer.__anext__(), seconds)
    except TimeoutError:
        return None


def redelivery_deadline(broker: brokerkit.Broker, ack_timeout: float) -> float:
    """How long a lease expiry or nack may take to show up again, from capabilities."""
    return ((ack_timeout + broker.capabilities.redelivery_slack) * 2 + 5.0) * SCALE
