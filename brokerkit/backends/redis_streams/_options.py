"""Typed URL query options of ``redis://`` and ``rediss://``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from brokerkit.backends import Options

__all__ = ["RedisOptions"]

MIB = 1024 * 1024


class RedisOptions(Options):
    """``redis://[[user]:password@]host[:port][/db]?name=value&...``; unknown names are errors."""

    prefix: str = Field(default="brokerkit:", pattern=r"^[A-Za-z0-9_:.\-]{0,64}$")
    """Prepended to every key; the queue name is wrapped in a ``{hash tag}`` after it."""
    dedup_window: float = Field(default=300.0, gt=0, le=30 * 86400)
    """Seconds a ``dedup_id`` is remembered (``SET NX PX``)."""
    max_message_bytes: int = Field(default=1 * MIB, ge=256 * 1024, le=512 * MIB)
    """Largest body accepted (Redis' own cap is proto-max-bulk-len, 512 MB)."""
    ack_flush_interval: float = Field(default=0.05, ge=0, le=0.1)
    """Acks of messages without a fifo_group are coalesced this long (0: every ack is a call)."""
    trim_interval: float = Field(default=5.0, gt=0, le=3600)
    """How often a consumer trims entries every consumer group has acked."""
    poll_interval: float = Field(default=0.25, ge=0.01, le=5)
    """Longest blocking read: bounds how late a lease expiry taken elsewhere is noticed."""
    connect_timeout: float = Field(default=5.0, gt=0, le=300)
    socket_timeout: float = Field(default=10.0, gt=0, le=3600)
    """Longest one try of a Redis call may take (a blocking read: beyond its own wait);
    past it the connection is dropped and the call retried (then BrokerUnavailable)."""
    ssl_ca_certs: str | None = None
    """rediss:// only: CA bundle to verify the server with."""
    ssl_cert_reqs: Literal["required", "optional", "none"] = "required"
    ssl_check_hostname: bool = True
