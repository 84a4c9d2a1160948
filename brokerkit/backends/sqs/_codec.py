"""The wire format: one brokerkit message <-> one SQS FIFO message, and its exact size.

SQS allows 10 message attributes and a body of XML-legal Unicode text; brokerkit carries
any bytes, up to 32 headers, and must tell on receipt whether a message's group and
deduplication ids were the publisher's or made up by us. So:

* body: valid UTF-8 without characters SQS refuses (and without ``\\r``, which XML-based
  tools normalise) goes as the ``MessageBody`` text, readable in any console; any other
  body goes byte-exact in the Binary attribute ``brokerkit.body`` (``MessageBody`` then
  holds a short note);
* everything else is packed into ONE Binary attribute ``brokerkit``: a version byte, a
  flags byte (user's fifo_group? user's dedup_id? body in the attribute? empty body?),
  then each header as ``u16 key length, key, u32 value length, value`` (UTF-8, exact).
  A plain text message (no fifo_group, dedup_id or headers) has no attribute at all: its
  made-up group id (``bk-`` + 33-48 hex digits) tells a receiver it is ours;
* ``MessageGroupId``: the fifo_group, or a fresh unique id (full parallelism);
  ``MessageDeduplicationId``: the dedup_id, or a fresh unique id (never content-based).

``size`` counts what SQS counts against its limit: the body as sent plus, per attribute,
its name, its data type and its value.

A message given back unseen is sometimes *copied* (``encode_copy``): sent again and the
received one deleted, so that the receive it lost is not counted (``_copies``). The copy
carries the String attribute ``brokerkit.copy``: ``PRIOR:ORIGINAL_ID:USER_DEDUP_ID``,
the attempts counted before the copy, the id the publisher was given (the copy reports
it as its own) and the user's dedup id if there was one (the copy's own
``MessageDeduplicationId`` is fresh, or SQS would drop it as a duplicate).
"""

from __future__ import annotations

import itertools
import os
import re
import struct
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from brokerkit.backends import NO_HEADERS, Outgoing

__all__ = ["BODY", "COPY", "META", "Decoded", "decode", "encode", "encode_copy"]

META = "brokerkit"
BODY = "brokerkit.body"
COPY = "brokerkit.copy"
_VERSION = 1
_USER_GROUP, _USER_DEDUP, _BINARY_BODY, _EMPTY_BODY = 1, 2, 4, 8
_BINARY_NOTE = "(binary body: message attribute brokerkit.body)"
_EMPTY_NOTE = "(empty body)"
_ATTR_COST_META = len(META) + len("Binary")
_ATTR_COST_BODY = len(BODY) + len("Binary")
# characters SQS refuses in a body (outside XML 1.0's Char), plus \r (see module docstring)
_NOT_TEXT = re.compile("[^\t\n\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_MADE_UP_GROUP = re.compile(r"bk-[0-9a-f]{33,48}\Z")
_KEY = struct.Struct(">H")
_VALUE = struct.Struct(">I")


class _Ids:
    """Unique ids, cheaply: a random 128-bit prefix per process plus a counter (a fresh
    prefix after ``fork``, so parent and child never make the same id: a repeated
    deduplication id would make SQS drop a message)."""

    def __init__(self) -> None:
        self.reset()
        os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        self._prefix = uuid.uuid4().hex
        self._next = itertools.count().__next__

    def new(self) -> str:
        return f"{self._prefix}{self._next():x}"


_ids = _Ids()


def _pack_headers(headers: Mapping[str, str]) -> bytes:
    parts: list[bytes] = []
    for key, value in headers.items():
        k = key.encode()
        v = value.encode()
        parts += (_KEY.pack(len(k)), k, _VALUE.pack(len(v)), v)
    return b"".join(parts)


def encode(message: Outgoing) -> tuple[dict[str, Any], int]:
    """The SendMessage(Batch) entry for ``message`` (without ``Id``), and its SQS size."""
    flags = 0
    body = message.body
    text: str | None = None
    if body:
        try:
            text = body.decode()
        except UnicodeDecodeError:
            text = None
        if text is not None and _NOT_TEXT.search(text) is not None:
            text = None
    attrs: dict[str, Any] = {}
    if not body:
        flags |= _EMPTY_BODY
        sent = _EMPTY_NOTE
        size = len(sent)
    elif text is None:
        flags |= _BINARY_BODY
        sent = _BINARY_NOTE
        attrs[BODY] = {"DataType": "Binary", "BinaryValue": body}
        size = len(sent) + _ATTR_COST_BODY + len(body)
    else:
        sent = text
        size = len(body)
    group = message.fifo_group
    if group is None:
        group = "bk-" + _ids.new()
    else:
        flags |= _USER_GROUP
    dedup = message.dedup_id
    if dedup is None:
        dedup = _ids.new()
    else:
        flags |= _USER_DEDUP
    entry: dict[str, Any] = {
        "MessageBody": sent,
        "MessageGroupId": group,
        "MessageDeduplicationId": dedup,
    }
    if flags or message.headers:
        meta = bytes((_VERSION, flags))
        if message.headers:
            meta += _pack_headers(message.headers)
        attrs[META] = {"DataType": "Binary", "BinaryValue": meta}
        size += _ATTR_COST_META + len(meta)
    # else: a plain text message without group, dedup id or headers carries no attribute
    # at all (the cheapest SQS message); its made-up group id says it is ours
    if attrs:
        entry["MessageAttributes"] = attrs
    return entry, size


def encode_copy(
    body: bytes,
    headers: Mapping[str, str],
    dedup_id: str | None,
    original_id: str,
    prior: int,
) -> dict[str, Any]:
    """The SendMessageBatch entry (without ``Id``) that copies a message without a
    fifo_group: a fresh group id and dedup id, ``prior`` attempts counted so far."""
    entry, _ = encode(Outgoing(body, None, None, headers))
    attrs = entry.setdefault("MessageAttributes", {})
    value = f"{prior}:{original_id}:{dedup_id or ''}"
    attrs[COPY] = {"DataType": "String", "StringValue": value}
    return entry


class Decoded:
    """The brokerkit view of one received SQS message."""

    __slots__ = ("body", "copy_of", "dedup_id", "fifo_group", "group_key", "headers", "prior")

    def __init__(
        self,
        body: bytes,
        headers: Mapping[str, str],
        fifo_group: str | None,
        dedup_id: str | None,
        group_key: str,
        copy_of: str | None = None,
        prior: int = 0,
    ) -> None:
        self.body = body
        self.headers = headers
        self.fifo_group = fifo_group
        self.dedup_id = dedup_id
        self.group_key = group_key
        """The SQS MessageGroupId (ours or the user's): the unit SQS orders and blocks."""
        self.copy_of = copy_of
        """A copy's original MessageId (the id its publisher was given), else None."""
        self.prior = prior
        """Attempts counted before this copy was made (0 for an original)."""


def _unpack_headers(data: bytes, start: int) -> Mapping[str, str]:
    if start >= len(data):
        return NO_HEADERS
    out: dict[str, str] = {}
    pos, end = start, len(data)
    while pos < end:
        (klen,) = _KEY.unpack_from(data, pos)
        pos += 2
        key = data[pos : pos + klen].decode()
        pos += klen
        (vlen,) = _VALUE.unpack_from(data, pos)
        pos += 4
        out[key] = data[pos : pos + vlen].decode()
        pos += vlen
    return MappingProxyType(out)


def decode(message: Mapping[str, Any]) -> Decoded:
    """Decode a ReceiveMessage entry (asked for with the attributes in ``receive.py``)."""
    system = message.get("Attributes", {})
    group_key = system.get("MessageGroupId", "")
    dedup = system.get("MessageDeduplicationId")
    attrs = message.get("MessageAttributes") or {}
    copy_attr = attrs.get(COPY)
    if copy_attr is not None:
        return _decode_copy(message, attrs, copy_attr["StringValue"], group_key)
    meta_attr = attrs.get(META)
    if meta_attr is None or not meta_attr.get("BinaryValue"):
        body = message.get("Body", "").encode()
        if _MADE_UP_GROUP.match(group_key):  # ours: plain text, no group, dedup, headers
            return Decoded(body, NO_HEADERS, None, None, group_key)
        # a message some other producer sent: its ids are all we know
        return Decoded(body, NO_HEADERS, group_key or None, dedup, group_key)
    meta: bytes = meta_attr["BinaryValue"]
    flags = meta[1]
    return Decoded(
        _body(message, attrs, flags),
        _unpack_headers(meta, 2),
        group_key if flags & _USER_GROUP else None,
        dedup if flags & _USER_DEDUP else None,
        group_key,
    )


def _decode_copy(
    message: Mapping[str, Any], attrs: Mapping[str, Any], value: str, group_key: str
) -> Decoded:
    """A copy made by ``encode_copy``: never a user's fifo_group, maybe a user's dedup id."""
    prior, original_id, dedup = value.split(":", 2)
    meta_attr = attrs.get(META)
    meta: bytes = meta_attr["BinaryValue"] if meta_attr is not None else b"\x01\x00"
    body = _body(message, attrs, meta[1])
    headers = _unpack_headers(meta, 2)
    return Decoded(body, headers, None, dedup or None, group_key, original_id, int(prior))


def _body(message: Mapping[str, Any], attrs: Mapping[str, Any], flags: int) -> bytes:
    """The body, where the flags byte of the ``brokerkit`` attribute says it is."""
    if flags & _EMPTY_BODY:
        return b""
    if flags & _BINARY_BODY:
        body: bytes = attrs[BODY]["BinaryValue"]
        return body
    return str(message.get("Body", "")).encode()
