"""BrokerURL: parsed once, immutable, never shows a password."""

from __future__ import annotations

import dataclasses

import pytest

from brokerkit import BrokerURL, ConfigError
from brokerkit._url import HostPort


def test_parses_hosts_credentials_path_and_query() -> None:
    url = BrokerURL.parse("kafka://user:p%40ss@h1:9092,h2:9093/x?partitions=12&b=2")
    assert url.scheme == "kafka"
    assert url.hosts == (HostPort("h1", 9092), HostPort("h2", 9093))
    assert (url.username, url.password, url.path) == ("user", "p@ss", "/x")
    assert dict(url.params) == {"partitions": "12", "b": "2"}


def test_no_host_and_ipv6() -> None:
    assert BrokerURL.parse("memory://").hosts == ()
    assert BrokerURL.parse("redis://[::1]:6379/0").hosts == (HostPort("::1", 6379),)
    sqs = BrokerURL.parse("sqs://?endpoint=http://127.0.0.1:4566&region=us-east-1")
    assert sqs.params["endpoint"] == "http://127.0.0.1:4566"


def test_is_immutable() -> None:
    url = BrokerURL.parse("redis://h:1/0")
    with pytest.raises(dataclasses.FrozenInstanceError):
        url.scheme = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    "text",
    ["redis://u:hunter2@h:1/0", "amqp://guest:hunter2@h/", "kafka://h:1?sasl_password=hunter2"],
)
def test_password_never_in_str_repr_or_redacted(text: str) -> None:
    url = BrokerURL.parse(text)
    for shown in (str(url), repr(url), url.redacted()):
        assert "hunter2" not in shown
    assert "hunter2" in url.render()


@pytest.mark.parametrize(
    ("text", "culprit"),
    [
        ("no-scheme", "scheme"),
        ("redis://h:99999/0", "port"),
        ("redis://h:abc/0", "port"),
        ("redis://h:1/0?a=1&a=2", "'a'"),
        ("redis://h:1/0#frag", "fragment"),
        ("redis://u:hunter2@[::1/0", "IPv6"),
    ],
)
def test_malformed_urls_name_the_culprit_without_the_password(text: str, culprit: str) -> None:
    with pytest.raises(ConfigError) as info:
        BrokerURL.parse(text)
    assert culprit in str(info.value)
    assert "hunter2" not in str(info.value)


def test_non_string_url() -> None:
    with pytest.raises(ConfigError):
        BrokerURL.parse(42)  # type: ignore[arg-type]
