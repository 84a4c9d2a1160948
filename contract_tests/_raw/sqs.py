"""The SQS raw writer: messages sent into a brokerkit FIFO queue with boto3 itself, as
another producer (or an older or broken brokerkit) would send them.

Kinds (``contract_tests._raw``): ``bare`` has no brokerkit attribute, a group of its
own and two String attributes of its own; ``corrupt`` has a ``brokerkit`` attribute
whose header list is cut short; ``wrong_type`` has a ``brokerkit`` attribute of type
String (brokerkit writes Binary); ``oversize`` has a body of SQS's whole 1 MiB, over
``capabilities.max_message_bytes``. Extra kinds: ``no_group`` carries brokerkit's
attribute saying the message had no fifo_group, under a MessageGroupId brokerkit never
makes up (SQS needs a group id on every FIFO send, so "without the group" is the
disagreement of the two); ``bad_copy`` has a ``brokerkit.copy`` attribute that is not
``PRIOR:ID:DEDUP``; ``no_body_attr`` says its body is in ``brokerkit.body`` and has no
such attribute.
"""

from __future__ import annotations

import asyncio
import os
import struct
import uuid
from typing import Any

from brokerkit import BrokerURL
from brokerkit.backends import QueueRef, parse_options
from brokerkit.backends.sqs._link import sqs_name
from brokerkit.backends.sqs._options import SqsOptions
from brokerkit.backends.sqs._publish import MESSAGE_LIMIT

from . import NotApplicable

__all__ = ["SqsRawWriter", "writer"]

_VERSION, _NO_FLAGS, _BINARY_BODY = 1, 0, 4


def _binary(value: bytes) -> dict[str, Any]:
    return {"DataType": "Binary", "BinaryValue": value}


def _string(value: str) -> dict[str, Any]:
    return {"DataType": "String", "StringValue": value}


class SqsRawWriter:
    extra_kinds: tuple[str, ...] = ("no_group", "bad_copy", "no_body_attr")

    def __init__(self, url: str) -> None:
        import boto3

        options = parse_options(BrokerURL.parse(url), SqsOptions)
        self._prefix = options.prefix
        self._client = boto3.client(
            "sqs",
            region_name=options.region or "us-east-1",
            endpoint_url=options.endpoint,
            aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "brokerkit"),
            aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "brokerkit"),
        )

    def _entry(self, kind: str, body: bytes) -> dict[str, Any]:
        text = body.decode()
        group = "foreign-" + uuid.uuid4().hex[:8]
        attrs: dict[str, Any] = {}
        if kind == "bare":
            attrs = {
                "trace-id": _string("t-1"),
                "retries": {"DataType": "Number", "StringValue": "3"},
            }
        elif kind == "corrupt":
            # version 1, flags 0, then a header whose key is said to be 300 bytes long
            attrs = {
                "brokerkit": _binary(bytes((_VERSION, _NO_FLAGS)) + struct.pack(">H", 300) + b"k")
            }
        elif kind == "wrong_type":
            attrs = {"brokerkit": _string("AQA=")}  # its 2 bytes, base64: as text
        elif kind == "oversize":
            text = text + "x" * (MESSAGE_LIMIT - len(body))  # all SQS takes, over brokerkit's limit
        elif kind == "no_group":
            attrs = {"brokerkit": _binary(bytes((_VERSION, _NO_FLAGS)))}  # "no fifo_group"
        elif kind == "bad_copy":
            attrs = {"brokerkit.copy": _string("not a copy record")}
            group = "bk-" + uuid.uuid4().hex  # brokerkit's own kind of group id
        elif kind == "no_body_attr":
            attrs = {"brokerkit": _binary(bytes((_VERSION, _BINARY_BODY)))}
        else:
            raise NotApplicable(f"SQS has no raw kind {kind!r}")
        entry: dict[str, Any] = {
            "MessageBody": text,
            "MessageGroupId": group,
            "MessageDeduplicationId": uuid.uuid4().hex,
        }
        if attrs:
            entry["MessageAttributes"] = attrs
        return entry

    async def write(self, queue: str, kind: str, body: bytes) -> None:
        entry = self._entry(kind, body)
        name = sqs_name(self._prefix, QueueRef(queue))

        def send() -> None:
            url = self._client.get_queue_url(QueueName=name)["QueueUrl"]
            self._client.send_message(QueueUrl=url, **entry)

        await asyncio.to_thread(send)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._client.close)


def writer(url: str) -> SqsRawWriter:
    return SqsRawWriter(url)
