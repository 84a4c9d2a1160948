"""NATS URL options and layout: pure parsing, no server."""

from __future__ import annotations

import pytest

import brokerkit
from brokerkit.backends.nats import NatsBackend
from brokerkit.backends.nats._layout import QueueLayout, decode_headers, encode_headers


def _backend(url: str) -> NatsBackend:
    return NatsBackend.from_url(brokerkit.BrokerURL.parse(url))


def test_defaults() -> None:
    b = _backend("nats://127.0.0.1:4222")
    assert b.options.dedup_window == 300.0
    assert b.options.partitions == 32
    assert b.options.storage == "file"
    assert b.capabilities.dedup_window == 300.0
    assert b.capabilities.dedup_window_configurable
    assert b.capabilities.fan_out


def test_typed_query_options() -> None:
    b = _backend("nats://h1:4222,h2:4223?dedup_window=2&partitions=8&storage=memory&replicas=3")
    assert (b.options.dedup_window, b.options.partitions) == (2.0, 8)
    assert (b.options.storage, b.options.replicas) == ("memory", 3)
    assert b.capabilities.dedup_window == 2.0


@pytest.mark.parametrize(
    "query",
    [
        "bogus=1",
        "partitions=0",
        "storage=disk",
        "dedup_window=-1",
        "dedup_window=600&max_age=60",
        "prefix=a_b",
        "prefix=a.b",
    ],
)
def test_bad_options_are_config_errors(query: str) -> None:
    with pytest.raises(brokerkit.ConfigError):
        _backend(f"nats://127.0.0.1:4222?{query}")


def test_tls_options_need_tls_scheme() -> None:
    with pytest.raises(brokerkit.ConfigError):
        _backend("nats://127.0.0.1:4222?tls_ca=/tmp/ca.pem")
    assert _backend("tls://127.0.0.1:4222?tls_ca=/tmp/ca.pem").options.tls_ca == "/tmp/ca.pem"


def test_password_never_shown() -> None:
    url = "nats://alice:s3cret@127.0.0.1:4222"
    b = _backend(url)
    assert "s3cret" not in repr(b)
    with pytest.raises(brokerkit.ConfigError) as info:
        _backend(url + "?nope=1")
    assert "s3cret" not in str(info.value)


def test_from_client_validates_options() -> None:
    with pytest.raises(brokerkit.ConfigError):
        NatsBackend.from_client(object(), partitions=0)  # type: ignore[arg-type]


def test_layout_names_never_collide_and_groups_are_hashed() -> None:
    q = QueueLayout.of("brokerkit", "orders", dead_letters=False, partitions=16)
    d = QueueLayout.of("brokerkit", "orders", dead_letters=True, partitions=16)
    assert q.stream != d.stream and q.wildcard != d.wildcard
    subject = q.subject("a.b.*>")
    assert subject.startswith("brokerkit.q.orders.p.") and "*" not in subject
    assert q.subject("a.b.*>") == q.subject("a.b.*>")
    assert q.subject(None) == "brokerkit.q.orders.u"
    assert QueueLayout.consumer("g-p1", 0) != QueueLayout.consumer("g", 2)


def test_header_codec_is_byte_exact() -> None:
    user = {"a": "é\r\nx", "Nats-Msg-Id": "user's", "k:y": " lead", "del": "\x7f", "e": ""}
    encoded = encode_headers(user, "grp.*", "d1")
    assert encoded is not None
    assert all(v.isascii() and "\n" not in v and "\x7f" not in v for v in encoded.values())
    assert decode_headers(encoded) == (user, "grp.*", "d1")
    assert encode_headers({}, None, None) is None
