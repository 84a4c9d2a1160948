"""Middleware: one small protocol around handling and publishing, for built-ins and users.

A middleware wraps the App's two paths once, when the App starts (so it costs nothing
per message beyond its own calls):

* ``handle(call_next, route)`` returns the function that processes one received message
  of ``route`` (decode, the user's handler, the settle) and returns its ``Outcome``;
* ``publish(call_next)`` returns the function that publishes one message to a queue.

Both default to passing through, so a middleware overrides only what it needs::

    class Timing(brokerkit.Middleware):
        def handle(self, call_next, route):
            async def timed(msg):
                started = time.perf_counter()
                try:
                    return await call_next(msg)
                finally:
                    record(route.queue, time.perf_counter() - started)
            return timed

The first middleware in ``App(middleware=[...])`` is the outermost.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from brokerkit._message import Outgoing, PublishResult

if TYPE_CHECKING:
    from brokerkit._consumer import Message

__all__ = ["Handle", "Middleware", "Outcome", "Publish", "Route"]


class Outcome(enum.Enum):
    """How the App settled one message."""

    ACKED = "acked"
    NACKED = "nacked"  # to be retried after a delay
    DEAD = "dead_lettered"  # to the DLQ (invalid payload, Reject, dead_on, attempts used up)
    LOST = "lease_lost"  # the lease ran out (or the settle failed): the broker redelivers it
    SETTLED = "settled"  # the handler settled the message itself


@dataclass(frozen=True, slots=True)
class Route:
    """One registered handler, as middleware sees it: low-cardinality labels."""

    queue: str
    group: str
    name: str
    """The handler function's qualified name."""
    system: str
    """The broker's URL scheme (``redis``, ``kafka``, ``memory``...)."""


Handle = Callable[["Message"], Awaitable[Outcome]]
Publish = Callable[[str, Outgoing], Awaitable[PublishResult]]


class Middleware:
    """Wraps the App's handle and publish paths; both methods pass through by default."""

    def handle(self, call_next: Handle, route: Route) -> Handle:
        return call_next

    def publish(self, call_next: Publish) -> Publish:
        return call_next
