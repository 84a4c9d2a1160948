"""Decoding broker-side input that brokerkit did not write (or wrote and was damaged).

Shared by the backends (through ``brokerkit.backends``): a receiver decodes what it read
with these and marks a corrupt message with ``Delivery.defect`` instead of raising, so a
foreign or damaged message never stops the messages beside it. The rule they implement is
the section "Broker-side input" of docs/contract.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from brokerkit._errors import InvalidName
from brokerkit._validate import check_token

__all__ = ["header_defect", "json_headers", "str_headers", "valid_token"]

_JSON_KIND = {list: "an array", type(None): "null", str: "a string", bool: "a boolean"}
_NAME_SHOWN = 40
"""Longest header name quoted in a defect (a hostile name must not flood the reason)."""


def header_defect(name: object, what: str) -> str:
    """The defect of one header: its name (quoted, cut to a readable length) and ``what``
    is wrong with its value ("is list, not a string", "is not UTF-8")."""
    return f"header {repr(name)[:_NAME_SHOWN]} {what}"


def str_headers(value: Mapping[Any, Any]) -> tuple[dict[str, str], str | None]:
    """The ``str -> str`` pairs of ``value``, and the defect when some pair is not one
    (a header value of a type brokerkit never writes: a list, null, a number, bytes)."""
    good = {k: v for k, v in value.items() if type(k) is str and type(v) is str}
    if len(good) == len(value):
        return good, None
    name, bad = next((k, v) for k, v in value.items() if k not in good)
    return good, header_defect(name, f"is {type(bad).__name__}, not a string")


def json_headers(blob: bytes | str) -> tuple[dict[str, str], str | None]:
    """Headers brokerkit wrote as one JSON object of strings; on anything else the headers
    that can be decoded (maybe none) and the defect."""
    try:
        value = json.loads(blob)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
        return {}, "headers field is not JSON"
    if not isinstance(value, dict):
        kind = _JSON_KIND.get(type(value), "a number")
        return {}, f"headers field is not a JSON object ({kind})"
    for item in value.values():  # a JSON object's names are str already
        if type(item) is not str:
            return str_headers(value)
    return value, None


def valid_token(value: str) -> bool:
    """True when ``value`` is a fifo_group or dedup id that ``publish`` accepts: a broker
    field holding anything else was not written by brokerkit (or was damaged)."""
    try:
        check_token("token", value)
    except InvalidName:
        return False
    return True
