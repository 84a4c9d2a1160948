"""Reading an AMQP delivery brokerkit did not write never raises: a foreign message keeps
its text headers, a damaged brokerkit one comes with a ``defect`` (the facade
dead-letters it). Pure logic; the contract's test_broker_side_input proves it end to end
on a real RabbitMQ."""

from __future__ import annotations

from typing import Any

from pamqp.commands import Basic

from brokerkit.backends import DEDUP_ID_HEADER, FIFO_GROUP_HEADER
from brokerkit.backends.rabbitmq._codec import DEDUP_STAMP_HEADER, parse


def _parse(headers: dict[str, Any], grouped: bool = True) -> tuple[object, ...]:
    got = parse(Basic.Properties(headers=headers), "fallback", grouped)
    return dict(got.headers), got.fifo_group, got.dedup_id, got.defect


def test_a_foreign_message_keeps_its_text_headers_and_drops_the_rest() -> None:
    headers = {"a": "1", "b": bytearray(b"two"), "n": 7, "blob": b"\xff", "t": {"x": 1}}
    assert _parse(headers) == ({"a": "1", "b": "two"}, None, None, None)


def test_a_brokerkit_header_of_another_type_is_a_defect() -> None:
    assert _parse({DEDUP_ID_HEADER: bytearray(b"\xff\xfe")})[2:] == (
        None,
        "header 'x-brokerkit-dedup-id' is bytearray, not a string",
    )
    wrong = _parse({"ok": "kept", "n": 7, FIFO_GROUP_HEADER: "g"})
    assert wrong == ({"ok": "kept"}, "g", None, "header 'n' is int, not a string")
    assert _parse({DEDUP_STAMP_HEADER: "soon"})[3] == "dedup-stamp header is not <ms>:<ms>"


def test_a_fifo_group_where_none_belongs_is_a_defect() -> None:
    stray = _parse({FIFO_GROUP_HEADER: "g"}, grouped=False)
    assert stray[1:] == (
        None,
        None,
        "fifo_group header on a message of the queue without fifo groups",
    )
    assert _parse({FIFO_GROUP_HEADER: "g"}, grouped=True)[1:] == ("g", None, None)
