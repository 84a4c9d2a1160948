"""The receiver's own reading of a JetStream reply subject agrees with nats-py's."""

from __future__ import annotations

import nats.errors
import pytest
from nats.aio.msg import Msg

from brokerkit.backends.nats._ackreply import AckReply, ack_reply


def _msg(reply: str) -> Msg:
    return Msg(_client=None, subject="q.x", reply=reply, data=b"")  # type: ignore[arg-type]


def _from_nats(msg: Msg) -> dict[str, object]:
    md = msg.metadata
    return {
        "stream": md.stream,
        "consumer": md.consumer,
        "num_delivered": md.num_delivered,
        "stream_seq": md.sequence.stream,
        "consumer_seq": md.sequence.consumer,
        "num_pending": md.num_pending,
    }


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.bk-orders.bk-g-1.3.123456.7890.1701234567123456789.42",
        "$JS.ACK.s.c.1.1.1.1701234567123456789.0",
        # the longer form, with a domain and an account hash: left to nats-py
        "$JS.ACK.hub.ACCHASH.bk-orders.bk-g-1.2.99.98.1701234567123456789.7.rand",
        "$JS.ACK._.ACCHASH.s.c.1.5.4.1701234567123456789.0.rand",
    ],
)
def test_agrees_with_nats_py(reply: str) -> None:
    assert ack_reply(_msg(reply))._asdict() == _from_nats(_msg(reply))


def test_fields_by_name() -> None:
    got = ack_reply(_msg("$JS.ACK.st.con.3.123456.7890.1701234567123456789.42"))
    assert got == AckReply(
        stream="st",
        consumer="con",
        num_delivered=3,
        stream_seq=123456,
        consumer_seq=7890,
        num_pending=42,
    )


@pytest.mark.parametrize("reply", ["", "_INBOX.abc.1", "$JS.ACK.too.short"])
def test_not_a_jetstream_delivery_raises_as_nats_py_does(reply: str) -> None:
    with pytest.raises((nats.errors.Error, ValueError, IndexError)):
        ack_reply(_msg(reply))
    with pytest.raises((nats.errors.Error, ValueError, IndexError)):
        _ = _msg(reply).metadata
