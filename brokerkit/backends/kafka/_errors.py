"""The one place where confluent-kafka errors become brokerkit errors."""

from __future__ import annotations

from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException

from brokerkit._errors import BrokerkitError, BrokerUnavailable, ConfigError, MessageTooLarge
from brokerkit._url import HostPort

__all__ = ["is_transient", "kafka_error", "map_error"]

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
    if isinstance(exc, KafkaError):
        return exc
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def is_transient(exc: BaseException) -> bool:
    """True for errors worth retrying (nobody answered, or not yet)."""
    err = kafka_error(exc)
    return err is not None and (err.code() in _UNAVAILABLE or err.retriable())


def map_error(exc: BaseException, hosts: Sequence[HostPort]) -> BrokerkitError:
    """Translate a driver error, most specific first; the caller raises it ``from exc``."""
    if isinstance(exc, BrokerkitError):
        return exc
    err = kafka_error(exc)
    if err is None:
        if isinstance(exc, BufferError):
            return BrokerUnavailable("kafka: the producer queue stayed full")
        return BrokerkitError(f"kafka: {type(exc).__name__}: {exc}")
    code = err.code()
    text = f"kafka: {err.name()}: {err.str()}"
    if code in _TOO_LARGE:
        return MessageTooLarge(text)
    if code in _CONFIG:
        return ConfigError(text)
    if code in _UNAVAILABLE:
        first = hosts[0] if hosts else HostPort("localhost", 9092)
        where = ", ".join(str(h) for h in hosts) or str(first)
        return BrokerUnavailable(f"{text} ({where})", host=first.host, port=first.port)
    return BrokerkitError(text)
