"""The bounded retry before BrokerUnavailable, written once for every backend."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryError,
    Retrying,
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
    retrying = AsyncRetrying(**_policy(is_transient, attempts, deadline))

    async def attempt() -> T:
        # tenacity awaits only coroutine functions; operation may be a lambda returning one
        return await operation()

    try:
        return await retrying(attempt)
    except RetryError as exc:
        raise _unavailable(exc, what, hosts) from exc.last_attempt.exception()


def retry_unavailable_blocking(
    operation: Callable[[], T],
    *,
    what: str,
    hosts: Sequence[HostPort],
    is_transient: Callable[[BaseException], bool],
    attempts: int = DEFAULT_ATTEMPTS,
    deadline: float = DEFAULT_DEADLINE,
) -> T:
    """``retry_unavailable`` for a blocking call on a driver's own thread (a rebalance
    callback, say): the same policy, sleeping between tries."""
    try:
        return Retrying(**_policy(is_transient, attempts, deadline))(operation)
    except RetryError as exc:
        raise _unavailable(exc, what, hosts) from exc.last_attempt.exception()


def _policy(
    is_transient: Callable[[BaseException], bool], attempts: int, deadline: float
) -> dict[str, Any]:
    return {
        "stop": stop_after_attempt(attempts) | stop_after_delay(deadline),
        "wait": wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.1),
        "retry": retry_if_exception(is_transient),
    }


def _unavailable(exc: RetryError, what: str, hosts: Sequence[HostPort]) -> BrokerUnavailable:
    first = hosts[0] if hosts else HostPort("localhost")
    where = ", ".join(str(h) for h in hosts) or str(first)
    return BrokerUnavailable(
        f"{what} at {where} did not answer after {exc.last_attempt.attempt_number} attempts",
        host=first.host,
        port=first.port,
    )
