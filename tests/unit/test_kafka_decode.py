"""The Kafka record decoder on broker-side input (``_codec``), and ``Partition.read`` of
corrupt records: each becomes a ``Record`` carrying its defect, beside plain neighbours."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from _kafka_stub import StubMessage

from brokerkit.backends import DEDUP_ID_HEADER, FIFO_GROUP_HEADER, valid_token
from brokerkit.backends.kafka._codec import TOMBSTONE, decode_headers
from brokerkit.backends.kafka._partition import Partition


def _key(value: bytes | None) -> Any:
    return lambda: value


def test_a_foreign_records_utf8_headers_are_kept_and_the_others_left_out() -> None:
    raw = [("X-Foreign", b"yes"), ("bin", b"\xff\x00"), ("e", b"")]
    assert decode_headers(raw, _key(None)) == ({"X-Foreign": "yes", "e": ""}, None, None, None)


@pytest.mark.parametrize(
    ("raw", "key", "defect"),
    [
        ([("x-user", None)], None, "header 'x-user' is null"),
        ([(FIFO_GROUP_HEADER, b"\xff\xfe")], b"g", f"header {FIFO_GROUP_HEADER!r} is not UTF-8"),
        ([(FIFO_GROUP_HEADER, b"a b")], b"a b", "fifo_group header is not a valid fifo_group"),
        ([(DEDUP_ID_HEADER, b"")], b"", "dedup id header is not a valid dedup id"),
        ([(FIFO_GROUP_HEADER, b"g1")], b"g2", "fifo_group header disagrees with the record's key"),
        (
            [(FIFO_GROUP_HEADER, b"g1"), (FIFO_GROUP_HEADER, b"g2")],
            b"g2",
            f"header {FIFO_GROUP_HEADER!r} is given twice",
        ),
        ([("bin", b"\xff"), (DEDUP_ID_HEADER, b"d1")], b"d1", "header 'bin' is not UTF-8"),
    ],
)
def test_a_corrupt_record_names_its_defect(
    raw: list[tuple[str, bytes | None]], key: bytes | None, defect: str
) -> None:
    headers, group, _, found = decode_headers(raw, _key(key))
    assert found is not None and found.startswith(defect), found
    assert all(type(k) is str and type(v) is str for k, v in headers.items())
    assert group is None or group.isprintable()


def test_brokerkits_own_record_has_no_defect() -> None:
    raw = [("k", "é".encode()), (FIFO_GROUP_HEADER, b"g1"), (DEDUP_ID_HEADER, b"d1")]
    assert decode_headers(raw, _key(b"g1")) == ({"k": "é"}, "g1", "d1", None)


class _Tombstone(StubMessage):
    def value(self) -> Any:
        return None


def test_read_makes_corrupt_records_records_with_their_defect() -> None:
    part = Partition("t", 0, 0, 0, None, 2.0)
    bad_header = StubMessage(1)
    bad_header._headers = [("x-user", None)]
    out = part.read([StubMessage(0), bad_header, _Tombstone(2), StubMessage(3)])
    assert [(r.offset, r.defect) for r in out] == [
        (1, "header 'x-user' is null, not a string"),
        (2, TOMBSTONE),
    ]
    assert out[1].body == b""
    assert [seg.first for seg in part.fresh] == [0, 3]  # the plain neighbours stay plain


@pytest.mark.parametrize(
    ("value", "valid"),
    [("g1", True), ("a.b*>", True), ("x" * 128, True), ("", False), ("a b", False),
     ("é", False), ("x" * 129, False), ("a\tb", False)],
)  # fmt: skip
def test_valid_token_is_what_publish_accepts(value: str, valid: bool) -> None:
    assert valid_token(value) is valid
