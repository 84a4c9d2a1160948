"""An open consumer rides out a broker outage instead of raising (CONTRACT section 9).

A backend's receive retries a failing broker within its own budget (Redis: 10 s), then
raises BrokerUnavailable. A network cut or a broker restart can last longer, and the
contract says consumers recover by themselves: so the iterator receives again, with a
short pause, until the broker answers or the consumer is closed. It logs a warning at
the first failure, every ``REMIND_EVERY`` seconds while it lasts, and once when it ends.
Opening a consumer (subscribe) still raises: a wrong host fails at once.
"""

from __future__ import annotations

import asyncio
import logging
import time

from brokerkit._errors import BrokerUnavailable

__all__ = ["Outage"]

_log = logging.getLogger("brokerkit.consumer")

MAX_PAUSE = 1.0
"""Longest pause between two receives (the backend's own retry already backed off; a
longer pause would only delay recovery and close)."""
REMIND_EVERY = 60.0


class Outage:
    """The failed receives of one consumer since it last received."""

    __slots__ = ("_reminded", "_since", "_where", "failures")

    def __init__(self, where: str) -> None:
        self._where = where
        self.failures = 0
        self._since = self._reminded = 0.0

    async def failed(self, exc: BrokerUnavailable) -> None:
        """A receive raised ``exc``: log it when due, then pause before the next one."""
        now = time.monotonic()
        if not self.failures:
            self._since = self._reminded = now
            _log.warning("%s: %s; receiving again until it answers", self._where, exc)
        elif now - self._reminded >= REMIND_EVERY:
            self._reminded = now
            _log.warning(
                "%s: still unavailable after %.0f s: %s", self._where, now - self._since, exc
            )
        self.failures += 1
        await asyncio.sleep(min(MAX_PAUSE, 0.05 * 2**self.failures))

    def ended(self) -> None:
        """A receive succeeded after failures."""
        _log.warning(
            "%s: receiving again after %.1f s", self._where, time.monotonic() - self._since
        )
        self.failures = 0
