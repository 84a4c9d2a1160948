"""The one place where nats-py exceptions become brokerkit errors (the cause is kept)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import nats.errors
import nats.js.errors

from brokerkit._errors import (
    AlreadySettled,
    BrokerkitError,
    BrokerUnavailable,
    ConfigError,
    MessageTooLarge,
)
from brokerkit._url import HostPort

__all__ = ["is_transient", "mapped", "translate"]

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


def translate(exc: BaseException, what: str, hosts: Sequence[HostPort]) -> BrokerkitError:
    """The brokerkit error for a driver exception, most specific first.

    The text names the operation and the servers (never credentials).
    """
    if isinstance(exc, BrokerkitError):
        return exc
    where = ", ".join(str(h) for h in hosts) or "the NATS server"
    first = hosts[0] if hosts else HostPort("localhost")
    if isinstance(exc, _AUTH):
        return ConfigError(f"NATS at {where} refused the credentials or TLS settings ({what})")
    if isinstance(exc, nats.errors.MaxPayloadError):
        return MessageTooLarge(f"{what}: the message exceeds the server's max_payload")
    if isinstance(exc, nats.errors.MsgAlreadyAckdError):
        return AlreadySettled(f"{what}: the message was already settled")
    if isinstance(exc, nats.js.errors.APIError) and not isinstance(
        exc, nats.js.errors.ServiceUnavailableError
    ):
        code = getattr(exc, "err_code", None)
        desc = getattr(exc, "description", None) or type(exc).__name__
        return BrokerkitError(f"{what}: JetStream at {where} refused: {desc} (err_code {code})")
    if isinstance(exc, _TRANSPORT):
        return BrokerUnavailable(
            f"{what}: NATS at {where} did not answer ({type(exc).__name__})",
            host=first.host,
            port=first.port,
        )
    return BrokerkitError(f"{what}: unexpected NATS client error {type(exc).__name__}")


@contextmanager
def mapped(what: str, hosts: Sequence[HostPort]) -> Iterator[None]:
    """Run a block; re-raise any driver exception as its brokerkit error."""
    try:
        yield
    except BrokerkitError:
        raise
    except (TimeoutError, nats.errors.Error, OSError) as exc:
        raise translate(exc, what, hosts) from exc
