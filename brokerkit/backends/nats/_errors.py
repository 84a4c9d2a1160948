"""The one place where nats-py exceptions become brokerkit errors (the cause is kept).

``error_map(what, hosts)`` is the backend's ``ErrorMap`` table, most specific first; the
text names the operation and the servers (never credentials). ``NatsLink.errors(what)``
keeps one per operation, so a hot path (ack) pays for no table building.

nats-py's MsgAlreadyAckdError has no rule of its own: settling twice is refused by the
facade (AlreadySettled) before a receiver is called, and the receiver settles each
message once, so meeting it would be a bug, reported by the last rule.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import nats.errors
import nats.js.errors

from brokerkit.backends import (
    BrokerRefused,
    BrokerUnavailable,
    ConfigError,
    ErrorMap,
    HostPort,
    MessageTooLarge,
    ResourceClosed,
)

__all__ = ["BEST_EFFORT", "error_map", "is_transient"]

BEST_EFFORT = (
    nats.errors.Error,
    OSError,
    TimeoutError,
    BrokerRefused,
    BrokerUnavailable,
    ConfigError,
    ResourceClosed,
)
"""What a best-effort step at close may meet (the server redelivers what it did not hear)."""

_TRANSPORT = (
    nats.errors.NoServersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.errors.ProtocolError,
    asyncio.TimeoutError,
    OSError,
)
_AUTH = (
    nats.errors.AuthorizationError,
    nats.errors.InvalidUserCredentialsError,
    nats.errors.SecureConnRequiredError,
    nats.errors.SecureConnWantedError,
    nats.errors.SecureConnFailedError,
)


def is_transient(exc: BaseException) -> bool:
    """Worth retrying while connecting: nobody answered (yet)."""
    return isinstance(exc, _TRANSPORT) and not isinstance(exc, _AUTH)


def _refusal(exc: BaseException, what: str, where: str) -> BrokerRefused | None:
    if isinstance(exc, nats.js.errors.ServiceUnavailableError):
        return None  # JetStream not answering: a transport condition (next rules)
    err_code = getattr(exc, "err_code", None)
    desc = getattr(exc, "description", None) or type(exc).__name__
    text = f"{what}: JetStream at {where} refused: {desc} (err_code {err_code})"
    return BrokerRefused(text, code=err_code or getattr(exc, "code", None))


def error_map(what: str, hosts: Sequence[HostPort]) -> ErrorMap:
    """The table for ``what`` (an operation, named in each message) on a connection to ``hosts``."""
    where = ", ".join(str(h) for h in hosts) or "the NATS server"
    first = hosts[0] if hosts else HostPort("localhost")

    def unavailable(text: str) -> BrokerUnavailable:
        return BrokerUnavailable(text, host=first.host, port=first.port)

    return ErrorMap(
        (
            _AUTH,
            lambda e: ConfigError(
                f"NATS at {where} refused the credentials or TLS settings ({what})"
            ),
        ),
        (
            nats.errors.MaxPayloadError,
            lambda e: MessageTooLarge(f"{what}: the message exceeds the server's max_payload"),
        ),
        (nats.js.errors.APIError, lambda e: _refusal(e, what, where)),
        (
            _TRANSPORT,
            lambda e: unavailable(f"{what}: NATS at {where} did not answer ({type(e).__name__})"),
        ),
        (
            nats.errors.Error,
            lambda e: unavailable(f"{what}: unexpected NATS client error {type(e).__name__}"),
        ),
    )
