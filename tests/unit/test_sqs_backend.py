"""SQS backend without a server: pinned capabilities, URL options, the wire format, and
credential scrubbing. (Everything that needs SQS itself is proven by the contract suite
against the emulator: ``brokerkit check sqs://...``.)"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

import brokerkit

pytest.importorskip("boto3")

from botocore.exceptions import ClientError

from brokerkit.backends import Outgoing, QueueRef
from brokerkit.backends.sqs import SqsBackend
from brokerkit.backends.sqs._codec import decode, encode, encode_copy
from brokerkit.backends.sqs._errors import error_map, scrub
from brokerkit.backends.sqs._link import sqs_name
from brokerkit.backends.sqs._publish import MESSAGE_LIMIT

URL = "sqs://?endpoint=http://127.0.0.1:4566&region=us-east-1"


def _backend(url: str = URL) -> SqsBackend:
    return SqsBackend.from_url(brokerkit.BrokerURL.parse(url))


def test_capabilities_are_pinned() -> None:
    caps = brokerkit.connect(URL).capabilities
    got = (
        caps.max_message_bytes,
        caps.dedup_window,
        caps.dedup_window_configurable,
        caps.fan_out,
        caps.ack_flush_interval,
        caps.max_nack_delay,
        caps.redelivery_slack,
    )
    assert got == (1024 * 1024 - 16 * 1024, 300.0, False, False, 0.1, 11 * 3600.0, 2.5)
    assert caps.max_headers == 32 and caps.max_header_bytes == 8192
    assert caps.extras["lease_granularity"] == 1.0


def test_dedup_window_is_not_an_option() -> None:
    with pytest.raises(brokerkit.ConfigError, match="dedup_window"):
        brokerkit.connect(URL + "&dedup_window=2")


def test_plain_sqs_url_uses_the_aws_chain() -> None:
    b = _backend("sqs://")
    assert b.options.region is None and b.options.endpoint is None
    assert str(b.endpoint) == "sqs.<region>.amazonaws.com:443"
    assert str(_backend("sqs://?region=eu-west-1").endpoint) == "sqs.eu-west-1.amazonaws.com:443"


@pytest.mark.parametrize(
    "query",
    [
        "bogus=1",
        "wait=21",
        "wait=-1",
        "region=Not_A_Region",
        "endpoint=ftp://x",
        "endpoint=http://key:secret@127.0.0.1:4566",
        "prefix=has.dot",
        "threads=1",
        "connect_timeout=0",
        "profile=bad%20name",
    ],
)
def test_bad_options_are_config_errors_that_echo_no_value(query: str) -> None:
    with pytest.raises(brokerkit.ConfigError) as info:
        _backend("sqs://?" + query)
    assert "secret" not in str(info.value)


def test_credentials_and_hosts_in_the_url_are_refused_without_echo() -> None:
    for url in ("sqs://AKIAEXAMPLE:s3cr3t@?region=us-east-1", "sqs://somehost:4566"):
        with pytest.raises(brokerkit.ConfigError) as info:
            _backend(url)
        assert "s3cr3t" not in str(info.value) and "AKIAEXAMPLE" not in str(info.value)


def test_queue_names_and_their_dlq_never_collide() -> None:
    assert sqs_name("", QueueRef("orders")) == "orders.fifo"
    assert sqs_name("app-", QueueRef("orders").dlq) == "app-_dlq_orders.fifo"
    # a user queue name cannot start with "_", so no queue is named like another's DLQ
    with pytest.raises(brokerkit.ConfigError, match="80"):
        sqs_name("x" * 20, QueueRef("q" * 64))


@pytest.mark.parametrize(
    "message",
    [
        Outgoing(b"plain text \xc5\xbc\xc3\xb3\xc5\x82w"),
        Outgoing(bytes(range(256)), fifo_group="g.1", dedup_id="d-1"),
        Outgoing(b"", headers={"a": ""}),
        Outgoing(b"crlf\r\n", headers={"k\n": "v\r\n\0;,=", "empty": "", "\u017c": "\u2713"}),
    ],
)
def test_wire_format_round_trips_byte_exact(message: Outgoing) -> None:
    entry, size = encode(message)
    received = {
        "Body": entry["MessageBody"],
        "Attributes": {
            "MessageGroupId": entry["MessageGroupId"],
            "MessageDeduplicationId": entry["MessageDeduplicationId"],
        },
        "MessageAttributes": entry.get("MessageAttributes", {}),
    }
    got = decode(received)
    assert got.body == message.body
    assert dict(got.headers) == dict(message.headers)
    assert (got.fifo_group, got.dedup_id) == (message.fifo_group, message.dedup_id)
    assert len(entry.get("MessageAttributes", {})) <= 2  # of SQS's 10
    assert size >= len(message.body)


def _as_received(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "Body": entry["MessageBody"],
        "Attributes": {
            "MessageGroupId": entry["MessageGroupId"],
            "MessageDeduplicationId": entry["MessageDeduplicationId"],
        },
        "MessageAttributes": entry.get("MessageAttributes", {}),
    }


@pytest.mark.parametrize(
    "message",
    [
        Outgoing(b"plain"),
        Outgoing(bytes(range(256)), dedup_id="d:1:x", headers={"k": "v:w"}),
        Outgoing(b""),
    ],
)
def test_a_copy_given_back_is_the_original_message_with_its_earlier_attempts(
    message: Outgoing,
) -> None:
    original = decode(_as_received(encode(message)[0]))
    entry = encode_copy(original.body, original.headers, original.dedup_id, "orig-1", 2)
    got = decode(_as_received(entry))
    assert (got.body, dict(got.headers)) == (message.body, dict(message.headers))
    assert (got.fifo_group, got.dedup_id) == (None, message.dedup_id)
    assert (got.copy_of, got.prior) == ("orig-1", 2)
    assert (original.copy_of, original.prior) == (None, 0)
    # its own group and dedup id are fresh: SQS must not drop it as a duplicate
    assert entry["MessageDeduplicationId"] != message.dedup_id
    assert entry["MessageGroupId"].startswith("bk-")
    assert len(entry["MessageAttributes"]) <= 3  # of SQS's 10


def test_a_plain_text_message_carries_no_attribute_and_a_foreign_one_keeps_its_ids() -> None:
    entry, size = encode(Outgoing(b"plain"))
    assert "MessageAttributes" not in entry and size == 5
    foreign = {
        "Body": "hi",
        "Attributes": {"MessageGroupId": "bk-orders", "MessageDeduplicationId": "d"},
    }
    got = decode(foreign)  # another producer's message: its group is a real group
    assert (got.body, got.fifo_group, got.dedup_id) == (b"hi", "bk-orders", "d")


def test_ungrouped_messages_get_unique_groups_and_dedup_ids() -> None:
    a, _ = encode(Outgoing(b"same"))
    b, _ = encode(Outgoing(b"same"))
    assert a["MessageGroupId"] != b["MessageGroupId"]
    assert a["MessageDeduplicationId"] != b["MessageDeduplicationId"]


def test_the_largest_message_with_full_headers_fits_sqs_limit() -> None:
    caps = brokerkit.connect(URL).capabilities
    headers = {f"h{i:02d}": "v" * (8192 // 32 - 3) for i in range(32)}
    envelope = {f"x-brokerkit-dlq-{k}": "x" * 40 for k in "abcdefg"}  # a DLQ copy's extra
    _, size = encode(Outgoing(os.urandom(caps.max_message_bytes), headers={**headers, **envelope}))
    assert size <= MESSAGE_LIMIT


def test_scrub_removes_credentials_from_botocore_errors() -> None:
    text = (
        "The request signature we calculated does not match. Credential=AKIAABCDEFGHIJKLMNOP"
        "/20261201/us-east-1/sqs/aws4_request, Signature=0123abcd secret=wJalrXUtnFEMI"
    )
    exc = ClientError({"Error": {"Code": "SignatureDoesNotMatch", "Message": text}}, "SendMessage")
    scrub(exc, ["wJalrXUtnFEMI", "AKIAABCDEFGHIJKLMNOP"])
    mapped = error_map(brokerkit.backends.HostPort("127.0.0.1", 4566), "here").translate(exc)
    for shown in (str(exc), repr(exc), str(exc.response), str(mapped)):
        assert "AKIAABCDEFGHIJKLMNOP" not in shown and "wJalrXUtnFEMI" not in shown
        assert "0123abcd" not in shown
    assert isinstance(mapped, brokerkit.ConfigError)


def test_error_codes_map_to_specific_errors() -> None:
    errors = error_map(brokerkit.backends.HostPort("127.0.0.1", 4566), "here")

    def err(code: str) -> BaseException | None:
        return errors.translate(ClientError({"Error": {"Code": code, "Message": "m"}}, "Op"))

    refused = err("AWS.SimpleQueueService.NonExistentQueue")
    assert isinstance(refused, brokerkit.backends.BrokerRefused)
    assert refused.code == "AWS.SimpleQueueService.NonExistentQueue"
    assert isinstance(err("AccessDenied"), brokerkit.backends.BrokerRefused)
    assert isinstance(err("ReceiptHandleIsInvalid"), brokerkit.LeaseExpired)
    assert isinstance(err("MessageTooLong"), brokerkit.MessageTooLarge)
    assert isinstance(err("InvalidClientTokenId"), brokerkit.ConfigError)
    throttled = err("RequestThrottled")
    assert (
        isinstance(throttled, brokerkit.backends.BrokerRefused)
        and throttled.code == "RequestThrottled"
    )


def test_a_server_failure_after_the_retries_is_unavailable_not_a_refusal() -> None:
    """HTTP 5xx (ElasticMQ under load answered a plain-text 503, which botocore reports
    with the status as the code): the broker could not serve, it did not refuse; the
    consumer rides out BrokerUnavailable, a BrokerRefused would end its iteration."""
    endpoint = brokerkit.backends.HostPort("127.0.0.1", 4566)
    errors = error_map(endpoint, "here")
    body = "The server was not able to produce a timely response to your request.\nRetry"
    for code, http in (("503", 503), ("ServiceUnavailable", 503), ("InternalError", 500)):
        exc = ClientError(
            {
                "Error": {"Code": code, "Message": body},
                "ResponseMetadata": {"HTTPStatusCode": http, "HTTPHeaders": {"x": "y"}},
            },
            "GetQueueUrl",
        )
        scrub(exc, ["secret-key"])  # as the link does, before mapping: the status stays
        assert exc.response["ResponseMetadata"] == {"HTTPStatusCode": http}
        mapped = errors.translate(exc)
        assert isinstance(mapped, brokerkit.BrokerUnavailable), (code, mapped)
        assert (mapped.host, mapped.port) == ("127.0.0.1", 4566)
        assert "GetQueueUrl" in str(mapped) and "timely" in str(mapped)
    # a 4xx stays what it was
    exc = ClientError(
        {
            "Error": {"Code": "AccessDenied", "Message": "m"},
            "ResponseMetadata": {"HTTPStatusCode": 403},
        },
        "SendMessageBatch",
    )
    assert isinstance(errors.translate(exc), brokerkit.backends.BrokerRefused)


def test_import_brokerkit_imports_no_driver() -> None:
    code = "import sys, brokerkit; brokerkit.connect('memory://'); print('boto3' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
