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

``decode`` never raises (docs/contract.md, "Broker-side input"): a message without any
``brokerkit*`` attribute is another producer's, its String and Number attributes (and
UTF-8 Binary ones) its headers; one whose brokerkit attributes cannot be decoded or
disagree (with each other, or with its MessageGroupId) comes back with ``defect`` set.
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

    __slots__ = (
        "body",
        "copy_of",
        "dedup_id",
        "defect",
        "fifo_group",
        "group_key",
        "headers",
        "prior",
    )

    def __init__(
        self,
        body: bytes,
        headers: Mapping[str, str],
        fifo_group: str | None,
        dedup_id: str | None,
        group_key: str,
        copy_of: str | None = None,
        prior: int = 0,
        defect: str | None = None,
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
        self.defect = defect
        """What makes the message corrupt (``Delivery.defect``), else None."""


class _Defect(Exception):
    """A brokerkit attribute that cannot be decoded, or attributes that disagree."""


_DATA_TYPES = {META: "Binary", BODY: "Binary", COPY: "String"}
_SHOWN = 40
"""Longest foreign value quoted in a defect (a hostile one must not flood the reason)."""


def _split(attrs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(brokerkit's attributes, the others as headers): of the others, String and Number
    values are kept, and Binary ones that are UTF-8; other Binary values are dropped."""
    ours: dict[str, Any] = {}
    foreign: dict[str, str] = {}
    for name, attr in attrs.items():
        if name.startswith(META) and (len(name) == len(META) or name[len(META)] == "."):
            ours[name] = attr
            continue
        if not isinstance(attr, Mapping):
            continue
        value = attr.get("StringValue")
        if isinstance(value, str):
            foreign[name] = value
            continue
        data = attr.get("BinaryValue")
        if isinstance(data, bytes):
            try:
                foreign[name] = data.decode()
            except UnicodeDecodeError:
                continue
    return ours, foreign


def _unpack_headers(data: bytes, start: int, into: dict[str, str]) -> None:
    """The ``u16 len, key, u32 len, value`` list from ``start``, added to ``into`` as it
    decodes (what came before a defect is kept)."""
    pos, end = start, len(data)
    while pos < end:
        if pos + _KEY.size > end:
            raise _Defect(f"brokerkit attribute cut short in a header name length (byte {pos})")
        (klen,) = _KEY.unpack_from(data, pos)
        pos += _KEY.size
        if pos + klen + _VALUE.size > end:
            raise _Defect(f"brokerkit attribute cut short in a header name (byte {pos})")
        raw_key = data[pos : pos + klen]
        pos += klen
        (vlen,) = _VALUE.unpack_from(data, pos)
        pos += _VALUE.size
        if pos + vlen > end:
            raise _Defect(f"brokerkit attribute cut short in a header value (byte {pos})")
        raw_value = data[pos : pos + vlen]
        pos += vlen
        try:
            key, value = raw_key.decode(), raw_value.decode()
        except UnicodeDecodeError:
            raise _Defect("a header in the brokerkit attribute is not UTF-8") from None
        if key in into:
            raise _Defect(f"header {key[:_SHOWN]!r} twice in the brokerkit attribute")
        into[key] = value


def decode(message: Mapping[str, Any]) -> Decoded:
    """Decode a ReceiveMessage entry (asked for with the attributes in ``receive.py``).

    Never raises: a message with a brokerkit attribute that cannot be decoded, or with
    attributes that disagree, comes back with ``defect`` set, the body and the headers
    that could be decoded. One without any brokerkit attribute is another producer's
    (or a plain text one of ours, known by its made-up group id): its own String and
    Number attributes are its headers."""
    system = message.get("Attributes") or {}
    group_key = str(system.get("MessageGroupId", ""))
    dedup = system.get("MessageDeduplicationId")
    attrs = message.get("MessageAttributes")
    text = str(message.get("Body", ""))
    ours, foreign = _split(attrs) if attrs else ({}, {})
    if not ours:
        headers = MappingProxyType(foreign) if foreign else NO_HEADERS
        if _MADE_UP_GROUP.match(group_key):  # ours: plain text, no group, dedup id, headers
            return Decoded(text.encode(), headers, None, None, group_key)
        # a message some other producer sent: its ids are all we know
        return Decoded(text.encode(), headers, group_key or None, dedup, group_key)
    own: dict[str, str] = {}
    try:
        return _decode_ours(text, ours, group_key, dedup, foreign, own)
    except _Defect as exc:
        made_up = _MADE_UP_GROUP.match(group_key) is not None
        body_attr = ours.get(BODY)
        body = body_attr.get("BinaryValue") if isinstance(body_attr, Mapping) else None
        return Decoded(
            body if isinstance(body, bytes) else text.encode(),
            MappingProxyType({**foreign, **own}),
            None if made_up else group_key or None,  # SQS keeps the group blocked meanwhile
            None,
            group_key,
            defect=str(exc),
        )


def _decode_ours(
    text: str,
    ours: Mapping[str, Any],
    group_key: str,
    dedup: str | None,
    foreign: dict[str, str],
    own: dict[str, str],
) -> Decoded:
    """``ours`` are the message's brokerkit attributes (at least one); ``own`` gets the
    brokerkit headers as they decode, ``foreign`` holds the other attributes."""
    for name, attr in ours.items():
        want = _DATA_TYPES.get(name)
        if want is None:
            raise _Defect(f"unknown attribute {name[:_SHOWN]!r}")
        kind = attr.get("DataType") if isinstance(attr, Mapping) else None
        value = attr.get(f"{want}Value") if isinstance(attr, Mapping) else None
        if kind != want or not isinstance(value, bytes if want == "Binary" else str):
            raise _Defect(f"attribute {name} is {str(kind)[:_SHOWN]}, brokerkit writes {want}")
    meta: bytes = ours[META]["BinaryValue"] if META in ours else b"\x01\x00"
    if len(meta) < 2:
        raise _Defect(f"brokerkit attribute of {len(meta)} bytes, shorter than its 2-byte prefix")
    if meta[0] != _VERSION:
        raise _Defect(f"brokerkit attribute of version {meta[0]} (this brokerkit reads 1)")
    flags = meta[1]
    if flags & ~(_USER_GROUP | _USER_DEDUP | _BINARY_BODY | _EMPTY_BODY):
        raise _Defect(f"brokerkit attribute with unknown flags {flags:#04x}")
    _unpack_headers(meta, 2, own)
    body = _body(text, ours, flags)
    copy_of, prior = None, 0
    if COPY in ours:
        copy_of, prior, dedup = _copy_record(ours[COPY]["StringValue"])
        if flags & (_USER_GROUP | _USER_DEDUP):
            raise _Defect("a brokerkit.copy whose brokerkit attribute names a group or dedup id")
    elif not flags & _USER_DEDUP:
        dedup = None
    if flags & _USER_GROUP:
        group: str | None = group_key
    elif _MADE_UP_GROUP.match(group_key):
        group = None
    else:
        raise _Defect(
            f"MessageGroupId {group_key[:_SHOWN]!r} is not one brokerkit makes up, yet the "
            "brokerkit attribute says the message has no fifo_group"
        )
    headers = {**foreign, **own} if foreign else own
    frozen = MappingProxyType(headers) if headers else NO_HEADERS
    return Decoded(body, frozen, group, dedup, group_key, copy_of, prior)


def _copy_record(value: str) -> tuple[str, int, str | None]:
    """``PRIOR:ORIGINAL_ID:USER_DEDUP_ID`` of a copy (``encode_copy``)."""
    parts = value.split(":", 2)
    if len(parts) != 3 or not parts[0].isdigit() or not parts[0].isascii() or not parts[1]:
        raise _Defect("brokerkit.copy is not PRIOR:ORIGINAL_ID:DEDUP_ID")
    prior, original_id, dedup = parts
    return original_id, int(prior), dedup or None


def _body(text: str, ours: Mapping[str, Any], flags: int) -> bytes:
    """The body, where the flags byte of the ``brokerkit`` attribute says it is."""
    if flags & _EMPTY_BODY:
        if flags & _BINARY_BODY or BODY in ours:
            raise _Defect("the brokerkit attribute says the body is empty, yet it has one")
        if text != _EMPTY_NOTE:
            raise _Defect("the brokerkit attribute says the body is empty, MessageBody is not")
        return b""
    if flags & _BINARY_BODY:
        if BODY not in ours:
            raise _Defect("the brokerkit attribute says the body is in brokerkit.body: none")
        body: bytes = ours[BODY]["BinaryValue"]
        return body
    if BODY in ours:
        raise _Defect("a brokerkit.body the brokerkit attribute does not announce")
    return text.encode()
