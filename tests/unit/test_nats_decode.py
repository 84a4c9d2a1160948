"""The NATS header decoder on broker-side input: foreign headers kept, corrupt ones named."""

from __future__ import annotations

import pytest

from brokerkit.backends import FIFO_GROUP_HEADER
from brokerkit.backends.nats._layout import USER_HEADERS, QueueLayout, decode_headers

LAYOUT = QueueLayout.of("brokerkit", "orders", dead_letters=False, partitions=8)


def test_a_foreign_messages_own_headers_are_its_headers() -> None:
    raw = {"X-Foreign": "yes", "trace": "a b"}
    assert decode_headers(raw) == (raw, None, None, None)
    # Nats-Msg-Id is the dedup id, as on brokerkit's own messages; an invalid one stays
    assert decode_headers({"X-Foreign": "yes", "Nats-Msg-Id": "m1"}) == (
        {"X-Foreign": "yes"}, None, "m1", None,
    )  # fmt: skip
    assert decode_headers({"Nats-Msg-Id": "has space"}) == (
        {"Nats-Msg-Id": "has space"}, None, None, None,
    )  # fmt: skip
    # brokerkit's own message with only a dedup id has no headers
    assert decode_headers({"Nats-Msg-Id": "d1"}) == ({}, None, "d1", None)


@pytest.mark.parametrize(
    ("blob", "defect"),
    [
        ('{"a": ', "headers field is not JSON"),
        ("[1,2]", "headers field is not a JSON object"),
        ("null", "headers field is not a JSON object"),
        ('{"a": 1}', "header 'a' is int"),
        ("", "headers field is not JSON"),
    ],
)
def test_a_headers_field_that_is_not_a_json_object_of_strings_is_a_defect(
    blob: str, defect: str
) -> None:
    user, group, dedup, found = decode_headers({USER_HEADERS: blob, "Nats-Msg-Id": "d1"})
    assert found is not None and found.startswith(defect), found
    assert all(type(v) is str for v in user.values())
    assert (group, dedup) == (None, "d1")


def test_a_fifo_group_that_is_invalid_or_on_another_subject_is_a_defect() -> None:
    good = LAYOUT.subject("g1")
    assert decode_headers({FIFO_GROUP_HEADER: "g1"}, good, LAYOUT) == ({}, "g1", None, None)
    _, group, _, defect = decode_headers({FIFO_GROUP_HEADER: "a b"}, good, LAYOUT)
    assert group is None and defect == "fifo_group header is not a valid fifo_group"
    _, group, _, defect = decode_headers({FIFO_GROUP_HEADER: "g1"}, LAYOUT.subject(None), LAYOUT)
    assert group == "g1" and defect is not None and "disagrees with the subject" in defect
