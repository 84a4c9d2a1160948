"""The one place where redis-py exceptions become brokerkit errors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from redis import exceptions as rex

from brokerkit._errors import BrokerkitError, BrokerUnavailable, ConfigError
from brokerkit._retry import DEFAULT_DEADLINE, retry_unavailable
from brokerkit._url import HostPort

__all__ = ["Runner", "is_transient", "map_error"]

T = TypeVar("T")

PATIENT_ATTEMPTS = 100
"""A consumer's own calls (receive, flushing acks) retry until the deadline, not 5 tries:
a Redis restart takes a few seconds, and the iterator should ride it out."""


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: the server is unreachable, restarting or still loading."""
    if isinstance(exc, rex.AuthenticationError | rex.AuthorizationError):
        return False
    return isinstance(exc, rex.ConnectionError | rex.TimeoutError | rex.BusyLoadingError | OSError)


def map_error(exc: BaseException, hosts: Sequence[HostPort]) -> BrokerkitError:
    """The most specific brokerkit error for a redis-py exception (the caller keeps the cause)."""
    where = ", ".join(str(h) for h in hosts) or "redis"
    first = hosts[0] if hosts else HostPort("localhost")
    if isinstance(exc, BrokerkitError):
        return exc
    if isinstance(exc, rex.AuthenticationError | rex.AuthorizationError | rex.NoPermissionError):
        return ConfigError(f"redis at {where} refused the credentials or the permission")
    if is_transient(exc):
        return BrokerUnavailable(
            f"redis at {where} is unavailable", host=first.host, port=first.port
        )
    if isinstance(exc, rex.ResponseError):
        return BrokerkitError(f"redis at {where} answered with an error: {exc}")
    return BrokerkitError(f"redis client error talking to {where}: {type(exc).__name__}")


class Runner:
    """Runs redis calls: once on the fast path, then a bounded retry on transient failure.

    Raises BrokerUnavailable (naming host:port) once the retry gives up, and maps every
    other redis-py error through ``map_error``.
    """

    __slots__ = ("hosts",)

    def __init__(self, hosts: Sequence[HostPort]) -> None:
        self.hosts = tuple(hosts)

    async def __call__(self, operation: Callable[[], Awaitable[T]], *, patient: bool = False) -> T:
        """Run ``operation``; ``patient`` retries for the whole deadline (10 s), else 5 tries."""
        try:
            return await operation()
        except rex.RedisError as exc:
            if not is_transient(exc):
                raise map_error(exc, self.hosts) from exc
        except OSError:
            pass
        return await self.retry(operation, patient=patient)

    async def retry(self, operation: Callable[[], Awaitable[T]], *, patient: bool = False) -> T:
        # a coroutine *function*: tenacity calls anything else as sync and never awaits it
        async def attempt() -> T:
            return await operation()

        try:
            if patient:
                return await retry_unavailable(
                    attempt,
                    what="redis",
                    hosts=self.hosts,
                    is_transient=is_transient,
                    attempts=PATIENT_ATTEMPTS,
                    deadline=DEFAULT_DEADLINE,
                )
            return await retry_unavailable(
                attempt, what="redis", hosts=self.hosts, is_transient=is_transient
            )
        except (rex.RedisError, OSError) as exc:
            raise map_error(exc, self.hosts) from exc
