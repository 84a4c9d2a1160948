"""NatsLink: the connection that the backend and its receivers share (neither owns the other).

The backend connects it (``open``) and closes it; a receiver gets it handed in and uses
the client, the options, what the server told at connect time, the error tables, and
the registry of open receivers (which the backend closes on ``aclose``).
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Sequence
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from brokerkit.backends import ErrorMap, HostPort, Receiver, ResourceClosed
from brokerkit.backends.nats._errors import BEST_EFFORT, error_map
from brokerkit.backends.nats._options import NatsOptions
from brokerkit.backends.nats._publisher import JetStreamPublisher

__all__ = ["NatsLink", "survive_late_pongs"]


class NatsLink:
    """One NATS connection (ours or the user's) and what the server said about itself."""

    __slots__ = (
        "_errors",
        "_hosts",
        "body_limit",
        "drain_pulls",
        "js_context",
        "nc",
        "options",
        "publisher",
        "receivers",
        "server_version",
    )

    def __init__(
        self, options: NatsOptions, hosts: Sequence[HostPort], client: NATS | None
    ) -> None:
        self.options = options
        self._hosts = tuple(hosts)
        self.nc: NATS | None = client
        self.js_context: JetStreamContext | None = None
        self.server_version: tuple[int, int, int] | None = None
        self.drain_pulls = False
        """Server before 2.10: never drop an inbox with pull requests outstanding (see receiver)."""
        self.body_limit: int | None = None
        """Largest body this server takes, when it is below ``max_message_bytes`` (else None)."""
        self.receivers: set[Receiver[Any]] = set()
        self.publisher: JetStreamPublisher | None = None
        """The connection's pipelined publishes (made when the backend opens)."""
        self._errors: dict[str, ErrorMap] = {}

    @property
    def hosts(self) -> tuple[HostPort, ...]:
        return self._hosts

    @hosts.setter
    def hosts(self, hosts: Sequence[HostPort]) -> None:
        self._hosts = tuple(hosts)
        self._errors.clear()  # their texts name the servers

    def where(self) -> str:
        return ", ".join(str(h) for h in self._hosts) or "the NATS server"

    def errors(self, what: str) -> ErrorMap:
        """The error table for operation ``what`` (made once per operation name)."""
        table = self._errors.get(what)
        if table is None:
            table = self._errors[what] = error_map(what, self._hosts)
        return table

    @property
    def client(self) -> NATS:
        """The connection; ResourceClosed when it is not open."""
        if self.nc is None:
            raise ResourceClosed("the NATS backend is not open")
        return self.nc

    @property
    def js(self) -> JetStreamContext:
        """The JetStream context; ResourceClosed when the connection is not open."""
        if self.js_context is None or self.nc is None:
            raise ResourceClosed("the NATS backend is not open")
        return self.js_context

    async def drain_inbox(self, sub: Subscription, timeout: float) -> None:
        """``sub.drain()`` within ``timeout``; on a cut path, drop it unheard."""
        try:
            await asyncio.wait_for(sub.drain(), timeout)  # type: ignore[no-untyped-call]
        except (*BEST_EFFORT, asyncio.CancelledError) as exc:
            # nats-py leaves a subscription whose drain failed registered (and resubscribed
            # after a reconnect): remove it the way its own unsubscribe does
            sub._stop_processing()  # no public way after a failed drain
            self.client._remove_sub(sub._id)
            if isinstance(exc, asyncio.CancelledError):
                raise


def survive_late_pongs(nc: NATS) -> None:
    """Make ``nc`` take a PONG whose ``flush`` gave up (nats-py 2.16 does not).

    ``flush(timeout)`` queues a future per PING and cancels it on timeout, but leaves it
    queued. When that PONG comes after all (a network cut longer than the timeout, then
    restored), nats-py sets the cancelled future's result, ``InvalidStateError`` ends its
    read loop, and the connection stays up deaf: writes still reach the server, nothing is
    read again (no delivery, no PONG, no reply) until the stale-connection check minutes
    later. Measured: a NATS consumer, after a 20 s cut during which an ack's PING timed out,
    sent pull requests for 67 s and read none of their deliveries (2026-12-03). Every
    ``flush`` can time out so (``Subscription.drain`` calls one too): the PONG handler of
    this client (ours or the user's) skips a future that is already done.
    """
    if isinstance(getattr(nc, "_pongs", None), list) and hasattr(nc, "_pongs_received"):
        nc._process_pong = types.MethodType(_process_pong, nc)  # type: ignore[method-assign]
    # else a nats-py whose internals moved on (where the fix may have landed): left alone


async def _process_pong(nc: NATS) -> None:
    """nats-py's ``Client._process_pong``, minus the ``set_result`` on a done future."""
    if nc._pongs:
        future = nc._pongs.pop(0)
        if not future.done():
            future.set_result(True)
        nc._pongs_received += 1
        nc._pings_outstanding = 0
