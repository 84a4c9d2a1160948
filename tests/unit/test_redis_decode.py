"""Decoding a Redis stream entry never raises: foreign fields become headers, damage a
``defect`` (the facade dead-letters it). Pure logic; the contract's
test_broker_side_input proves it end to end on a real Redis."""

from __future__ import annotations

from brokerkit.backends.redis_streams._keys import decode_entry, decode_plain


def _one(fields: list[bytes], *, fifo: bool = False) -> tuple[object, ...]:
    d = decode_entry(b"1-0", fields, 1, fifo=fifo)
    return d.id, d.body, dict(d.headers), d.fifo_group, d.dedup_id, d.defect


def test_a_brokerkit_entry_decodes_as_before() -> None:
    fields = [b"b", b"x", b"g", b"grp", b"d", b"dd", b"h", b'{"k":"v"}']
    assert _one(fields, fifo=True) == ("f:1-0", b"x", {"k": "v"}, "grp", "dd", None)
    (plain,) = decode_plain([(b"2-0", [b"b", b"y"])])
    assert (plain.id, plain.body, plain.defect) == ("2-0", b"y", None)


def test_a_foreign_entry_is_its_fields_as_headers_with_an_empty_body() -> None:
    fields = [b"X-Foreign", b"yes", b"data", b"d1", b"bin", b"\xff"]
    assert _one(fields) == ("1-0", b"", {"X-Foreign": "yes", "data": "d1"}, None, None, None)
    assert _one([b"b", b"x", b"origin", b"o"])[2] == {"origin": "o"}


def test_damage_is_a_defect_never_an_exception() -> None:
    assert _one([b"b", b"x", b"h", b"{nope"])[5] == "headers field is not JSON"
    assert _one([b"b", b"x", b"h", b"\xff\xfe\xfd"])[5] == "headers field is not JSON"
    assert _one([b"b", b"x", b"h", b"[1,2]"])[5] == (
        "headers field is not a JSON object (an array)"
    )
    wrong = _one([b"b", b"x", b"h", b'{"ok":"kept","n":7}'])
    assert wrong[2] == {"ok": "kept"} and wrong[5] == "header 'n' is int, not a string"
    assert _one([b"b", b"x", b"d", b"\xff"])[4:] == (None, "dedup_id field is not UTF-8")
    assert _one([b"h", b'{"a":"1"}'])[5] == "entry has no body field"


def test_a_fifo_group_that_disagrees_with_its_stream_is_a_defect() -> None:
    stray = _one([b"b", b"x", b"g", b"grp"], fifo=False)
    assert stray[0] == "1-0" and stray[3] is None  # settled in the plain stream it is in
    assert stray[5] == "fifo_group field on an entry of the plain stream"
    lone = _one([b"b", b"x"], fifo=True)
    assert lone[0] == "f:1-0" and lone[5] == "entry of the fifo stream has no fifo_group field"
    bad = _one([b"b", b"x", b"g", b"\xff"], fifo=True)
    assert bad[0] == "f:1-0" and bad[3:] == (None, None, "fifo_group field is not UTF-8")
