"""``sqs://`` URL query options: a typed, frozen model, validated before any I/O."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, field_validator

from brokerkit.backends import Options

__all__ = ["SqsOptions"]


class SqsOptions(Options):
    """Query parameters of ``sqs://?region=...&endpoint=...``.

    Everything is optional: ``sqs://`` alone uses the standard AWS chain for the region
    and the credentials (environment, shared config/credentials files, ``profile``,
    container or instance role). Unknown parameters are ConfigErrors; values are never
    echoed in errors.
    """

    region: str | None = Field(None, pattern=r"^[a-z]{2}(-[a-z0-9]+){1,4}$")
    """AWS region (default: the chain's, e.g. ``AWS_REGION`` or the profile's)."""
    endpoint: str | None = None
    """Endpoint URL (an emulator: ``http://127.0.0.1:4566``); default: the region's."""
    profile: str | None = Field(None, pattern=r"^[A-Za-z0-9_.@+=,-]{1,64}$")
    """Named profile of the shared AWS config/credentials files."""
    prefix: str = Field("", pattern=r"^[A-Za-z0-9_-]{0,40}$")
    """Prepended to every SQS queue name (``<prefix><queue>.fifo``)."""
    wait: int = Field(20, ge=0, le=20)
    """Longest ``WaitTimeSeconds`` of one ReceiveMessage long poll (SQS allows 0-20)."""
    connect_timeout: float = Field(5.0, gt=0, le=120)
    """Seconds to open an HTTP connection (a bounded retry follows)."""
    read_timeout: float = Field(30.0, gt=0, le=300)
    """Seconds to wait for a reply beyond the long poll's own wait."""
    max_attempts: int = Field(5, ge=1, le=20)
    """Tries per API call (botocore's standard retry: throttling and 5xx, with backoff)."""
    threads: int = Field(16, ge=2, le=256)
    """Size of the backend's own thread pool for blocking boto3 calls (long polls hold one)."""

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials (use the AWS credential chain)")
        if parts.query or parts.fragment:
            raise ValueError("must not have a query or fragment")
        return value.rstrip("/")
