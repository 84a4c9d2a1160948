"""Name, size and argument rules of the contract (section 2), checked before any I/O."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from brokerkit._errors import InvalidArgument, InvalidMessage, InvalidName, MessageTooLarge
from brokerkit._message import Outgoing
from brokerkit._wire import HEADER_PREFIX

RESERVED_HEADER_PREFIX = HEADER_PREFIX
_PREFIX_LEN = len(RESERVED_HEADER_PREFIX)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def check_name(kind: str, value: object) -> str:
    """A queue or consumer-group name: ``^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$``."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise InvalidName(
            f"invalid {kind} name {value!r}: use 1-64 of A-Z a-z 0-9 _ -, starting with a "
            "letter or digit"
        )
    return value


def check_token(kind: str, value: object) -> str | None:
    """A fifo_group or dedup_id: 1-128 printable ASCII characters without spaces."""
    if value is None:
        return None
    if (
        type(value) is not str
        or not 0 < len(value) <= 128
        or not value.isascii()
        or not value.isprintable()
        or " " in value
    ):
        raise InvalidName(f"invalid {kind} {value!r}: use 1-128 printable ASCII, no spaces")
    return value


def check_outgoing(
    msg: Outgoing, *, max_bytes: int, max_headers: int, max_header_bytes: int
) -> Outgoing:
    """Validate one message; return it (or a normalised copy: bytes body, headers copied).

    This runs once per published message, so the common case (bytes body, no
    or few headers) takes the short path.
    """
    if type(msg) is not Outgoing and not isinstance(msg, Outgoing):
        raise InvalidMessage(f"expected brokerkit.Outgoing, got {type(msg).__name__}")
    body = msg.body
    if type(body) is not bytes:
        if not isinstance(body, bytes | bytearray | memoryview):
            raise InvalidMessage(f"message body must be bytes, not {type(body).__name__}")
        body = bytes(body)
    if len(body) > max_bytes:
        raise MessageTooLarge(
            f"message body is {len(body)} bytes; this broker takes at most {max_bytes}"
        )
    if msg.fifo_group is not None:
        check_token("fifo_group", msg.fifo_group)
    if msg.dedup_id is not None:
        check_token("dedup_id", msg.dedup_id)
    headers = msg.headers
    if headers or type(headers) is not dict:
        headers = check_headers(headers, max_headers=max_headers, max_bytes=max_header_bytes)
    if body is msg.body and headers is msg.headers:
        return msg
    return Outgoing(body, msg.fifo_group, msg.dedup_id, headers)


def check_headers(headers: object, *, max_headers: int, max_bytes: int) -> dict[str, str]:
    if headers is None:
        return {}
    if type(headers) is not dict and not isinstance(headers, Mapping):
        raise InvalidMessage(
            f"headers must be a mapping of str to str, not {type(headers).__name__}"
        )
    if len(headers) > max_headers:
        raise InvalidMessage(f"{len(headers)} headers; at most {max_headers} are allowed")
    total = 0
    for key, value in headers.items():
        if type(key) is not str or type(value) is not str:
            raise InvalidMessage(
                f"header {key!r}: headers must be str -> str, got {type(key).__name__} -> "
                f"{type(value).__name__}"
            )
        if not key:
            raise InvalidMessage("header names must not be empty")
        if key[:12].lower() == RESERVED_HEADER_PREFIX:
            raise InvalidMessage(
                f"header {key!r}: the prefix {RESERVED_HEADER_PREFIX!r} is reserved"
            )
        total += len(key) + len(value)
        if not (key.isascii() and value.isascii()):
            total += len(key.encode()) + len(value.encode()) - len(key) - len(value)
    if total > max_bytes:
        raise InvalidMessage(f"headers are {total} bytes in all; at most {max_bytes} are allowed")
    # a copy, always: the caller may change its dict once the call is made (a publish
    # gathered behind others is sent later), and what was checked is what is sent
    return dict(headers)


def check_seconds(
    name: str, value: Any, *, allow_none: bool = False, positive: bool = False
) -> float | None:
    """A duration in seconds: a finite, non-negative number (positive when asked)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise InvalidArgument(f"{name} must be {'positive' if positive else '>= 0'}, got {value!r}")
    return float(value)


def check_int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def check_consumer_args(
    max_attempts: object, ack_timeout: object, prefetch: object, close_timeout: object
) -> tuple[int, float, int, float]:
    """Validate consumer arguments before any I/O."""
    attempts = check_int("max_attempts", max_attempts, minimum=1)
    timeout = check_seconds("ack_timeout", ack_timeout, positive=True)
    fetch = check_int("prefetch", prefetch, minimum=1)
    close = check_seconds("close_timeout", close_timeout)
    assert timeout is not None and close is not None
    return attempts, timeout, fetch, close
