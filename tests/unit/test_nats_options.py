"""NATS URL options and layout: pure parsing, no server."""

from __future__ import annotations

import nats.errors
import nats.js.errors
import pytest

import brokerkit
from brokerkit.backends import FIFO_GROUP_HEADER, HEADER_PREFIX, BrokerRefused, HostPort
from brokerkit.backends.nats import NatsBackend
from brokerkit.backends.nats._errors import error_map
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


def test_capabilities_are_what_holds_before_connecting() -> None:
    # fixed at construction: the option's body size (a smaller server is refused by
    # publish, not by changing capabilities) and the redelivery bound of every server
    caps = _backend("nats://127.0.0.1:4222?max_message_bytes=500000").capabilities
    assert caps.max_message_bytes == 500_000
    assert caps.redelivery_slack == 2.0
    assert caps.extras == {"partitions": 32, "storage": "file"}


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
    with pytest.raises(brokerkit.ConfigError, match="partitions"):
        NatsBackend.from_client(object(), partitions=0)  # type: ignore[arg-type]
    with pytest.raises(brokerkit.ConfigError, match="nope"):
        NatsBackend.from_client(object(), nope=1)  # type: ignore[arg-type]


def test_a_backend_that_is_not_open_raises_resource_closed() -> None:
    b = _backend("nats://127.0.0.1:4222")
    with pytest.raises(brokerkit.ResourceClosed):
        b.link.client  # noqa: B018 - the property raises
    with pytest.raises(brokerkit.ResourceClosed):
        b.link.js  # noqa: B018


def _mapped(exc: BaseException) -> BaseException | None:
    return error_map("publish to 'q'", (HostPort("h1", 4222),)).translate(exc)


def test_error_table_most_specific_first() -> None:
    refused = _mapped(nats.js.errors.BadRequestError(code=400, err_code=10058, description="x"))
    assert isinstance(refused, BrokerRefused) and refused.code == 10058
    assert "publish to 'q'" in str(refused) and "h1:4222" in str(refused)
    gone = _mapped(nats.js.errors.ServiceUnavailableError())
    assert isinstance(gone, brokerkit.BrokerUnavailable) and gone.port == 4222
    assert isinstance(_mapped(nats.errors.TimeoutError()), brokerkit.BrokerUnavailable)
    assert isinstance(_mapped(OSError("reset")), brokerkit.BrokerUnavailable)
    assert isinstance(_mapped(nats.errors.AuthorizationError()), brokerkit.ConfigError)
    assert isinstance(_mapped(nats.errors.MaxPayloadError()), brokerkit.MessageTooLarge)
    odd = _mapped(nats.errors.BadSubjectError())  # a client error no rule names: the last one
    assert isinstance(odd, brokerkit.BrokerUnavailable) and "BadSubjectError" in str(odd)
    assert _mapped(ValueError("a bug")) is None  # not a broker condition: propagates as is


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
    assert decode_headers(encoded) == (user, "grp.*", "d1", None)
    assert encode_headers({}, None, None) is None


def test_wire_names_are_the_toolkits() -> None:
    encoded = encode_headers({"k": "v"}, "grp", "d1")
    assert encoded == {
        HEADER_PREFIX + "headers": '{"k":"v"}',
        FIFO_GROUP_HEADER: "grp",
        "Nats-Msg-Id": "d1",  # NATS's own dedup field
    }
    # messages stored under the names brokerkit used before still decode
    legacy = {"x-brokerkit-h": '{"k":"v"}', "x-brokerkit-g": "grp", "Nats-Msg-Id": "d1"}
    assert decode_headers(legacy) == ({"k": "v"}, "grp", "d1", None)
