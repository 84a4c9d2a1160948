"""redis:// URL and option parsing: pure logic, no broker (building a client does no I/O)."""

from __future__ import annotations

import pytest
from redis import exceptions as rex

import brokerkit
from brokerkit.backends import BrokerRefused, HostPort
from brokerkit.backends.redis_streams import RedisBackend, RedisOptions
from brokerkit.backends.redis_streams._errors import error_map


def backend(url: str) -> RedisBackend:
    b = brokerkit.connect(url).backend
    assert isinstance(b, RedisBackend)
    return b


def test_defaults_and_capabilities() -> None:
    b = backend("redis://127.0.0.1:6379/0")
    assert b.options == RedisOptions()
    caps = b.capabilities
    assert caps.dedup_window == 300.0 and caps.dedup_window_configurable and caps.fan_out
    assert caps.max_message_bytes >= 256 * 1024
    assert 0 < caps.ack_flush_interval <= 0.1
    assert b.hosts[0].port == 6379


def test_query_options_are_typed() -> None:
    b = backend(
        "redis://h:6380/3?dedup_window=2&prefix=app:&ack_flush_interval=0&poll_interval=0.1"
    )
    assert b.options.dedup_window == 2.0 and b.capabilities.dedup_window == 2.0
    assert b.options.prefix == "app:" and b.keys.stream("q") == "app:{q}:s"
    assert b.keys.stream("q", dead_letters=True) == "app:{q}:d"
    assert b.keys.dedup("q", "x") != b.keys.dedup("q", "x", dead_letters=True)
    assert b.capabilities.ack_flush_interval == 0.0
    assert b.client.connection_pool.connection_kwargs["db"] == 3


@pytest.mark.parametrize(
    ("url", "part"),
    [
        ("redis://h/0?nope=1", "nope"),
        ("redis://h/0?dedup_window=-1", "dedup_window"),
        ("redis://h/0?ack_flush_interval=0.5", "ack_flush_interval"),
        ("redis://h/0?max_message_bytes=1000", "max_message_bytes"),
        ("redis://h/0?prefix=a%20b", "prefix"),
        ("redis://h/x", "database"),
        ("redis://h1,h2/0", "one host"),
        ("redis://h/0?ssl_ca_certs=/ca.pem", "rediss://"),
    ],
)
def test_bad_options_raise_config_error_naming_the_part(url: str, part: str) -> None:
    with pytest.raises(brokerkit.ConfigError) as info:
        brokerkit.connect(url)
    assert part in str(info.value)


def test_password_never_shows() -> None:
    broker = brokerkit.connect("redis://:s3cret@h/0")
    assert "s3cret" not in repr(broker) and "s3cret" not in repr(broker.backend)
    with pytest.raises(brokerkit.ConfigError) as info:
        brokerkit.connect("redis://:s3cret@h/0?nope=1")
    assert "s3cret" not in str(info.value)


def test_rediss_enables_tls_and_from_client_validates() -> None:
    b = backend("rediss://h/0?ssl_cert_reqs=none")
    assert b.client.connection_pool.connection_kwargs.get("ssl_cert_reqs") == "none"
    with pytest.raises(brokerkit.ConfigError, match="dedup_window"):
        RedisBackend.from_client(b.client, dedup_window=0)
    with pytest.raises(brokerkit.ConfigError, match="nope"):
        RedisBackend.from_client(b.client, nope=1)
    assert RedisBackend.from_client(b.client, dedup_window=5).capabilities.dedup_window == 5.0


def test_capabilities_are_fixed_before_connecting() -> None:
    caps = backend("redis://127.0.0.1:6379/0?poll_interval=0.5").capabilities
    assert caps.redelivery_slack == 0.75 and caps.max_nack_delay == 30 * 86400.0
    assert caps.extras == {"server": "redis"}  # the version is backend.server_version


def _mapped(exc: BaseException) -> BaseException | None:
    return error_map((HostPort("h1", 6380),)).translate(exc)


def test_error_table_most_specific_first() -> None:
    nogroup = _mapped(rex.ResponseError("NOGROUP No such key 'k' or consumer group 'g'"))
    assert isinstance(nogroup, BrokerRefused) and nogroup.code == "NOGROUP"
    assert "h1:6380" in str(nogroup)
    noperm = _mapped(rex.NoPermissionError("NOPERM this user has no permissions"))
    assert isinstance(noperm, BrokerRefused) and noperm.code == "NOPERM"
    assert isinstance(_mapped(rex.AuthenticationError("invalid password")), brokerkit.ConfigError)
    down = _mapped(rex.ConnectionError("refused"))
    assert isinstance(down, brokerkit.BrokerUnavailable) and down.port == 6380
    assert isinstance(_mapped(rex.BusyLoadingError("LOADING")), brokerkit.BrokerUnavailable)
    assert isinstance(_mapped(OSError("reset")), brokerkit.BrokerUnavailable)
    assert _mapped(ValueError("a bug")) is None  # not a broker condition: propagates as is
