"""SqsBackend: the boto3 client and its pool, queue creation, publish, subscribe, delete."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ClassVar
from urllib.parse import urlsplit

from brokerkit.backends import (
    Backend,
    BrokerRefused,
    BrokerURL,
    Capabilities,
    ConfigError,
    HostPort,
    Outgoing,
    PublishResult,
    QueueRef,
    QueueStats,
    ReceiverSettings,
    ResourceClosed,
    parse_options,
    retry_unavailable,
)
from brokerkit.backends.sqs._errors import DENIED, NOT_FOUND, aws_code, error_map, is_transient
from brokerkit.backends.sqs._link import Link, sqs_name
from brokerkit.backends.sqs._options import SqsOptions
from brokerkit.backends.sqs._publish import MESSAGE_LIMIT, publish
from brokerkit.backends.sqs._receiver import LEASE_MARGIN, MAX_VISIBILITY, SqsReceiver
from brokerkit.backends.sqs._stats import queue_stats

__all__ = ["SqsBackend"]

_log = logging.getLogger(__name__)

ATTRIBUTE_ROOM = 16 * 1024
"""Bytes of the 1 MiB kept for headers (8 KiB), the DLQ envelope and brokerkit's packing."""
ACK_FLUSH_INTERVAL = 0.1
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
_DLQ_ID_HEADER = "x-brokerkit-dlq-id"  # the envelope's original message id (brokerkit._dlq)


def _endpoint_of(url: str | None, region: str | None) -> HostPort:
    if url is None:
        return HostPort(f"sqs.{region or '<region>'}.amazonaws.com", 443)
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return HostPort(parts.hostname or "?", port)


class SqsBackend(Backend):
    """``sqs://?region=...&endpoint=...``: SQS FIFO through boto3 (docs/backends/sqs.md)."""

    schemes: ClassVar[tuple[str, ...]] = ("sqs",)

    def __init__(self, options: SqsOptions, *, client: Any = None, session: Any = None) -> None:
        self.options = options
        self.capabilities = Capabilities(
            max_message_bytes=MESSAGE_LIMIT - ATTRIBUTE_ROOM,
            dedup_window=300.0,
            dedup_window_configurable=False,
            fan_out=False,
            max_nack_delay=float(MAX_VISIBILITY - 3600),
            redelivery_slack=2.0 + LEASE_MARGIN,
            ack_flush_interval=ACK_FLUSH_INTERVAL,
            extras={"lease_granularity": 1.0, "max_receive_batch": 10},
        )
        self._client = client
        self._session = session
        self._own_client = client is None
        self._link: Link | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._closed = False
        self.endpoint = _endpoint_of(options.endpoint, options.region)

    def __repr__(self) -> str:
        where = self.options.endpoint or self.options.region or "default region"
        return f"<SqsBackend {where}>"

    @classmethod
    def from_url(cls, url: BrokerURL) -> SqsBackend:
        if url.hosts or url.username or url.password or url.path not in ("", "/"):
            raise ConfigError(
                "sqs:// URL takes only query options (sqs://?region=...&endpoint=...); "
                "credentials come from the AWS chain, never the URL"
            )
        return cls(parse_options(url, SqsOptions))

    @classmethod
    def from_client(cls, client: Any, **options: Any) -> SqsBackend:
        """A backend around the user's own boto3 SQS client (or ``boto3.Session``).

        ``options`` are the URL's (``prefix=``, ``wait=``, ``threads=`` ...); region and
        endpoint are the client's. The client is not closed by ``aclose``.
        """
        parsed = parse_options(options, SqsOptions, scheme="sqs")
        if hasattr(client, "resource") and hasattr(client, "client"):  # a boto3.Session
            return cls(parsed, session=client)
        backend = cls(parsed, client=client)
        backend.endpoint = _endpoint_of(client.meta.endpoint_url, client.meta.region_name)
        return backend

    # ---------------------------------------------------------------- connect
    def _make_client(self) -> tuple[Any, list[str]]:
        import boto3
        from botocore.config import Config

        opts = self.options
        config = Config(
            connect_timeout=opts.connect_timeout,
            read_timeout=opts.read_timeout + opts.wait,
            retries={"mode": "standard", "max_attempts": opts.max_attempts},
            max_pool_connections=opts.threads,
            # brokerkit builds every request itself, from validated input: botocore's
            # per-call walk of the request against the API model is pure overhead here
            parameter_validation=False,
        )
        client = self._client
        if client is None:
            session = self._session or boto3.Session(profile_name=opts.profile)
            if session.get_credentials() is None and self.endpoint.host in _LOOPBACK:
                # an emulator on this machine takes any signature: placeholder credentials
                # (only for a loopback endpoint=, never for AWS itself)
                session = boto3.Session(
                    aws_access_key_id="brokerkit",
                    aws_secret_access_key="brokerkit",
                    region_name=opts.region or session.region_name or "us-east-1",
                )
            client = session.client(
                "sqs", region_name=opts.region, endpoint_url=opts.endpoint, config=config
            )
        credentials = client._request_signer._credentials  # for scrubbing only, never shown
        secrets: list[str] = []
        if credentials is not None:
            frozen = credentials.get_frozen_credentials()
            secrets = [frozen.access_key, frozen.secret_key, frozen.token or ""]
        return client, secrets

    async def open(self) -> None:
        if self._closed:
            raise ResourceClosed("this SQS connection is closed")
        if self._link is not None:
            return
        opts = self.options
        where = opts.endpoint or f"region {opts.region or '(default)'}"
        errors = error_map(self.endpoint, where)
        executor = ThreadPoolExecutor(max_workers=opts.threads, thread_name_prefix="brokerkit-sqs")
        loop = asyncio.get_running_loop()
        try:
            with errors:
                client, secrets = await loop.run_in_executor(executor, self._make_client)
            link = Link(client, executor, errors, prefix=opts.prefix, secrets=secrets, where=where)

            async def ping() -> Any:
                # any answer proves the endpoint is there; AccessDenied is an answer too
                try:
                    return await link.start(
                        "list_queues", QueueNamePrefix="brokerkit", MaxResults=1
                    )
                except Exception as exc:
                    if aws_code(exc) in DENIED:
                        return None
                    if is_transient(exc):
                        raise  # retry_unavailable retries, then BrokerUnavailable
                    with errors:
                        raise

            await retry_unavailable(
                ping, what="SQS", hosts=[self.endpoint], is_transient=is_transient, attempts=2
            )
        except BaseException:
            executor.shutdown(wait=False)
            raise
        self._client, self._executor, self._link = client, executor, link

    def _live(self) -> Link:
        if self._closed:
            raise ResourceClosed("this SQS connection is closed")
        if self._link is None:
            raise ResourceClosed("this SQS connection is not open")
        return self._link

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)
        if self._own_client and self._client is not None:
            self._client.close()  # ours (made from the URL or from the user's Session)

    # ---------------------------------------------------------------- publish
    async def publish(self, queue: QueueRef, messages: Sequence[Outgoing]) -> list[PublishResult]:
        link = self._live()
        url = await link.url(queue)
        dedup: list[str | None] = [None] * len(messages)
        if queue.dead_letters:
            # a DLQ copy's dedup id is the original's message id: a copy sent twice (a crash
            # between copy and delete, then a second death) is suppressed, not doubled
            for i, message in enumerate(messages):
                original = message.headers.get(_DLQ_ID_HEADER)
                if message.dedup_id is None and original:
                    dedup[i] = "dlq-" + original[:120]
        grouped = [m.fifo_group is not None for m in messages]
        try:
            return await publish(link, url, messages, dedup, grouped)
        except BrokerRefused as exc:
            if exc.code not in NOT_FOUND:
                raise
            # deleted since this connection cached its URL (delete_queue elsewhere): make
            # it anew, as first use does; what the old queue took went with it
            link.forget(sqs_name(link.prefix, queue))
            url = await link.url(queue)
            return await publish(link, url, messages, dedup, grouped)

    # -------------------------------------------------------------- subscribe
    async def subscribe(
        self, queue: QueueRef, group: str, settings: ReceiverSettings
    ) -> SqsReceiver:
        link = self._live()
        url = await link.url(queue)
        await link.claim_group(queue, url, group)
        return SqsReceiver(
            link,
            url,
            queue,
            settings,
            max_wait=self.options.wait,
            ack_flush_interval=ACK_FLUSH_INTERVAL,
        )

    async def declare(self, queue: QueueRef, group: str | None = None) -> None:
        link = self._live()
        url, _ = await asyncio.gather(link.url(queue.main), link.url(queue.dlq))
        if group is not None:
            await link.claim_group(queue.main, url, group)

    async def stats(self, queue: QueueRef, group: str | None) -> QueueStats:
        """The queue's (or DLQ's) GetQueueAttributes counts (``_stats``)."""
        return await queue_stats(self._live(), queue)

    async def delete_queue(self, queue: str) -> None:
        """Delete the FIFO queue and its DLQ (AWS: the names are reusable 60 s later)."""
        link = self._live()
        for ref in (QueueRef(queue), QueueRef(queue).dlq):
            name = sqs_name(link.prefix, ref)
            link.forget(name)
            url = await link.existing_url(name)
            if url is not None:
                try:
                    await link.call("delete_queue", QueueUrl=url)
                except BrokerRefused as exc:
                    if exc.code not in NOT_FOUND:  # deleted meanwhile: fine
                        raise
