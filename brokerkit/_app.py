"""The application object: typed handlers, typed publishing, start, drain and stop.

::

    app = brokerkit.App("redis://127.0.0.1:6379/0")

    @app.handler("emails", group="mailer", model=SignupEmail, concurrency=16,
                 retry=brokerkit.RetryPolicy(max_attempts=5, initial=1.0, maximum=60.0))
    async def send(email: SignupEmail) -> None:
        ...                      # return: ack; raise: retry; raise brokerkit.Reject: DLQ

    await app.publish("emails", SignupEmail(to="a@example.com"))
    app.run()                    # or: brokerkit run module:app

The App is built on the facade only (``Broker``, ``Consumer``, ``Message``): every
backend gets it, with the facade's guarantees (durable attempts, DLQ, leases).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import pydantic

from brokerkit._broker import DEFAULT_GROUP, Broker, connect
from brokerkit._codec import CONTENT_TYPE_HEADER, JSON, Codec
from brokerkit._errors import ConfigError, InvalidArgument, ResourceClosed
from brokerkit._message import Outgoing, PublishResult
from brokerkit._middleware import Middleware, Publish
from brokerkit._policy import RetryPolicy
from brokerkit._runner import run_service
from brokerkit._validate import check_int, check_name, check_seconds
from brokerkit._worker import HandlerSpec, RouteWorker

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])

URL_ENV = "BROKERKIT_URL"

__all__ = ["URL_ENV", "App"]


class App:
    """Handlers and publishing over one broker connection (see the module docstring).

    ``url`` may be left out and given to ``start``/``run`` or in ``BROKERKIT_URL``; it may
    also be a Broker of your own (``brokerkit.from_backend(...)``), which the App opens
    but leaves for you to close.
    ``codec`` encodes published payloads and decodes received ones (JSON by default);
    ``middleware`` wraps handling and publishing, the first one outermost.
    """

    def __init__(
        self,
        url: str | Broker | None = None,
        *,
        codec: Codec = JSON,
        middleware: Sequence[Middleware] = (),
    ) -> None:
        # a Broker: the user's own (``brokerkit.from_backend(...)``), opened but not closed here
        self._given = url if isinstance(url, Broker) else None
        self.url = None if isinstance(url, Broker) else url
        self.codec = codec
        self.middleware: list[Middleware] = list(middleware)
        self._specs: list[HandlerSpec] = []
        self._broker: Broker | None = None
        self._publish: Publish | None = None
        self._workers: list[RouteWorker] = []
        self._started = False
        self._stop: asyncio.Event | None = None
        self._abort: asyncio.Event | None = None
        self._stop_requests = 0  # request_stop calls (a signal may come before serve waits)

    def __repr__(self) -> str:
        where = self._broker.url.redacted() if self._broker else "not connected"
        return f"<App {len(self._specs)} handler(s) {where}>"

    def handler(
        self,
        queue: str,
        *,
        group: str = DEFAULT_GROUP,
        model: Any = None,
        concurrency: int = 16,
        retry: RetryPolicy | None = None,
        ack_timeout: float = 30.0,
        prefetch: int | None = None,
    ) -> Callable[[F], F]:
        """Register ``async def fn(payload)`` (or ``fn(payload, msg)``) for ``queue``/``group``.

        ``model`` is what the body is validated into (a pydantic model, a dataclass, any
        type pydantic knows); without one the handler gets the body as bytes. At most
        ``concurrency`` messages are handled at once (and so leased to this process
        beyond the ``prefetch`` read ahead, default ``concurrency``). ``retry`` decides
        what an exception means (default ``RetryPolicy()``). Raises InvalidName or
        InvalidArgument at once.
        """
        check_name("queue", queue)
        check_name("consumer group", group)
        check_int("concurrency", concurrency, minimum=1)
        timeout = check_seconds("ack_timeout", ack_timeout, positive=True)
        fetch = check_int("prefetch", concurrency if prefetch is None else prefetch, minimum=1)
        policy = RetryPolicy() if retry is None else retry
        if not isinstance(policy, RetryPolicy):
            raise InvalidArgument("retry must be a brokerkit.RetryPolicy")
        if any(s.queue == queue and s.group == group for s in self._specs):
            raise InvalidArgument(f"a handler for queue {queue!r}, group {group!r} exists")
        adapter = None if model is None or model is bytes else pydantic.TypeAdapter(model)
        assert timeout is not None

        def register(fn: F) -> F:
            original = fn  # iscoroutinefunction() narrows fn's type, not original's
            if not inspect.iscoroutinefunction(fn):
                raise InvalidArgument(f"handler {fn!r} must be an async def function")
            if self._started:
                raise InvalidArgument("register handlers before the App starts")
            spec = HandlerSpec(fn, queue, group, adapter, concurrency, policy, timeout, fetch)
            self._specs.append(spec)
            return original

        return register

    @property
    def broker(self) -> Broker:
        """The App's broker connection (ResourceClosed before ``start`` or ``open``)."""
        if self._broker is None:
            raise ResourceClosed("the App is not connected: await app.open() or app.start()")
        return self._broker

    async def open(self, url: str | None = None) -> Broker:
        """Connect (for publishing; ``start`` also runs the handlers). Idempotent."""
        if self._broker is None:
            target = url or self.url or os.environ.get(URL_ENV)
            if self._given is not None and url is None:
                broker = self._given
            elif not target:
                raise ConfigError(f"no broker URL: App(url), --url or {URL_ENV}")
            else:
                broker = connect(target)
            await broker.open()
            self._broker = broker
            publish: Publish = self._send
            for mw in reversed(self.middleware):
                publish = mw.publish(publish)
            self._publish = publish
        return self._broker

    async def _send(self, queue: str, message: Outgoing) -> PublishResult:
        return await self.broker.publish(
            queue,
            message.body,
            fifo_group=message.fifo_group,
            dedup_id=message.dedup_id,
            headers=dict(message.headers),
        )

    async def publish(
        self,
        queue: str,
        payload: Any,
        *,
        fifo_group: str | None = None,
        dedup_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> PublishResult:
        """Encode ``payload`` with the codec (bytes go as they are) and publish it.

        Sets ``content-type`` to the codec's (unless ``headers`` gives one); returns once
        the broker accepted it durably. Connects on first use.
        """
        if self._publish is None:
            await self.open()
        assert self._publish is not None
        if isinstance(payload, bytes):
            body, extra = payload, {}
        else:
            body, extra = self.codec.encode(payload), {CONTENT_TYPE_HEADER: self.codec.content_type}
        if headers:
            extra = {**extra, **headers}
        return await self._publish(queue, Outgoing(body, fifo_group, dedup_id, extra))

    async def start(self, url: str | None = None) -> None:
        """Connect and start every handler (InvalidArgument when there is none)."""
        if not self._specs:
            raise InvalidArgument("the App has no handlers: register one with @app.handler")
        if self._started:
            return
        broker = await self.open(url)
        self._started = True
        self._stop, self._abort = asyncio.Event(), asyncio.Event()
        for event in (self._stop, self._abort)[: self._stop_requests]:
            event.set()
        self._workers = [RouteWorker(broker, s, self.codec, self.middleware) for s in self._specs]
        for worker in self._workers:
            await worker.start()
        log.info("started %d handler(s) on %s", len(self._workers), broker.url.redacted())

    def request_stop(self) -> None:
        """Ask ``serve`` to stop: intake stops, handlers drain; a second call aborts the drain."""
        self._stop_requests += 1
        if self._stop is not None and self._abort is not None:
            (self._stop if self._stop_requests == 1 else self._abort).set()
            self._stop.set()

    async def serve(self, url: str | None = None, *, drain_timeout: float = 30.0) -> int:
        """Start, run until ``request_stop`` (a signal under ``run``), then ``stop``."""
        await self.start(url)
        assert self._stop is not None
        try:
            await self._stop.wait()
        finally:
            unfinished = await self.stop(drain_timeout)
        return unfinished

    async def stop(self, drain_timeout: float = 30.0) -> int:
        """Stop intake, drain up to ``drain_timeout`` s, give back the rest, close.

        Returns how many messages were given back unfinished (never acked). Idempotent.
        """
        workers, self._workers = self._workers, []
        abort = self._abort
        results = await asyncio.gather(*(w.stop(drain_timeout, abort) for w in workers))
        await self.aclose()
        return sum(results)

    async def aclose(self) -> None:
        """Close the connection (``stop`` first, when handlers run). Idempotent."""
        if self._workers:
            await self.stop(0.0)
        broker, self._broker, self._publish = self._broker, None, None
        self._started, self._stop_requests = False, 0  # it may be started again
        if broker is not None and broker is not self._given:
            await broker.aclose()

    async def __aenter__(self) -> App:
        await self.open()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    @property
    def busy(self) -> int:
        """Messages being handled now, over every handler."""
        return sum(w.busy for w in self._workers)

    @property
    def last_activity(self) -> float:
        """When (``time.monotonic``) a handler last finished a message."""
        return max((w.last_activity for w in self._workers), default=0.0)

    def run(
        self,
        url: str | None = None,
        *,
        metrics_port: int | None = None,
        drain_timeout: float = 30.0,
    ) -> int:
        """Run until SIGTERM/SIGINT (see ``brokerkit._runner``); returns the exit status.

        ``metrics_port`` serves Prometheus metrics there (needs ``brokerkit-mq[prometheus]``).
        """
        if url is not None:
            self.url = url
        server = None
        if metrics_port is not None:
            from brokerkit.metrics import serve_metrics

            server = serve_metrics(self, metrics_port)
            log.info("metrics on port %d (/metrics)", server.port)
        try:
            return run_service(_Bound(self), drain_timeout=drain_timeout)
        finally:
            if server is not None:
                server.stop()


class _Bound:
    """The App as the runner's Service (the runner knows nothing of App)."""

    def __init__(self, app: App) -> None:
        self._app = app

    async def serve(self, *, drain_timeout: float) -> int:
        return await self._app.serve(drain_timeout=drain_timeout)

    def request_stop(self) -> None:
        self._app.request_stop()
