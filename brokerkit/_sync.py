"""A blocking facade for code without an event loop (Django, Flask, scripts, threads).

::

    broker = brokerkit.SyncBroker("redis://127.0.0.1:6379/0")   # at startup
    broker.publish("emails", b"...")                              # from any thread
    broker.close()                                                # at shutdown

One background event-loop thread per SyncBroker runs an ordinary ``Broker``; each call
is handed to it and waited for (not ``asyncio.run`` per call: one connection, and
concurrent calls from many threads are gathered into pipelined publishes as usual).
It works from any thread, also one that runs an event loop of its own (an async view
calling sync code): the call then blocks that thread until the broker answered, as any
blocking I/O would. From the SyncBroker's own loop thread (a callback scheduled on it)
a call would wait for itself: it raises RuntimeError instead.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

from brokerkit._broker import DEFAULT_GROUP, Broker, connect
from brokerkit._consumer import Consumer, Message
from brokerkit._errors import ResourceClosed
from brokerkit._message import Outgoing, PublishResult

T = TypeVar("T")

__all__ = ["SyncBroker", "SyncConsumer", "SyncMessage"]


class SyncBroker:
    """``Broker``'s publishing and consuming as blocking calls (see the module docstring).

    ``timeout`` bounds each call (TimeoutError; a publish that timed out may still have
    been accepted). Use as ``with SyncBroker(url) as broker:`` or call ``close()``.
    """

    def __init__(self, url: str, *, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._broker: Broker = connect(url)  # no I/O yet: ConfigError here, at once
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="brokerkit-sync", daemon=True
        )
        self._thread.start()
        self._closed = False

    def __repr__(self) -> str:
        return f"<SyncBroker {self._broker.url.redacted()}>"

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the SyncBroker's loop and wait for its result."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "a SyncBroker was called from its own event-loop thread (it would wait for "
                "itself): await the async Broker (SyncBroker.broker) there instead"
            )
        if self._closed:
            coro.close()
            raise ResourceClosed(f"{self!r} is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self.timeout)
        except TimeoutError:
            future.cancel()
            raise

    @property
    def broker(self) -> Broker:
        """The async Broker underneath (for code running on the SyncBroker's loop)."""
        return self._broker

    def publish(
        self,
        queue: str,
        body: bytes,
        *,
        fifo_group: str | None = None,
        dedup_id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> PublishResult:
        """``Broker.publish``, blocking until the broker accepted the message durably."""
        return self.run(
            self._broker.publish(
                queue, body, fifo_group=fifo_group, dedup_id=dedup_id,
                headers=dict(headers) if headers is not None else None,
            )
        )  # fmt: skip

    def publish_many(self, queue: str, messages: Iterable[Outgoing]) -> list[PublishResult]:
        return self.run(self._broker.publish_many(queue, list(messages)))

    def consumer(self, queue: str, group: str = DEFAULT_GROUP, **options: Any) -> SyncConsumer:
        """``Broker.consumer`` (same options), iterated with a plain ``for`` loop."""
        return SyncConsumer(self, self._broker.consumer(queue, group, **options))

    def close(self) -> None:
        """Close the broker and stop the loop thread. Idempotent."""
        if self._closed:
            return
        self.run(self._broker.aclose())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(self.timeout)
        self._loop.close()

    def __enter__(self) -> SyncBroker:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SyncConsumer:
    """A consumer for a thread: ``with broker.consumer(q) as c: for msg in c: msg.ack()``."""

    def __init__(self, owner: SyncBroker, consumer: Consumer) -> None:
        self._owner = owner
        self._consumer = consumer

    def __enter__(self) -> SyncConsumer:
        self._owner.run(self._consumer.open())
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._owner.run(self._consumer.aclose())

    def __iter__(self) -> Iterator[SyncMessage]:
        while True:
            try:
                message = self._owner.run(self._consumer.__anext__())
            except StopAsyncIteration:
                return
            yield SyncMessage(self._owner, message)


class SyncMessage:
    """A received ``Message`` whose settling methods block."""

    def __init__(self, owner: SyncBroker, message: Message) -> None:
        self._owner = owner
        self.message = message

    def __getattr__(self, name: str) -> Any:  # body, headers, id, attempt, ...
        return getattr(self.message, name)

    def ack(self) -> None:
        self._owner.run(self.message.ack())

    def nack(self, delay: float | None = None) -> None:
        self._owner.run(self.message.nack(delay))

    def dead_letter(self, reason: str) -> None:
        self._owner.run(self.message.dead_letter(reason))

    def extend(self) -> None:
        self._owner.run(self.message.extend())
