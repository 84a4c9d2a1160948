"""Typed URL query options of ``amqp://`` and ``amqps://``, validated before any I/O."""

from __future__ import annotations

from pydantic import Field, model_validator

from brokerkit.backends import Options

__all__ = ["RabbitOptions"]

MIB = 1024 * 1024


class RabbitOptions(Options):
    """``amqp://user:pass@host:5672/vhost?name=value&...``; unknown names are ConfigErrors.

    Values are never echoed in errors (``parse_options``).
    """

    partitions: int = Field(default=8, ge=1, le=256)
    """FIFO partition queues of a new queue. Fixed by the first client that creates the
    queue and stored on the server (the ``<prefix>.<queue>.meta`` marker): later clients
    use the stored number, whatever they ask for."""
    prefetch: int | None = Field(default=None, ge=1, le=65535)
    """Deliveries a consumer fetches ahead. Unset: the consumer's own ``prefetch``. The
    queue of messages without a fifo_group gets all of it, each partition a share (at
    least 1). ``basic.qos`` of each RabbitMQ queue is this plus its ``max_held`` share."""
    max_held: int = Field(default=256, ge=1, le=65535)
    """Deliveries a consumer may hold unsettled (handed out, or waiting out a nack delay)
    while RabbitMQ keeps delivering: added to ``basic.qos`` (each partition a share, at
    least 1), since RabbitMQ counts every unacked delivery against it."""
    max_in_flight: int = Field(default=500, ge=1, le=65535)
    """Publishes awaiting their confirm at once, per ``publish_many`` (a sliding window)."""
    heartbeat: int = Field(default=60, ge=0, le=3600)
    """AMQP heartbeat in seconds (0 turns heartbeats off)."""
    connect_timeout: float = Field(default=5.0, gt=0, le=300)
    """Seconds per connection attempt (a bounded retry follows)."""
    request_timeout: float = Field(default=30.0, gt=0, le=3600)
    """Seconds to wait for a declare reply or for the confirms of one publish call."""
    dedup_window: float = Field(default=300.0, gt=0, le=86400)
    """Seconds a ``dedup_id`` suppresses later copies (stamped on each message)."""
    max_message_bytes: int = Field(default=16 * MIB, ge=256 * 1024, le=128 * MIB)
    """Largest body (RabbitMQ 4.x refuses more than 16 MiB by default, 3.x 128 MiB)."""
    prefix: str = Field(default="brokerkit", pattern=r"^[A-Za-z0-9_-]{1,32}$")
    """Namespace of every RabbitMQ queue brokerkit makes: ``<prefix>.<queue>...``."""
    name: str | None = Field(default=None, max_length=128)
    """Connection name shown in the management UI."""
    tls_ca: str | None = None
    """amqps:// only: CA bundle file to verify the server with."""
    tls_cert: str | None = None
    """amqps:// only: client certificate file (mutual TLS), with ``tls_key``."""
    tls_key: str | None = None
    """amqps:// only: client key file (mutual TLS), with ``tls_cert``."""
    tls_verify: bool = True
    """amqps:// only: verify the server certificate and host name."""

    @model_validator(mode="after")
    def _consistent(self) -> RabbitOptions:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        return self
