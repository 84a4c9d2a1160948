"""RabbitMQ URL options, topology names, wire codec: pure logic, no server."""

from __future__ import annotations

import pytest
from pamqp.commands import Basic

import brokerkit
from brokerkit.backends import DEDUP_ID_HEADER, FIFO_GROUP_HEADER, Outgoing
from brokerkit.backends.rabbitmq import RabbitBackend
from brokerkit.backends.rabbitmq._backend import MAX_NACK_DELAY, _is_partition
from brokerkit.backends.rabbitmq._codec import DEDUP_STAMP_HEADER, parse, properties
from brokerkit.backends.rabbitmq._errors import stored_value
from brokerkit.backends.rabbitmq._topology import (
    DELIVERY_LIMIT,
    Topology,
    partition_of,
    quorum_arguments,
)

URL = "amqp://guest:guest@127.0.0.1:5672/"


def _backend(url: str) -> RabbitBackend:
    return RabbitBackend.from_url(brokerkit.BrokerURL.parse(url))


def test_defaults_and_capabilities() -> None:
    b = _backend(URL)
    assert (b.options.partitions, b.options.prefetch, b.options.heartbeat) == (8, None, 60)
    assert b.options.max_held == 256
    caps = b.capabilities
    assert caps.fan_out is False  # one consumer group per queue, a second one is refused
    assert caps.max_nack_delay == MAX_NACK_DELAY < 30 * 60  # below RabbitMQ's consumer_timeout
    assert caps.dedup_window_configurable and caps.dedup_window == 300.0


def test_typed_query_options() -> None:
    b = _backend(URL + "?partitions=16&prefetch=500&heartbeat=0&dedup_window=2&name=svc")
    opts = b.options
    assert (opts.partitions, opts.prefetch, opts.heartbeat, opts.name) == (16, 500, 0, "svc")
    assert b.capabilities.dedup_window == 2.0


@pytest.mark.parametrize(
    "query",
    [
        "bogus=1",
        "partitions=0",
        "partitions=x",
        "prefetch=0",
        "max_held=0",
        "heartbeat=-1",
        "connect_timeout=0",
        "request_timeout=-2",
        "dedup_window=0",
        "dedup_window=999999",
        "max_message_bytes=1024",
        "prefix=a.b",
        "tls_cert=/c.pem",
    ],
)
def test_bad_options_are_config_errors(query: str) -> None:
    with pytest.raises(brokerkit.ConfigError):
        _backend(f"amqps://guest:guest@127.0.0.1:5671/?{query}")


def test_tls_options_need_amqps() -> None:
    with pytest.raises(brokerkit.ConfigError, match="amqps"):
        _backend(URL + "?tls_ca=/tmp/ca.pem")
    b = _backend("amqps://u:p@h/?tls_ca=/tmp/ca.pem&tls_cert=/c.pem&tls_key=/k.pem&tls_verify=0")
    assert (b.options.tls_ca, b.options.tls_verify) == ("/tmp/ca.pem", False)


def test_one_host_only() -> None:
    with pytest.raises(brokerkit.ConfigError, match="one host"):
        _backend("amqp://u:p@h1,h2/")


def test_password_never_shown() -> None:
    b = _backend("amqp://alice:s3cret@127.0.0.1:5672/vh")
    assert "s3cret" not in repr(b)
    with pytest.raises(brokerkit.ConfigError) as info:
        brokerkit.connect("amqp://alice:s3cret@127.0.0.1:5672/?partitions=nope")
    assert "s3cret" not in str(info.value) and "nope" not in str(info.value)


def test_from_client_validates_options() -> None:
    with pytest.raises(brokerkit.ConfigError, match="partitions"):
        RabbitBackend.from_client(object(), partitions=0)  # type: ignore[arg-type]
    b = RabbitBackend.from_client(object(), partitions=4)  # type: ignore[arg-type]
    assert b.options.partitions == 4 and "user connection" in repr(b)


def test_topology_names_and_arguments() -> None:
    t = Topology("brokerkit", "orders")
    assert t.free == "brokerkit.orders"
    assert t.partition(3) == "brokerkit.orders.p.3"
    assert (t.dlq, t.ledger, t.attempts, t.meta) == (
        "brokerkit.orders.dlq",
        "brokerkit.orders.ledger",
        "brokerkit.orders.attempts",
        "brokerkit.orders.meta",
    )
    assert len(set(t.everything(4))) == 4 + 7
    args = quorum_arguments(single_active=True)
    assert args["x-queue-type"] == "quorum" and args["x-single-active-consumer"] is True
    assert args["x-delivery-limit"] == DELIVERY_LIMIT == 2**31 - 1
    assert _is_partition(t.partition(0)) and not _is_partition(t.dlq)
    assert not _is_partition(Topology("brokerkit", "p").free)


def test_partition_of_is_crc32_mod_n() -> None:
    assert partition_of("cust.1", 8) == 2117825792 % 8  # zlib.crc32(b"cust.1")
    assert {partition_of(f"g{i}", 8) for i in range(200)} == set(range(8))


def test_codec_round_trip() -> None:
    msg = Outgoing(b"x", "grp", "ev-1", {"k": "żółw ✓"})
    props = properties(msg, "id-1", 2000)
    assert props.delivery_mode == 2 and props.message_id == "id-1"
    headers = dict(props.headers or {})
    assert headers[FIFO_GROUP_HEADER] == "grp" and headers[DEDUP_ID_HEADER] == "ev-1"
    published, until = (int(v) for v in headers[DEDUP_STAMP_HEADER].split(":"))
    assert until - published == 2000
    headers["x-delivery-count"] = 2  # what a quorum queue adds on a redelivery
    got = parse(Basic.Properties(message_id="id-1", headers=headers), "fallback")
    assert (got.id, got.fifo_group, got.dedup_id, got.attempt) == ("id-1", "grp", "ev-1", 3)
    assert dict(got.headers) == {"k": "żółw ✓"}
    assert got.stamp == (published, until)


def test_attempt_is_one_plus_delivery_count() -> None:
    props = Basic.Properties(headers={"x-delivery-count": 1, "x-acquired-count": 4})
    assert parse(props, "f").attempt == 2  # 4.3+: failures only; releases are not counted
    assert parse(Basic.Properties(), "f").attempt == 1
    assert parse(Basic.Properties(), "f").id == "f"


def test_stored_value_from_precondition_failed() -> None:
    exc = Exception(
        "PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-routing-key' for queue "
        "'brokerkit.q.meta' in vhost '/': received 'partitions=4' but current is 'partitions=8'"
    )
    assert stored_value(exc) == "partitions=8"
    assert stored_value(Exception("other")) is None


def test_failed_tls_handshake_is_a_config_error_not_retried() -> None:
    from aiormq.exceptions import AMQPConnectionError

    from brokerkit.backends import HostPort
    from brokerkit.backends.rabbitmq._errors import error_map, is_transient

    exc = AMQPConnectionError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    assert not is_transient(exc)
    mapped = error_map([HostPort("h", 5671)]).translate(exc)
    assert isinstance(mapped, brokerkit.ConfigError) and "CERTIFICATE_VERIFY_FAILED" in str(mapped)
    refused = AMQPConnectionError(111, "Connect call failed ('127.0.0.1', 1)")
    assert is_transient(refused)
    assert isinstance(error_map([HostPort("h", 1)]).translate(refused), brokerkit.BrokerUnavailable)


def test_qos_is_fetch_ahead_plus_held_shared_by_partitions() -> None:
    from brokerkit.backends.rabbitmq._held import Source, size

    sources = [Source("free", ordered=False), *(Source(f"p{i}", ordered=True) for i in range(8))]
    size(sources, 32, 256)
    assert [s.prefetch for s in sources] == [288] + [4 + 32] * 8
    size(sources, 1, 1)
    assert [s.prefetch for s in sources] == [2] + [2] * 8  # never below one of each


def test_qos_unset_max_held_is_the_consumers_whole_bound_per_queue() -> None:
    from brokerkit.backends.rabbitmq._held import QOS_MAX, Source, held_room, size

    sources = [Source("free", ordered=False), *(Source(f"p{i}", ordered=True) for i in range(8))]
    held = held_room(256, False, 32 + 1000, 32)  # prefetch 32, max_in_flight 1000
    assert held == 1000 + 256
    size(sources, 32, held, shared=False)
    assert [s.prefetch for s in sources] == [32 + 1256] * 9
    assert held_room(100, True, 32 + 1000, 32) == 100  # ?max_held= wins
    assert held_room(256, False, None, 32) == 256
    size(sources, 60000, 60000, shared=False)
    assert {s.prefetch for s in sources} == {QOS_MAX}
