"""The SQS wire format on receipt: whatever another producer (or an older or broken
brokerkit) sent, ``decode`` never raises; damage is named in ``defect`` (docs/contract.md,
"Broker-side input"), a foreign message's own attributes are its headers."""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest

from brokerkit.backends import Delivery, Outgoing
from brokerkit.backends.sqs._codec import decode, encode
from brokerkit.backends.sqs._copies import copyable
from brokerkit.backends.sqs._receiver import Receipt

OURS = "bk-" + "0" * 40


def _bin(value: bytes) -> dict[str, Any]:
    return {"DataType": "Binary", "BinaryValue": value}


def _str(value: str, kind: str = "String") -> dict[str, Any]:
    return {"DataType": kind, "StringValue": value}


def _received(attrs: dict[str, Any], body: str = "raw", group: str = "foreign-g") -> Any:
    return {
        "Body": body,
        "Attributes": {"MessageGroupId": group, "MessageDeduplicationId": "d-1"},
        "MessageAttributes": attrs,
    }


def _header(key: bytes, value: bytes) -> bytes:
    return struct.pack(">H", len(key)) + key + struct.pack(">I", len(value)) + value


CORRUPT = {
    "headers cut short": (
        _received({"brokerkit": _bin(b"\x01\x00" + struct.pack(">H", 300))}),
        "cut short",
    ),
    "String brokerkit attribute": (_received({"brokerkit": _str("AQA=")}), "is String"),
    "Number brokerkit attribute": (_received({"brokerkit": _str("1", "Number")}), "is Number"),
    "empty brokerkit attribute": (_received({"brokerkit": _bin(b"")}), "0 bytes"),
    "unknown version": (_received({"brokerkit": _bin(b"\x07\x00")}), "version 7"),
    "unknown flags": (_received({"brokerkit": _bin(b"\x01\x80")}), "flags"),
    "header not UTF-8": (
        _received({"brokerkit": _bin(b"\x01\x01" + _header(b"k", b"\xff"))}),
        "UTF-8",
    ),
    "header twice": (
        _received({"brokerkit": _bin(b"\x01\x01" + _header(b"k", b"1") + _header(b"k", b"2"))}),
        "twice",
    ),
    "binary body missing": (_received({"brokerkit": _bin(b"\x01\x05")}), "brokerkit.body"),
    "body attribute unannounced": (
        _received({"brokerkit": _bin(b"\x01\x01"), "brokerkit.body": _bin(b"x")}),
        "does not announce",
    ),
    "body attribute without brokerkit": (
        _received({"brokerkit.body": _bin(b"x")}, group=OURS),
        "does not announce",
    ),
    "empty flag, a body": (_received({"brokerkit": _bin(b"\x01\x09")}), "empty"),
    "no group, a foreign group id": (_received({"brokerkit": _bin(b"\x01\x00")}), "MessageGroupId"),
    "copy record garbled": (_received({"brokerkit.copy": _str("nonsense")}, group=OURS), "PRIOR"),
    "copy prior not a number": (
        _received({"brokerkit.copy": _str("x:id-1:")}, group=OURS),
        "PRIOR",
    ),
    "copy attribute Binary": (
        _received({"brokerkit.copy": _bin(b"1:id-1:")}, group=OURS),
        "is Binary",
    ),
    "copy of a user group": (
        _received({"brokerkit.copy": _str("1:id-1:"), "brokerkit": _bin(b"\x01\x01")}),
        "copy",
    ),
    "copy under a foreign group": (
        _received({"brokerkit.copy": _str("1:id-1:")}),
        "MessageGroupId",
    ),
    "unknown brokerkit attribute": (
        _received({"brokerkit.next": _str("1")}, group=OURS),
        "unknown",
    ),
}


@pytest.mark.parametrize("case", list(CORRUPT), ids=list(CORRUPT))
def test_a_damaged_message_is_decoded_with_its_defect_never_raised(case: str) -> None:
    message, named = CORRUPT[case]
    got = decode(message)
    assert got.defect is not None and named in got.defect, got.defect
    assert got.body in (b"raw", b"x")  # what the broker holds is kept
    assert all(type(k) is str and type(v) is str for k, v in got.headers.items())
    assert (got.copy_of, got.prior) == (None, 0)


def test_a_damaged_message_keeps_the_headers_before_the_damage_and_its_group() -> None:
    meta = b"\x01\x01" + _header(b"ok", b"yes") + struct.pack(">H", 9)
    got = decode(_received({"brokerkit": _bin(meta), "trace": _str("t")}, group="orders"))
    assert got.defect is not None and "cut short" in got.defect
    assert dict(got.headers) == {"ok": "yes", "trace": "t"}
    # SQS keeps its group blocked while it is leased: the receiver must treat it as one
    assert (got.fifo_group, got.group_key) == ("orders", "orders")
    made_up = decode(_received({"brokerkit": _bin(b"\x01\x00\x00")}, group=OURS))
    assert made_up.defect is not None and made_up.fifo_group is None


def test_a_foreign_message_has_its_own_text_attributes_as_headers() -> None:
    attrs = {
        "trace-id": _str("t-1"),
        "retries": _str("3", "Number"),
        "note": _bin("żółw".encode()),
        "blob": _bin(b"\xff\x00"),
    }
    got = decode(_received(attrs))
    assert got.defect is None
    assert dict(got.headers) == {"trace-id": "t-1", "retries": "3", "note": "żółw"}
    assert (got.body, got.fifo_group, got.dedup_id) == (b"raw", "foreign-g", "d-1")


def test_every_message_brokerkit_writes_decodes_without_a_defect() -> None:
    for message in (
        Outgoing(b"plain"),
        Outgoing(b""),
        Outgoing(bytes(range(256)), fifo_group="g", dedup_id="d", headers={"k": "v"}),
    ):
        entry, _ = encode(message)
        got = decode(
            _received(
                entry.get("MessageAttributes", {}), entry["MessageBody"], entry["MessageGroupId"]
            )
        )
        assert got.defect is None and got.body == message.body


def test_a_corrupt_delivery_is_never_copied_back() -> None:
    # a copy would be a well-formed message made of what could be decoded: defect lost
    receipt = Receipt("h", time.monotonic() + 30, None, "m-1", time.monotonic())
    fine = Delivery("m-1", b"x", {}, None, None, 1, receipt)
    assert copyable(fine, time.monotonic())
    corrupt = Delivery("m-1", b"x", {}, None, None, 1, receipt, defect="garbled")
    assert not copyable(corrupt, time.monotonic())
