"""The one redaction helper (brokerkit._redact) and BrokerURL's use of it."""

from __future__ import annotations

import io
import logging
import sys

import pytest

import brokerkit
from brokerkit._redact import RedactingFormatter, RedactingStream, describe_error, redact

SECRET = "s3cr3t/pa ss'word"


@pytest.mark.parametrize(
    "text",
    [
        f"raw {SECRET} here",
        "quoted s3cr3t%2Fpa%20ss%27word here",
        "quoted-plus s3cr3t%2Fpa+ss%27word here",
        f"in a repr {SECRET!r} and {[SECRET]!r}",
    ],
)
def test_the_exact_secret_goes_in_every_spelling(text: str) -> None:
    out = redact(text, [SECRET])
    assert "s3cr3t" not in out and "***" in out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("redis://:pw12@h:6379/0", "redis://:***@h:6379/0"),
        ("kafka://alice:pw12@h1:9092,h2:9092", "kafka://alice:***@h1:9092,h2:9092"),
        ("nats://tok3n@h:4222", "nats://***@h:4222"),
        ("see amqp://u:p@h/ and tls://t@h", "see amqp://u:***@h/ and tls://***@h"),
        ("x?sasl_password=abc&partitions=3", "x?sasl_password=***&partitions=3"),
        (
            "{'sasl.password': 'abc', 'sasl.mechanism': 'PLAIN'}",
            "{'sasl.password': '***', 'sasl.mechanism': 'PLAIN'}",
        ),
        ('{"token": "abc"}', '{"token": "***"}'),
        ("aws_secret_access_key=abc region=x", "aws_secret_access_key=*** region=x"),
        ("Authorization: Bearer abcdefgh12", "Authorization: *** ***"),
    ],
)
def test_credential_shaped_text_is_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "redis at 127.0.0.1:6379 did not answer after 5 attempts",
        "kafka:// URL: unknown parameter 'sasl_password' (known: dedup_window, partitions)",
        "WRONGPASS invalid username-password pair or user is disabled.",
        "Error 111 connecting to 127.0.0.1:6399. Connect call failed ('127.0.0.1', 6399).",
        "password=<REDACTED> keys = () author: bob",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text, ["unrelated-secret"]) == text


def test_a_short_secret_is_hidden_where_it_has_a_shape_only() -> None:
    assert redact("redis://:pw@h and pw elsewhere", ["pw"]) == "redis://:***@h and pw elsewhere"


def test_describe_error_renders_the_whole_chain_redacted() -> None:
    try:
        try:
            raise ConnectionError(f"AUTH {SECRET} failed on redis://:{SECRET}@h")
        except ConnectionError as driver:
            raise brokerkit.BrokerUnavailable("redis at h:6379 did not answer") from driver
    except brokerkit.BrokerUnavailable as exc:
        text = describe_error(exc, [SECRET])
    assert text.splitlines()[0] == "BrokerUnavailable: redis at h:6379 did not answer"
    assert text.splitlines()[1].startswith("  caused by ConnectionError: AUTH *** failed")
    assert "s3cr3t" not in text


def test_a_stream_redacts_a_secret_split_across_writes() -> None:
    out = io.StringIO()
    stream = RedactingStream(out, ["hunter22"])
    stream.write("connecting with hun")
    stream.write("ter22 to redis://:hun")
    stream.write("ter22@h\ndone")
    stream.flush()
    assert out.getvalue() == "connecting with *** to redis://:***@h\ndone"


def test_the_formatter_redacts_message_and_exception() -> None:
    formatter = RedactingFormatter("%(message)s", secrets=["hunter22"])
    try:
        raise ValueError("bad hunter22")
    except ValueError:
        record = logging.LogRecord(
            "x", logging.DEBUG, __file__, 1, "url %s", ("redis://:hunter22@h",), None
        )
        record.exc_info = sys.exc_info()
    text = formatter.format(record)
    assert "hunter22" not in text and "url redis://:***@h" in text and "bad ***" in text


def test_broker_url_knows_its_secrets_and_hides_a_lone_user() -> None:
    url = brokerkit.BrokerURL.parse("nats://tok3n@h:4222?tls_key=/k&name=x")
    assert url.redacted() == "nats://***@h:4222?tls_key=***&name=x"
    assert url.secrets() == ("tok3n", "/k")
    assert url.render() == "nats://tok3n@h:4222?tls_key=/k&name=x"
    kafka = brokerkit.BrokerURL.parse("kafka://alice:pw12@h:9092")
    assert kafka.redacted() == "kafka://alice:***@h:9092" and kafka.secrets() == ("pw12",)
    assert (
        kafka.redact("librdkafka: sasl.password pw12 rejected")
        == "librdkafka: sasl.password *** rejected"
    )
