"""``kafka://`` URL options and the librdkafka configuration built from them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from brokerkit.backends import BrokerURL, ConfigError, HostPort, Options, parse_options

__all__ = [
    "KafkaOptions",
    "bootstrap_hosts",
    "client_config",
    "hosts_from_servers",
    "options_from_url",
]

DEFAULT_PORT = 9092


class KafkaOptions(Options):
    """Query parameters of ``kafka://host1:9092,host2:9092?...``.

    Credentials come from the URL's userinfo (``kafka://user:pass@host``), never
    from the query, and are only handed to librdkafka.
    """

    partitions: int = Field(6, ge=1, le=10_000)
    """Partitions of a queue's topic when brokerkit creates it (an existing topic keeps its own)."""
    replication_factor: int = Field(-1, ge=-1, le=32)
    """Replicas of created topics; -1 = the broker's ``default.replication.factor``."""
    dedup_window: float = Field(300.0, gt=0, le=7 * 24 * 3600.0)
    """Seconds a dedup id suppresses later publishes of the same id."""
    topic_prefix: str = Field("brokerkit", pattern=r"^[A-Za-z0-9_-]{1,100}$")
    """Topics are ``<prefix>.<queue>`` and ``<prefix>-dlq.<queue>``; groups are named alike."""
    security_protocol: Literal["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"] = "plaintext"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    ssl_ca_location: str | None = None
    """CA bundle file for ``ssl``/``sasl_ssl``."""
    session_timeout: float = Field(6.0, ge=1.0, le=3600.0)
    """Seconds before the group gives a silent consumer's partitions to another one."""
    heartbeat_interval: float = Field(0.5, ge=0.05, le=60.0)
    """Seconds between group heartbeats: how fast a member notices a rebalance."""
    publish_timeout: float = Field(10.0, ge=1.0, le=3600.0)
    """Seconds a publish waits for the broker's delivery report (librdkafka's
    ``message.timeout.ms``, from ``produce`` to the report): a record still unconfirmed
    then is given up and the publish raises BrokerUnavailable. The default is the
    retry budget of the other backends (``retry_unavailable``: 10 s)."""
    client_id: str = Field("brokerkit", pattern=r"^[A-Za-z0-9._-]{1,100}$")
    linger: float = Field(0.002, ge=0.0, le=5.0)
    """Seconds a small publish's records wait for more to share a request (``linger.ms``):
    0 for the lowest latency of one-message publishes; more for throughput when many
    tasks publish small calls at once. Calls of 64+ records are sent at once anyway."""

    @model_validator(mode="after")
    def _consistent(self) -> KafkaOptions:
        if self.publish_timeout <= self.linger:
            raise ValueError("publish_timeout must be longer than linger (librdkafka requires it)")
        return self


def options_from_url(url: BrokerURL) -> KafkaOptions:
    if url.path not in ("", "/"):
        raise ConfigError("kafka:// URL takes no path: kafka://host1:9092,host2:9092?options")
    if not url.hosts:
        raise ConfigError("kafka:// URL needs at least one bootstrap host: kafka://host:9092")
    options = parse_options(url, KafkaOptions)
    if (url.username or url.password) and not options.security_protocol.startswith("sasl"):
        raise ConfigError(
            "kafka:// URL has credentials but parameter 'security_protocol' is not "
            "sasl_plaintext or sasl_ssl"
        )
    return options


def bootstrap_hosts(url: BrokerURL) -> tuple[HostPort, ...]:
    return tuple(HostPort(h.host, h.port or DEFAULT_PORT) for h in url.hosts)


def hosts_from_servers(servers: str) -> tuple[HostPort, ...]:
    """Parse librdkafka's ``bootstrap.servers`` for error messages."""
    out = []
    for item in servers.split(","):
        item = item.strip().rpartition("://")[2]
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if sep and port.isdigit():
            out.append(HostPort(host.strip("[]"), int(port)))
        else:
            out.append(HostPort(item, DEFAULT_PORT))
    return tuple(out)


def client_config(url: BrokerURL, options: KafkaOptions) -> dict[str, Any]:
    """Connection settings shared by the producer, consumers and admin client."""
    conf: dict[str, Any] = {
        "bootstrap.servers": ",".join(str(h) for h in bootstrap_hosts(url)),
        "client.id": options.client_id,
        "security.protocol": options.security_protocol,
    }
    if options.sasl_mechanism is not None:
        conf["sasl.mechanism"] = options.sasl_mechanism
    if url.username is not None:
        conf["sasl.username"] = url.username
        conf["sasl.password"] = url.password or ""
        conf.setdefault("sasl.mechanism", "PLAIN")
    if options.ssl_ca_location is not None:
        conf["ssl.ca.location"] = options.ssl_ca_location
    return conf
