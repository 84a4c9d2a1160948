"""Shared helpers of the contract suite: polling with deadlines, never sleep-and-hope."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

import pytest

import brokerkit

from . import UNSUPPORTED

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


def unsupported(feature: str, why: str) -> NoReturn:
    """Skip: ``capabilities`` declares the optional ``feature`` absent (``why`` says where).

    The only skip ``brokerkit check`` accepts; the behaviour then reports the feature as
    unsupported. Never for a mandatory behaviour.
    """
    pytest.skip(f"{UNSUPPORTED}{feature}: {why}")


def in_process(url: str) -> bool:
    """True for ``memory://``: its broker lives in this process, so no other process sees it."""
    return brokerkit.BrokerURL.parse(url).scheme == "memory"


_ROOT = str(Path(brokerkit.__file__).resolve().parents[1])
"""Where this process's brokerkit lives: the child imports the same one (a mutant too)."""
_CHILD = str(Path(__file__).resolve().with_name("_child.py"))


class Child:
    """A child process (``_child.py``) on the real URL, running this process's brokerkit."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, *args: str) -> Child:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")]),
        }
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            _CHILD,
            *(a.secret_url() if isinstance(a, SecretURL) else a for a in args),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        return cls(proc)

    async def line(self, timeout: float = WAIT) -> str:
        """The child's next line of output; fail (with its stderr) if it dies or dawdles."""
        assert self.proc.stdout is not None
        try:
            raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except TimeoutError:
            raw = b""
        if not raw:
            self.kill()
            await self.proc.wait()
            err = b""
            if self.proc.stderr is not None:
                err = await self.proc.stderr.read()
            raise AssertionError(
                f"child said nothing within {timeout:.1f}s:\n{err.decode()[-3000:]}"
            )
        return raw.decode().strip()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")

    def kill(self) -> None:
        """SIGKILL: no close, no nack, no flush; the broker sees a consumer vanish."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)

    async def reap(self) -> None:
        self.kill()
        await self.proc.wait()


LATE = 0.25 * SCALE
"""What a measured due time may exceed ``capabilities.redelivery_slack`` by: this machine's
scheduling and a network round trip, never a second lease."""

EARLY = 0.05 * SCALE
"""What a measured due time may fall short by: the lease clock starts a round trip before
the client sees the message."""


def latest(broker: brokerkit.Broker, due_in: float) -> float:
    """The latest a redelivery due ``due_in`` seconds from now may show up (measured bound)."""
    return due_in + broker.capabilities.redelivery_slack + LATE


def absence_window(broker: brokerkit.Broker, ack_timeout: float) -> float:
    """How long to watch for a message that must be gone: past a lease left behind."""
    return ack_timeout + broker.capabilities.redelivery_slack + LATE + 0.5


SHORTEST = 2 * LATE
"""The shortest lease or quiet period the suite sizes down to: two of this machine's
scheduling allowances, so a step half a lease long still has ``LATE`` to spare."""

GRAINS = 10
"""A lease or quiet period sized down is at least this many of the broker's grains."""


def _grain(broker: brokerkit.Broker) -> float:
    """The broker's declared timing resolution: how late it may notice anything due, plus
    how long it may hold an ack back."""
    caps = broker.capabilities
    return caps.redelivery_slack + caps.ack_flush_interval


def lease_for(broker: brokerkit.Broker, seconds: float) -> float:
    """The ``ack_timeout`` to test a lease with, for a test written with ``seconds``.

    ``seconds`` suits a networked broker (a round trip, a poll, a flush each a good part
    of a second) and is what every one gets. A broker whose declared timing is fine
    (``redelivery_slack + ack_flush_interval`` under a tenth of ``seconds``: memory://)
    gets a shorter lease, ``GRAINS`` grains and at least ``SHORTEST``: the bounds a test
    asserts are stated against the lease it used (``latest``, ``absence_window``), so
    the shorter lease measures the same thing, sooner.
    """
    return min(seconds, max(SHORTEST, GRAINS * _grain(broker)))


def quiet_for(broker: brokerkit.Broker, seconds: float) -> float:
    """How long to watch for a message that must not come, for a test written with
    ``seconds``: whatever would come is ready, and a waiting consumer has a ready
    message within ``redelivery_slack`` (the "publish" behaviour asserts it). Sized like
    :func:`lease_for`: ``seconds`` on a networked broker, shorter where timing is fine."""
    return min(seconds, max(SHORTEST, GRAINS * _grain(broker)))
