"""Scheme -> backend class: the entry-point group ``brokerkit.backends``, never an if-chain.

Built-in backends register through the same entry points as third-party ones;
the table below is only a fallback for a source tree that was not installed.
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import entry_points

from brokerkit._errors import ConfigError
from brokerkit.backends.base import Backend

GROUP = "brokerkit.backends"

# scheme -> (import path, pip extra that brings its driver)
_BUILTIN: dict[str, tuple[str, str]] = {
    "memory": ("brokerkit.backends.memory:MemoryBackend", ""),
    "redis": ("brokerkit.backends.redis_streams:RedisBackend", "redis"),
    "rediss": ("brokerkit.backends.redis_streams:RedisBackend", "redis"),
    "kafka": ("brokerkit.backends.kafka:KafkaBackend", "kafka"),
    "nats": ("brokerkit.backends.nats:NatsBackend", "nats"),
    "tls": ("brokerkit.backends.nats:NatsBackend", "nats"),
    "sqs": ("brokerkit.backends.sqs:SqsBackend", "sqs"),
    "amqp": ("brokerkit.backends.rabbitmq:RabbitBackend", "rabbitmq"),
    "amqps": ("brokerkit.backends.rabbitmq:RabbitBackend", "rabbitmq"),
}


def known_schemes() -> list[str]:
    return sorted({ep.name for ep in entry_points(group=GROUP)} | set(_BUILTIN))


def backend_class(scheme: str) -> type[Backend]:
    """Resolve a URL scheme; ConfigError for an unknown one or a missing driver."""
    target = next((ep.value for ep in entry_points(group=GROUP, name=scheme)), None)
    if target is None and scheme in _BUILTIN:
        target = _BUILTIN[scheme][0]
    if target is None:
        raise ConfigError(f"unknown broker scheme {scheme!r} (known: {', '.join(known_schemes())})")
    module_name, _, attr = target.partition(":")
    try:
        module = import_module(module_name)
    except ModuleNotFoundError as exc:
        extra = _BUILTIN.get(scheme, ("", scheme))[1] or scheme
        raise ConfigError(
            f"the {scheme}:// backend needs the {exc.name!r} package: "
            f"pip install 'brokerkit-mq[{extra}]'"
        ) from None
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigError(f"entry point {scheme!r} -> {target!r} is not a brokerkit Backend")
    return cls
