"""The bounded retry before BrokerUnavailable, written once for every backend."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from brokerkit._errors import BrokerUnavailable
from brokerkit._url import HostPort

T = TypeVar("T")

DEFAULT_ATTEMPTS = 5
DEFAULT_DEADLINE = 10.0


async def retry_unavailable(
    operation: Callable[[], Awaitable[T]],
    *,
    what: str,
    hosts: Sequence[HostPort],
    is_transient: Callable[[BaseException], bool],
    attempts: int = DEFAULT_ATTEMPTS,
    deadline: float = DEFAULT_DEADLINE,
) -> T:
    """Run ``operation``, retrying transient failures with jittered exponential backoff.

    After ``attempts`` tries or ``deadline`` seconds raise BrokerUnavailable naming
    host and port, with the last driver error as ``__cause__``. Errors that
    ``is_transient`` rejects propagate at once.
    """
    retrying = AsyncRetrying(
        stop=stop_after_attempt(attempts) | stop_after_delay(deadline),
        wait=wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.1),
        retry=retry_if_exception(is_transient),
    )

    async def attempt() -> T:
        # tenacity awaits only coroutine functions; operation may be a lambda returning one
        return await operation()

    try:
        return await retrying(attempt)
    except RetryError as exc:
        last = exc.last_attempt.exception()
        first = hosts[0] if hosts else HostPort("localhost")
        where = ", ".join(str(h) for h in hosts) or str(first)
        raise BrokerUnavailable(
            f"{what} at {where} did not answer after {exc.last_attempt.attempt_number} attempts",
            host=first.host,
            port=first.port,
        ) from last
