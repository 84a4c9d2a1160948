"""Pure logic of the Kafka backend: the commit-metadata codec, options, ``from_client``."""

from __future__ import annotations

import pytest

pytest.importorskip("confluent_kafka")

from brokerkit.backends import BrokerURL, ConfigError
from brokerkit.backends.kafka import KafkaBackend
from brokerkit.backends.kafka._link import FETCH_QUEUE_BACKOFF_MS
from brokerkit.backends.kafka._offsets import (
    SETTLED,
    OffsetState,
    decode_metadata,
    encode_metadata,
)


def test_metadata_round_trips_runs_counts_and_due_times() -> None:
    states = {
        100: OffsetState(2),
        101: OffsetState(SETTLED),
        102: OffsetState(SETTLED),
        103: OffsetState(1),
        104: OffsetState(1),
        110: OffsetState(3, due_ms=1_800_000_000_000),
    }
    text = encode_metadata(100, sorted(states.items()))
    assert text.startswith("bk1")
    assert decode_metadata(100, text) == states


def test_metadata_omits_never_delivered_offsets() -> None:
    text = encode_metadata(5, [(5, OffsetState(0)), (6, OffsetState(SETTLED))])
    assert decode_metadata(5, text) == {6: OffsetState(SETTLED)}


def test_metadata_stays_within_budget_by_dropping_the_highest_offsets() -> None:
    states = [(o, OffsetState(SETTLED if o % 2 else 1)) for o in range(10_000)]
    text = encode_metadata(0, states, budget=500)
    assert len(text) <= 500
    decoded = decode_metadata(0, text)
    assert decoded and max(decoded) < 10_000
    assert all(decoded[o] == dict(states)[o] for o in decoded)


@pytest.mark.parametrize("junk", [None, "", "hello", "bk1;zz", "bk1;1.2.!"])
def test_foreign_or_damaged_metadata_reads_as_empty(junk: str | None) -> None:
    assert decode_metadata(0, junk) == {}


def test_options_parse_and_reject_unknown_parameters() -> None:
    backend = KafkaBackend.from_url(
        BrokerURL.parse("kafka://h1:9092,h2?partitions=12&dedup_window=2")
    )
    assert backend.options.partitions == 12
    assert backend.capabilities.dedup_window == 2.0
    assert [str(h) for h in backend.hosts] == ["h1:9092", "h2:9092"]
    with pytest.raises(ConfigError, match="nope"):
        KafkaBackend.from_url(BrokerURL.parse("kafka://h1?nope=1"))
    with pytest.raises(ConfigError, match="partitions"):
        KafkaBackend.from_url(BrokerURL.parse("kafka://h1?partitions=0"))


def test_credentials_need_sasl_and_never_show() -> None:
    with pytest.raises(ConfigError) as info:
        KafkaBackend.from_url(BrokerURL.parse("kafka://u:s3cret@h1"))
    assert "s3cret" not in str(info.value)
    backend = KafkaBackend.from_url(
        BrokerURL.parse(
            "kafka://u:s3cret@h1?security_protocol=sasl_ssl&sasl_mechanism=SCRAM-SHA-512"
        )
    )
    assert "s3cret" not in repr(backend)


def test_from_client_takes_the_users_client_settings() -> None:
    backend = KafkaBackend.from_client({"bootstrap.servers": "k1:9093"}, partitions=3)
    assert backend.options.partitions == 3
    assert str(backend.hosts[0]) == "k1:9093"
    with pytest.raises(ConfigError):
        KafkaBackend.from_client({})


def test_linger_option_sets_the_producers_linger_and_keeps_the_contracts_settings() -> None:
    default = KafkaBackend.from_url(BrokerURL.parse("kafka://h1")).producer_config()
    assert default["linger.ms"] == 2.0
    low = KafkaBackend.from_url(BrokerURL.parse("kafka://h1?linger=0")).producer_config()
    assert low["linger.ms"] == 0.0
    assert (low["acks"], low["enable.idempotence"]) == ("all", True)
    with pytest.raises(ConfigError, match="linger"):
        KafkaBackend.from_url(BrokerURL.parse("kafka://h1?linger=-1"))
    # the user's own client settings: their linger.ms holds, acks=1 does not
    own = KafkaBackend.from_client({"bootstrap.servers": "k1", "linger.ms": 20, "acks": 1})
    assert own.producer_config()["linger.ms"] == 20.0
    assert own.producer_config()["acks"] == "all"
    keyword = KafkaBackend.from_client({"bootstrap.servers": "k1", "linger.ms": 20}, linger=0.005)
    assert keyword.producer_config()["linger.ms"] == 5.0
    with pytest.raises(ConfigError, match=r"linger\.ms"):
        KafkaBackend.from_client({"bootstrap.servers": "k1", "linger.ms": "soon"})


def test_consumers_fetch_again_soon_after_a_full_queue_unless_the_user_says_otherwise() -> None:
    # librdkafka's default (1 s) stalled a busy consumer reading a backlog (docs/backends/kafka.md)
    default = KafkaBackend.from_url(BrokerURL.parse("kafka://h1")).link.consumer_config("g")
    assert default["fetch.queue.backoff.ms"] == FETCH_QUEUE_BACKOFF_MS == 10
    own = KafkaBackend.from_client({"bootstrap.servers": "k1", "fetch.queue.backoff.ms": 500})
    assert own.link.consumer_config("g")["fetch.queue.backoff.ms"] == 500


def test_the_error_table_maps_driver_errors_to_one_hierarchy_and_keeps_the_cause() -> None:
    from confluent_kafka import KafkaError, KafkaException

    from brokerkit.backends import (
        BrokerRefused,
        BrokerUnavailable,
        HostPort,
        MessageTooLarge,
    )
    from brokerkit.backends.kafka._errors import error_map, is_transient

    errors = error_map((HostPort("k1", 9093), HostPort("k2", 9092)))

    def mapped(code: int) -> BaseException:
        with pytest.raises(Exception) as info:
            with errors:
                raise KafkaException(KafkaError(code))
        assert isinstance(info.value.__cause__, KafkaException)
        return info.value

    refused = mapped(KafkaError.INVALID_REPLICATION_FACTOR)
    assert isinstance(refused, BrokerRefused)
    assert refused.code == "INVALID_REPLICATION_FACTOR"
    assert isinstance(mapped(KafkaError.MSG_SIZE_TOO_LARGE), MessageTooLarge)
    assert isinstance(mapped(KafkaError.SASL_AUTHENTICATION_FAILED), ConfigError)
    down = mapped(KafkaError._ALL_BROKERS_DOWN)
    assert isinstance(down, BrokerUnavailable)
    assert (down.host, down.port) == ("k1", 9093) and "k2:9092" in str(down)
    assert is_transient(KafkaException(KafkaError(KafkaError._TRANSPORT)))
    assert not is_transient(KafkaException(KafkaError(KafkaError.INVALID_REPLICATION_FACTOR)))


async def test_a_backend_that_is_not_open_raises_resource_closed() -> None:
    from brokerkit.backends import Outgoing, QueueRef, ResourceClosed

    backend = KafkaBackend.from_url(BrokerURL.parse("kafka://127.0.0.1:1"))
    with pytest.raises(ResourceClosed):
        await backend.publish(QueueRef("q"), [Outgoing(b"x")])
    with pytest.raises(ResourceClosed):
        await backend.delete_queue("q")
