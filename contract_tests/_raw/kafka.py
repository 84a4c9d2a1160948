"""Raw writer for Kafka: records a foreign producer puts into a brokerkit queue's topic.

It produces with confluent-kafka's own ``Producer`` (its delivery report awaited) onto
the queue's topic (``<topic_prefix>.<queue>``), with the URL's connection settings.

Kinds: ``bare`` (no brokerkit header; a foreign header ``X-Foreign``), ``corrupt``
(``x-brokerkit-fifo-group`` is not UTF-8), ``wrong_type`` (a header with a null value,
which brokerkit never writes), ``oversize`` (a value over ``max_message_bytes`` that the
broker's ``message.max.bytes`` still takes), ``tombstone`` (a record without a value:
the body is its key and its ``X-Marker`` header) and ``group_key`` (a fifo_group header
that is not the record's key).
"""

from __future__ import annotations

import asyncio
from typing import Any

from confluent_kafka import KafkaError, Producer

from brokerkit import BrokerURL
from brokerkit.backends import FIFO_GROUP_HEADER, parse_options
from brokerkit.backends.kafka import KafkaBackend, KafkaOptions
from brokerkit.backends.kafka._options import client_config

from . import NotApplicable

__all__ = ["KafkaRawWriter", "writer"]

FOREIGN_HEADER = "X-Foreign"
"""The header every ``bare`` record carries (kept as ``msg.headers`` on delivery)."""
MARKER_HEADER = "X-Marker"
"""A tombstone's body (it has no value to carry it)."""


class KafkaRawWriter:
    """Writes raw records with a confluent-kafka ``Producer`` of its own."""

    extra_kinds: tuple[str, ...] = ("tombstone", "group_key")

    def __init__(self, url: str) -> None:
        parsed = BrokerURL.parse(url)
        self._options = parse_options(parsed, KafkaOptions)
        self._max_body = KafkaBackend.from_url(parsed).capabilities.max_message_bytes
        conf = client_config(parsed, self._options)
        conf["client.id"] = "brokerkit-raw-writer"
        conf["message.max.bytes"] = 1_000_000
        self._producer = Producer(conf)

    async def write(self, queue: str, kind: str, body: bytes | None) -> None:
        topic = f"{self._options.topic_prefix}.{queue}"
        headers: list[tuple[str, bytes | None]] = []
        key: bytes | None = None
        value = body
        if kind == "bare":
            headers = [(FOREIGN_HEADER, b"yes")]
        elif kind == "corrupt":
            headers = [(FIFO_GROUP_HEADER, b"\xff\xfe")]
        elif kind == "wrong_type":
            headers = [("x-user", None)]
        elif kind == "oversize":
            size = self._max_body + 1024
            value = (body or b"") + b"x" * (size - len(body or b""))
        elif kind == "tombstone":
            key, value, headers = body, None, [(MARKER_HEADER, body)]
        elif kind == "group_key":  # a fifo_group that is not the record's key
            key, headers = b"another-key", [(FIFO_GROUP_HEADER, b"raw-group")]
        else:
            raise ValueError(f"unknown kind {kind!r}")
        await self._produce(topic, value, key, headers)

    async def _produce(
        self, topic: str, value: bytes | None, key: bytes | None, headers: list[Any]
    ) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def report(err: KafkaError | None, _msg: Any) -> None:
            def settle() -> None:
                if done.done():
                    return
                if err is None:
                    done.set_result(None)
                elif err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    done.set_exception(NotApplicable(f"the broker refuses it: {err}"))
                else:
                    done.set_exception(RuntimeError(f"raw produce failed: {err}"))

            loop.call_soon_threadsafe(settle)

        self._producer.produce(topic, value=value, key=key, headers=headers, on_delivery=report)
        deadline = loop.time() + 30.0
        while not done.done():
            await asyncio.to_thread(self._producer.poll, 0.1)
            if loop.time() > deadline:
                raise TimeoutError(f"no delivery report for the raw record on {topic!r}")
        await done

    async def aclose(self) -> None:
        await asyncio.to_thread(self._producer.flush, 5.0)


def writer(url: str) -> KafkaRawWriter:
    """The raw writer for a ``kafka://`` URL."""
    return KafkaRawWriter(url)
