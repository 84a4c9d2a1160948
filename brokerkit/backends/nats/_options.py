"""``nats://`` URL query options: a typed, frozen model, validated before any I/O."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from brokerkit.backends import Options

__all__ = ["NatsOptions"]

_KIB = 1024


class NatsOptions(Options):
    """Query parameters of ``nats://host:4222[,host2:4222]?...`` (and ``tls://``).

    Unknown parameters are ConfigError (from ``parse_options``); values are
    never echoed in errors.
    """

    dedup_window: float = Field(300.0, gt=0, le=30 * 86400)
    """Seconds a ``dedup_id`` is remembered: the streams' ``duplicate_window``."""
    max_age: float = Field(7 * 86400.0, gt=0)
    """Seconds a stream keeps a message (Limits retention); at least ``dedup_window``."""
    partitions: int = Field(32, ge=1, le=1024)
    """FIFO partitions of a new queue (fixed when the queue's stream is created)."""
    replicas: int = Field(1, ge=1, le=5)
    """Stream replicas (clustered servers)."""
    storage: Literal["file", "memory"] = "file"
    """Stream storage; ``memory`` loses everything on a server restart."""
    prefix: str = Field("brokerkit", pattern=r"^[A-Za-z0-9-]{1,32}$")
    """Namespace of subjects (``<prefix>.q.<queue>...``) and streams (``<prefix>_q_<queue>``)."""
    max_ack_pending: int = Field(10_000, ge=1)
    """Most unsettled messages without a fifo_group per consumer group."""
    max_message_bytes: int = Field(960 * _KIB, ge=256 * _KIB)
    """Largest body (``capabilities.max_message_bytes``). A server whose ``max_payload`` minus
    header room is smaller makes ``publish`` refuse larger bodies (MessageTooLarge)."""
    confirm_acks: bool = False
    """``ack`` waits for the server's reply (``ack_sync``) instead of a pipelined ``ack``."""
    connect_timeout: float = Field(2.0, gt=0, le=60)
    """Seconds per connection attempt (a bounded retry follows)."""
    request_timeout: float = Field(5.0, gt=0, le=300)
    """Seconds to wait for a JetStream API reply or a publish acknowledgement."""
    reconnect_wait: float = Field(0.5, gt=0, le=60)
    """Seconds between reconnection attempts after the connection is lost."""
    name: str | None = Field(None, max_length=128)
    """Connection name shown by the server's monitoring."""
    tls_ca: str | None = None
    """CA bundle file for ``tls://``."""
    tls_cert: str | None = None
    """Client certificate file for ``tls://`` (mutual TLS)."""
    tls_key: str | None = None
    """Client key file for ``tls://`` (mutual TLS)."""

    @model_validator(mode="after")
    def _consistent(self) -> NatsOptions:
        if self.max_age < self.dedup_window:
            raise ValueError("max_age must be at least dedup_window (the server requires it)")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together")
        return self
