"""The one place where redis-py exceptions become brokerkit errors, and the bounded retry.

``error_map(hosts)`` is the backend's ``ErrorMap`` table (most specific first, cause kept);
``Runner`` runs every Redis call once and, on a transient failure only, again under the
toolkit's ``retry_unavailable`` (BrokerUnavailable naming host:port once it gives up).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from redis import exceptions as rex

from brokerkit.backends import (
    BrokerRefused,
    BrokerUnavailable,
    ConfigError,
    ErrorMap,
    HostPort,
    retry_unavailable,
)
from brokerkit.backends.redis_streams._call_deadlines import CallDeadlines

__all__ = ["MAPPED", "PATIENT_ATTEMPTS", "Runner", "error_map", "is_transient", "refusal_code"]

T = TypeVar("T")

PATIENT_ATTEMPTS = 100
"""A consumer's own calls (receive, flushing acks) retry until the deadline, not 5 tries:
a Redis restart takes a few seconds, and the iterator should ride it out."""

MAPPED = (BrokerRefused, BrokerUnavailable, ConfigError)
"""Every error a Redis call can raise once mapped: what a best-effort step catches."""

_CREDENTIALS = (rex.AuthenticationError, rex.AuthorizationError)
_TRANSIENT = (rex.ConnectionError, rex.TimeoutError, rex.BusyLoadingError, OSError)
_monotonic = time.monotonic


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: the server is unreachable, restarting or still loading."""
    return isinstance(exc, _TRANSIENT) and not isinstance(exc, _CREDENTIALS)


def refusal_code(exc: BaseException) -> str | None:
    """The error code Redis put first in its reply (``NOGROUP``, ``NOPERM``, ``ERR``...)."""
    word = str(exc).split(" ", 1)[0]
    return word if word.isupper() else None


def error_map(hosts: Sequence[HostPort]) -> ErrorMap:
    """The table for a connection to ``hosts`` (named in every message; never a password)."""
    where = ", ".join(str(h) for h in hosts) or "redis"
    first = hosts[0] if hosts else HostPort("localhost")

    def unavailable(text: str) -> BrokerUnavailable:
        return BrokerUnavailable(text, host=first.host, port=first.port)

    return ErrorMap(
        (_CREDENTIALS, lambda e: ConfigError(f"redis at {where} refused the credentials")),
        (
            rex.NoPermissionError,
            lambda e: BrokerRefused(
                f"redis at {where} refused the permission: {e}", code=refusal_code(e)
            ),
        ),
        (_TRANSIENT, lambda e: unavailable(f"redis at {where} is unavailable")),
        (
            rex.ResponseError,
            lambda e: BrokerRefused(f"redis at {where} refused: {e}", code=refusal_code(e)),
        ),
        (
            rex.RedisError,
            lambda e: unavailable(f"redis client error talking to {where}: {type(e).__name__}"),
        ),
    )


class Runner:
    """Runs redis calls: once on the fast path, then a bounded retry on transient failure.

    Every driver error leaves through the backend's ``ErrorMap``; BrokerUnavailable
    (naming host:port) once the retry gives up. ``heard`` is when Redis last answered a
    call (monotonic clock): the evidence a coalesced ack needs that the path still works.

    ``timeout`` bounds each try of a call (plus ``wait``, the time a blocking command
    may wait server-side; cut at most a quarter of ``timeout`` later, see
    ``CallDeadlines``): the client made by ``from_url`` has no per-read socket timeout,
    so a Redis that stops answering is noticed here. A try that runs out raises
    ``TimeoutError``, an ``OSError``: transient, like a socket timeout.
    """

    __slots__ = ("_deadlines", "errors", "heard", "hosts", "timeout")

    def __init__(self, hosts: Sequence[HostPort], timeout: float) -> None:
        self.hosts = tuple(hosts)
        self.errors = error_map(self.hosts)
        self.heard = 0.0
        self.timeout = timeout
        self._deadlines = CallDeadlines(timeout / 4)

    async def __call__(
        self, operation: Callable[[], Awaitable[T]], *, patient: bool = False, wait: float = 0.0
    ) -> T:
        """Run ``operation``; ``patient`` retries for the whole deadline (10 s), else 5 tries."""
        operation = functools.partial(self._deadlines.run, operation, self.timeout + wait)
        with self.errors:
            try:
                result = await operation()
                self.heard = _monotonic()
                return result
            except _TRANSIENT as exc:
                if not is_transient(exc):
                    raise
            if patient:
                result = await retry_unavailable(
                    operation,
                    what="redis",
                    hosts=self.hosts,
                    is_transient=is_transient,
                    attempts=PATIENT_ATTEMPTS,
                )
            else:
                result = await retry_unavailable(
                    operation, what="redis", hosts=self.hosts, is_transient=is_transient
                )
            self.heard = _monotonic()
            return result
