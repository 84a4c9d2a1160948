"""The one exception hierarchy of brokerkit.

::

    BrokerkitError
    ├── ConfigError          bad URL, unknown scheme or parameter (never echoes a password)
    ├── InvalidName          queue, group, fifo_group or dedup_id outside the portable rules
    ├── InvalidArgument      a bad value passed to the API (also a ValueError)
    │   └── InvalidMessage   body not bytes, headers not str -> str or too large
    ├── MessageTooLarge      body over capabilities.max_message_bytes
    ├── UnsupportedFeature   an option this backend cannot honour
    ├── BrokerUnavailable    the broker did not answer after a bounded retry
    ├── BrokerRefused        the broker answered and refused the request (``.code``: its own)
    ├── LeaseExpired         settling a message whose lease was lost
    ├── AlreadySettled       settling a message twice
    └── ResourceClosed       using a broker or consumer after aclose()

Client-library exceptions never leave the public API: each backend maps them in
one place and keeps the original as ``__cause__``.
"""

from __future__ import annotations


class BrokerkitError(Exception):
    """Base class of every error brokerkit raises."""


class ConfigError(BrokerkitError):
    """The URL or an option is wrong; the message names the part at fault."""


class InvalidName(BrokerkitError):
    """A queue, consumer group, fifo_group or dedup_id breaks the naming rules."""


class InvalidArgument(BrokerkitError, ValueError):
    """A value passed to the API is out of range or of the wrong type."""


class InvalidMessage(InvalidArgument):
    """A message body or its headers are not acceptable."""


class MessageTooLarge(BrokerkitError):
    """The body is larger than ``capabilities.max_message_bytes``."""


class UnsupportedFeature(BrokerkitError):
    """The backend cannot honour an option; raised when the option is passed."""


class BrokerUnavailable(BrokerkitError):
    """The broker did not answer after a bounded retry."""

    def __init__(self, message: str, *, host: str | None = None, port: int | None = None) -> None:
        super().__init__(message)
        self.host = host
        self.port = port


class BrokerRefused(BrokerkitError):
    """The broker answered and refused the request (permissions, a conflicting queue, a limit).

    ``code`` is the broker's own name or number for the refusal (e.g. ``"NOPERM"``,
    ``"AWS.SimpleQueueService.QueueDeletedRecently"``, ``406``), or None.
    """

    def __init__(self, message: str, *, code: str | int | None = None) -> None:
        super().__init__(message)
        self.code = code


class LeaseExpired(BrokerkitError):
    """The lease on a received message ran out; it may already be redelivered."""


class AlreadySettled(BrokerkitError):
    """The message was already acked, nacked or dead-lettered."""


class ResourceClosed(BrokerkitError):
    """The broker or consumer was closed with ``aclose()``."""
