"""What a handler's exception means: retry later (with which delay) or dead-letter now.

Built on the durable attempt count (``msg.attempt``, 1-based): the delay before attempt
n + 1 is tenacity's exponential wait with full jitter, ``uniform(0, min(cap, initial *
2 ** (n - 1)))``, and never above the broker's ``capabilities.max_nack_delay``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import tenacity

from brokerkit._errors import InvalidArgument
from brokerkit._validate import check_int, check_seconds

if TYPE_CHECKING:
    from brokerkit._consumer import Message

OnDead = Callable[["Message", BaseException], Awaitable[None] | None]
"""Called for each message an App sends to the DLQ, with the exception that sent it."""

__all__ = ["OnDead", "Reject", "RetryPolicy"]


class Reject(Exception):
    """Raise from a handler to dead-letter the message now, with ``reason``."""

    def __init__(self, reason: str = "rejected by the handler") -> None:
        super().__init__(reason)
        self.reason = reason or "rejected by the handler"


@dataclass(frozen=True)
class RetryPolicy:
    """Retry a failed message with jittered exponential backoff, up to ``max_attempts``.

    * ``max_attempts``: deliveries in all; a failure at the last one dead-letters the
      message (reason ``max_attempts``).
    * ``initial``, ``maximum``: the backoff's first ceiling and its cap, in seconds
      (capped again by the broker's ``max_nack_delay``); ``jitter=False`` waits the
      ceiling itself. ``wait``: any tenacity wait instead (``tenacity.wait_fixed(5)``).
    * ``retry_on``: the exceptions that are retried (default: every ``Exception``);
      ``dead_on``: those dead-lettered at once (checked first). Anything else that is
      not retried is dead-lettered at once too.
    * ``on_dead``: called (sync or async) with the message and the exception, for every
      message the App dead-letters (invalid payload, ``Reject``, ``dead_on``, attempts
      used up). Its own errors are logged, never raised.
    """

    max_attempts: int = 5
    initial: float = 1.0
    maximum: float = 300.0
    jitter: bool = True
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    dead_on: tuple[type[BaseException], ...] = ()
    on_dead: OnDead | None = None
    wait: tenacity.wait.wait_base | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_int("max_attempts", self.max_attempts, minimum=1)
        check_seconds("initial", self.initial)
        check_seconds("maximum", self.maximum)
        for name in ("retry_on", "dead_on"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(
                isinstance(t, type) and issubclass(t, BaseException) for t in value
            ):
                raise InvalidArgument(f"{name} must be a tuple of exception classes")
        if self.wait is None:
            kind = tenacity.wait_random_exponential if self.jitter else tenacity.wait_exponential
            object.__setattr__(self, "wait", kind(multiplier=self.initial, max=self.maximum))

    def retries(self, exc: BaseException) -> bool:
        """True when ``exc`` is retried (nack), False when it dead-letters at once."""
        if isinstance(exc, Reject) or isinstance(exc, self.dead_on):
            return False
        return isinstance(exc, self.retry_on)

    def delay(self, attempt: int, cap: float) -> float:
        """Seconds before the next delivery after failed attempt ``attempt`` (1-based)."""
        wait = self.wait
        assert wait is not None  # set in __post_init__
        state: Any = _Attempt(attempt)
        return max(0.0, min(float(wait(state)), cap))


class _Attempt:
    """What tenacity's wait functions read of a RetryCallState: the attempt number."""

    __slots__ = ("attempt_number", "idle_for", "outcome", "seconds_since_start")

    def __init__(self, attempt: int) -> None:
        self.attempt_number = attempt
        self.idle_for = 0.0
        self.outcome = None
        self.seconds_since_start = None
