"""The one place where aio-pika / aiormq exceptions become brokerkit errors.

``error_map(hosts)`` builds the backend's ``ErrorMap`` (its BrokerUnavailable names the
host and port it was built with). Texts name the operation's broker, never the URL or
its credentials; the driver's exception stays as ``__cause__``.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Sequence

from aiormq import exceptions as amqp

from brokerkit.backends import (
    BrokerRefused,
    BrokerUnavailable,
    ConfigError,
    ErrorMap,
    HostPort,
    LeaseExpired,
    MessageTooLarge,
    ResourceClosed,
    UnsupportedFeature,
)

__all__ = ["MAPPED", "error_map", "is_transient", "stored_value"]

_TRANSPORT = (
    amqp.AMQPConnectionError,
    amqp.ChannelInvalidStateError,
    amqp.IncompatibleProtocolError,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
)
MAPPED = (
    BrokerUnavailable,
    BrokerRefused,
    ConfigError,
    MessageTooLarge,
    ResourceClosed,
    UnsupportedFeature,
    LeaseExpired,
)
"""Every brokerkit error this backend's calls raise (the table's, the retry's, its own)."""
_AUTH = (amqp.AuthenticationError, amqp.ProbableAuthenticationError)
_STORED = re.compile(r"but current is '([^']*)'")
_SSL_REASON = re.compile(r"\[SSL: ([A-Z_]+)\]")
_TOO_LARGE = re.compile(r"larger than configured max size|message size", re.IGNORECASE)


def is_transient(exc: BaseException) -> bool:
    """Worth retrying while connecting: nobody answered (yet); credentials and a failed
    TLS handshake are not."""
    return isinstance(exc, _TRANSPORT) and not isinstance(exc, _AUTH) and _tls_problem(exc) is None


def _tls_problem(exc: BaseException) -> str | None:
    """The TLS reason when ``exc`` (or what it wraps) is a failed TLS handshake."""
    if isinstance(exc, ssl.SSLError):
        return str(getattr(exc, "reason", None) or type(exc).__name__)
    if isinstance(exc, amqp.AMQPConnectionError):
        text = " ".join(str(a) for a in exc.args)
        found = _SSL_REASON.search(text)
        if found:
            return found.group(1)
    return None


def stored_value(exc: BaseException) -> str | None:
    """The value a PRECONDITION_FAILED names as current (``but current is 'X'``)."""
    found = _STORED.search(_reply_text(exc))
    return found.group(1) if found else None


def _reply_text(exc: BaseException) -> str:
    return " ".join(str(a) for a in exc.args if isinstance(a, str))


def _code(exc: BaseException) -> int | None:
    frame = exc.args[0] if exc.args else None
    code = getattr(frame, "reply_code", None)
    return code if isinstance(code, int) else None


def error_map(hosts: Sequence[HostPort]) -> ErrorMap:
    """The backend's table, most specific rule first."""
    where = ", ".join(str(h) for h in hosts) or "RabbitMQ"
    first = hosts[0] if hosts else HostPort("localhost", 5672)

    def unavailable(exc: BaseException) -> BrokerUnavailable:
        return BrokerUnavailable(
            f"RabbitMQ at {where} is unavailable ({type(exc).__name__})",
            host=first.host,
            port=first.port,
        )

    def precondition(exc: BaseException) -> BrokerRefused | MessageTooLarge:
        text = _reply_text(exc)
        if _TOO_LARGE.search(text):
            return MessageTooLarge(f"RabbitMQ at {where} refused the message as too large")
        return BrokerRefused(f"RabbitMQ at {where} refused: {text}", code=406)

    def tls(exc: BaseException) -> ConfigError | None:
        reason = _tls_problem(exc)
        if reason is None:
            return None  # not TLS: the next rule decides
        return ConfigError(
            f"TLS with RabbitMQ at {where} failed ({reason}): check tls_ca, tls_verify "
            "and that the port speaks TLS"
        )

    return ErrorMap(
        (_AUTH, lambda e: ConfigError(f"RabbitMQ at {where} refused the credentials")),
        ((ssl.SSLError, amqp.AMQPConnectionError), tls),
        (
            amqp.ConnectionNotAllowed,
            lambda e: ConfigError(f"RabbitMQ at {where} refused access to the virtual host"),
        ),
        (
            amqp.ChannelAccessRefused,
            lambda e: BrokerRefused(f"RabbitMQ at {where}: access refused", code=403),
        ),
        (
            amqp.ChannelNotFoundEntity,
            lambda e: BrokerRefused(f"RabbitMQ at {where}: not found", code=404),
        ),
        (amqp.ChannelPreconditionFailed, precondition),
        (
            amqp.PublishError,
            lambda e: BrokerRefused(f"RabbitMQ at {where} returned an unroutable message"),
        ),
        (
            amqp.DeliveryError,
            lambda e: BrokerRefused(f"RabbitMQ at {where} did not accept the message (nack)"),
        ),
        (
            amqp.ChannelClosed,
            lambda e: BrokerRefused(
                f"RabbitMQ at {where} closed the channel: {_reply_text(e)}", code=_code(e)
            ),
        ),
        (_TRANSPORT, unavailable),
        (amqp.AMQPError, lambda e: BrokerRefused(f"RabbitMQ at {where}: {type(e).__name__}")),
    )
