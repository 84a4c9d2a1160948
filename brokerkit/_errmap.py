"""Driver errors -> brokerkit errors: one helper, one table per backend, cause kept.

::

    ERRORS = ErrorMap(
        (redis.AuthenticationError, lambda e: ConfigError("redis refused the credentials")),
        (redis.ResponseError, lambda e: BrokerRefused(f"redis refused: {e}", code=...)),
        (OSError, lambda e: BrokerUnavailable(...)),
    )

    with ERRORS:
        await client.xadd(...)

Rules are tried in order, so the most specific comes first. A rule's factory may return
None to pass on (the next rule is tried). Brokerkit errors pass through unchanged, and an
exception that no rule matches propagates as it is (a bug, not a broker condition). The
mapped error is raised ``from`` the driver's, so ``__cause__`` keeps it for debugging;
its text is whatever the factory wrote (never the driver's repr of a URL or password).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Literal

from brokerkit._errors import BrokerkitError

Factory = Callable[[BaseException], BrokerkitError | None]
Rule = tuple[type[BaseException] | tuple[type[BaseException], ...], Factory]

__all__ = ["ErrorMap", "Factory", "Rule"]


class ErrorMap:
    """A backend's table of driver exception -> brokerkit error, usable as ``with table:``.

    Reusable and reentrant (it keeps no state), so a backend keeps one instance per table.
    """

    __slots__ = ("rules",)

    def __init__(self, *rules: Rule) -> None:
        self.rules = rules

    def translate(self, exc: BaseException) -> BrokerkitError | None:
        """The brokerkit error for ``exc`` (``exc`` itself if it is one), or None."""
        if isinstance(exc, BrokerkitError):
            return exc
        for kinds, factory in self.rules:
            if isinstance(exc, kinds):
                mapped = factory(exc)
                if mapped is not None:
                    return mapped
        return None

    def __enter__(self) -> ErrorMap:
        return self

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if exc is None or isinstance(exc, BrokerkitError) or not isinstance(exc, Exception):
            return False  # success, already ours, or CancelledError/KeyboardInterrupt
        mapped = self.translate(exc)
        if mapped is None:
            return False
        raise mapped from exc
