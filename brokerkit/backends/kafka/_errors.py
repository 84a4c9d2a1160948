"""The one table where confluent-kafka errors become brokerkit errors (``error_map``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from confluent_kafka import KafkaError, KafkaException

from brokerkit.backends import (
    BrokerRefused,
    BrokerUnavailable,
    ConfigError,
    ErrorMap,
    HostPort,
    MessageTooLarge,
)

__all__ = ["error_map", "is_transient", "kafka_error"]

Mapped = BrokerRefused | BrokerUnavailable | ConfigError | MessageTooLarge
"""What the table makes of a driver error."""

_UNAVAILABLE = {
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._TIMED_OUT,
    KafkaError._MSG_TIMED_OUT,
    KafkaError._RESOLVE,
    KafkaError._WAIT_COORD,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.NOT_COORDINATOR,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.BROKER_NOT_AVAILABLE,
}
_TOO_LARGE = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE,
}
_CONFIG = {
    KafkaError._AUTHENTICATION,
    KafkaError._SSL,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError._INVALID_ARG,
    KafkaError.INVALID_CONFIG,
    KafkaError.UNSUPPORTED_SASL_MECHANISM,
}


def kafka_error(exc: BaseException) -> KafkaError | None:
    """The KafkaError inside a driver exception, if any."""
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying (nobody answered, or not yet)."""
    err = kafka_error(exc)
    return err is not None and (err.code() in _UNAVAILABLE or err.retriable())


def _text(err: KafkaError) -> str:
    return f"kafka: {err.name()}: {err.str()}"


def _coded(
    codes: set[int] | None, make: Callable[[KafkaError], Mapped]
) -> Callable[[BaseException], Mapped | None]:
    """A rule's factory: ``make`` for a KafkaException whose code is in ``codes`` (any: None)."""

    def factory(exc: BaseException) -> Mapped | None:
        err = kafka_error(exc)
        if err is None or (codes is not None and err.code() not in codes):
            return None
        return make(err)

    return factory


def error_map(hosts: Sequence[HostPort]) -> ErrorMap:
    """The table for a connection to ``hosts`` (named in BrokerUnavailable), most specific first.

    An error code the table does not name is the broker refusing the request:
    ``BrokerRefused`` with the code's name (e.g. ``"INVALID_REPLICATION_FACTOR"``).
    """
    first = hosts[0] if hosts else HostPort("localhost", 9092)
    where = ", ".join(str(h) for h in hosts) or str(first)

    def unavailable(err: KafkaError) -> Mapped:
        return BrokerUnavailable(f"{_text(err)} ({where})", host=first.host, port=first.port)

    return ErrorMap(
        (KafkaException, _coded(_TOO_LARGE, lambda err: MessageTooLarge(_text(err)))),
        (KafkaException, _coded(_CONFIG, lambda err: ConfigError(_text(err)))),
        (KafkaException, _coded(_UNAVAILABLE, unavailable)),
        (KafkaException, _coded(None, lambda err: BrokerRefused(_text(err), code=err.name()))),
        (BufferError, lambda exc: BrokerUnavailable("kafka: the producer queue stayed full")),
        (
            (TypeError, ValueError),  # a client setting librdkafka's binding refused
            lambda exc: ConfigError(f"kafka: a client setting was refused ({type(exc).__name__})"),
        ),
    )
