"""Shared helpers of the contract suite: polling with deadlines, never sleep-and-hope."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

import brokerkit

SCALE = float(os.environ.get("BROKERKIT_TIMEOUT_SCALE", "1"))
"""Multiply every deadline (slow machines, remote brokers)."""

WAIT = 20.0 * SCALE
"""Deadline for something that should happen promptly (first delivery includes group joins)."""


def fresh(prefix: str = "bk") -> str:
    """A queue or group name no other test or run uses."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


class SecretURL(str):
    """The URL under test: a ``str`` whose ``repr``, ``str()`` and formatting are redacted.

    ``broker_url`` is one, so wherever pytest prints it (test ids, tracebacks' locals,
    assertion messages) it shows ``redis://:***@host``, while ``brokerkit.connect`` and
    string operations read the real URL. A string made from it (``url + "..."``,
    ``url.replace(...)``) is a plain ``str`` again: :func:`with_param` keeps the type;
    for anything else, wrap the result (``SecretURL(text)``). :meth:`secret_url` is
    the real URL as a plain ``str``, for a client library only.
    """

    _parsed: brokerkit.BrokerURL

    def __new__(cls, url: str) -> SecretURL:
        self = super().__new__(cls, url)
        self._parsed = brokerkit.BrokerURL.parse(url)
        return self

    def secret_url(self) -> str:
        """The real URL, password included."""
        return str.__str__(self)

    def redacted(self) -> str:
        return self._parsed.redacted()

    def redact(self, text: str) -> str:
        """``text`` with this URL's secrets (and anything credential-shaped) as ``***``."""
        return self._parsed.redact(text)

    def __str__(self) -> str:
        return self._parsed.redacted()

    def __repr__(self) -> str:
        return repr(self._parsed.redacted())

    def __format__(self, spec: str) -> str:
        return format(self._parsed.redacted(), spec)


def with_param(url: str, name: str, value: str) -> str:
    """``url`` with one more query parameter (a SecretURL stays one)."""
    out = url + ("&" if urlsplit(url).query or url.endswith("?") else "?") + f"{name}={value}"
    return SecretURL(out) if isinstance(url, SecretURL) else out


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
