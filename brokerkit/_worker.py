"""One handler at work: a consumer, ``concurrency`` worker tasks, the lease keep-alive.

The policy for one message, written once: decode and validate (an invalid payload is
dead-lettered at once, the reason naming the fields), call the handler, then settle:
a return acks, ``Reject`` or a ``dead_on`` exception dead-letters, any other exception
nacks with the retry policy's delay (the facade dead-letters it at ``max_attempts``).
While the handler runs, its lease is renewed (``extend()``) before it can run out.
Each worker task handles one message at a time, so no task is made per message, and
the consumer's ``max_in_flight`` is the concurrency: nothing more is leased to callers.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pydantic

from brokerkit._broker import Broker
from brokerkit._codec import CONTENT_TYPE_HEADER, Codec, describe_invalid
from brokerkit._consumer import Consumer, Message
from brokerkit._errors import AlreadySettled, BrokerkitError, LeaseExpired, ResourceClosed
from brokerkit._middleware import Handle, Middleware, Outcome, Route
from brokerkit._policy import Reject, RetryPolicy

log = logging.getLogger(__name__)

_now = time.monotonic  # the consumer's lease clock
_MAX_PAUSE = 30.0  # longest wait before receiving again after a failure


@dataclass(frozen=True)
class HandlerSpec:
    """What ``@app.handler(...)`` registered."""

    fn: Callable[..., Awaitable[Any]]
    queue: str
    group: str
    model: pydantic.TypeAdapter[Any] | None
    concurrency: int
    retry: RetryPolicy
    ack_timeout: float
    prefetch: int

    @property
    def with_message(self) -> bool:
        """True when the handler takes the Message too: ``async def f(payload, msg)``."""
        params = inspect.signature(self.fn).parameters.values()
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return len(positional) >= 2


class RouteWorker:
    """Runs one handler until stopped (see the module docstring)."""

    def __init__(
        self, broker: Broker, spec: HandlerSpec, codec: Codec, middleware: Sequence[Middleware]
    ) -> None:
        self.spec = spec
        self.route = Route(spec.queue, spec.group, spec.fn.__qualname__, broker.url.scheme)
        self._broker = broker
        self._codec = codec
        self._max_nack_delay = broker.capabilities.max_nack_delay
        self._with_message = spec.with_message
        handle: Handle = self._process
        for mw in reversed(middleware):
            handle = mw.handle(handle, self.route)
        self._handle = handle
        self._consumer: Consumer | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._keeper: asyncio.Task[None] | None = None
        self._active: dict[Message, asyncio.Task[Any] | None] = {}  # being handled
        self._stopping = False
        self.last_activity = _now()

    @property
    def busy(self) -> int:
        """Messages being handled now."""
        return len(self._active)

    def _extra(self, msg: Message) -> dict[str, Any]:
        return {"queue": msg.queue, "group": self.spec.group, "message_id": msg.id,
                "attempt": msg.attempt}  # fmt: skip

    async def start(self) -> None:
        spec = self.spec
        self._consumer = consumer = self._broker.consumer(
            spec.queue,
            spec.group,
            max_attempts=spec.retry.max_attempts,
            ack_timeout=spec.ack_timeout,
            prefetch=spec.prefetch,
            max_in_flight=spec.concurrency,
            close_timeout=0.0,  # the drain is ours (stop); close only gives back the rest
        )
        await consumer.open()
        self._workers = [
            asyncio.ensure_future(self._work(consumer)) for _ in range(spec.concurrency)
        ]
        self._keeper = asyncio.ensure_future(self._keep_alive())

    async def _work(self, consumer: Consumer) -> None:
        active, handle = self._active, self._handle
        me = asyncio.current_task()
        failures = 0
        while not self._stopping:
            try:
                msg = await consumer.__anext__()
            except (StopAsyncIteration, ResourceClosed):
                return
            except Exception as exc:  # BrokerUnavailable after the backend's own retry, ...
                failures += 1
                pause = min(_MAX_PAUSE, 0.25 * 2 ** min(failures, 8))
                log.error("receiving from %s/%s failed (%s); again in %.1fs", self.spec.queue,
                          self.spec.group, _describe(exc), pause)  # fmt: skip
                await asyncio.sleep(pause)
                continue
            failures = 0
            active[msg] = me
            try:
                await handle(msg)
            except Exception:  # a middleware's bug must not stop the worker
                log.exception("handling failed outside the handler", extra=self._extra(msg))
            finally:
                del active[msg]
                self.last_activity = _now()

    async def stop(self, timeout: float, abort: asyncio.Event | None = None) -> int:
        """Stop intake, let handlers finish within ``timeout``, then cancel the rest.

        Every message not finished is left unsettled and given back to the broker (never
        acked). Returns how many were given back unfinished.
        """
        self._stopping = True
        busy = set(self._active.values())
        for task in self._workers:
            if task not in busy:
                task.cancel()  # waiting for a message: cancelling __anext__ loses nothing
        unfinished = 0
        if self._workers:
            pending = await _drain(self._workers, timeout, abort)
            unfinished = sum(1 for task in self._active.values() if task in pending)
            for task in pending:
                task.cancel()  # the handler is interrupted; its message stays unsettled
            await asyncio.gather(*self._workers, return_exceptions=True)
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.aclose()  # gives back whatever is unsettled
        if unfinished:
            log.warning(
                "%d message(s) of %s/%s not finished within the drain timeout: given back",
                unfinished, self.spec.queue, self.spec.group,
            )  # fmt: skip
        return unfinished

    async def _keep_alive(self) -> None:
        """Renew the lease of every message being handled before it can run out."""
        timeout = self.spec.ack_timeout
        while True:
            await asyncio.sleep(timeout / 4)
            soon = _now() + timeout / 2
            due = [m for m in self._active if _lease_ends(m) < soon and not m.settled]
            if due:
                await asyncio.gather(*(self._extend(m) for m in due))

    async def _extend(self, msg: Message) -> None:
        try:
            await msg.extend()
        except (AlreadySettled, LeaseExpired):
            pass  # settled meanwhile, or already lost: the settle reports it
        except BrokerkitError as exc:
            log.warning("could not extend the lease: %s", exc, extra=self._extra(msg))

    async def _process(self, msg: Message) -> Outcome:
        """The innermost handle: decode, run the handler, settle; never raises."""
        spec = self.spec
        if _lease_ends(msg) < _now() + spec.ack_timeout / 2:
            await self._extend(msg)  # waited long in the read-ahead buffer
        try:
            payload = self._decode(msg)
        except pydantic.ValidationError as exc:
            return await self._dead(msg, describe_invalid(exc), exc)
        except Exception as exc:
            return await self._dead(msg, f"undecodable payload: {_describe(exc)}", exc)
        try:
            if self._with_message:
                await spec.fn(payload, msg)
            else:
                await spec.fn(payload)
        except Exception as exc:
            if msg.settled:
                return Outcome.SETTLED
            return await self._failed(msg, exc)
        if msg.settled:
            return Outcome.SETTLED
        return await self._settle(msg, msg.ack(), Outcome.ACKED)

    def _decode(self, msg: Message) -> Any:
        model = self.spec.model
        if model is None:
            return msg.body
        kind = msg.headers.get(CONTENT_TYPE_HEADER)
        if kind is not None and kind != self._codec.content_type:
            raise ValueError(f"content-type {kind!r}, expected {self._codec.content_type!r}")
        return self._codec.decode(msg.body, model)

    async def _failed(self, msg: Message, exc: Exception) -> Outcome:
        policy = self.spec.retry
        if not policy.retries(exc):
            reason = exc.reason if isinstance(exc, Reject) else _describe(exc)
            return await self._dead(msg, reason, exc)
        if msg.attempt >= policy.max_attempts:  # the facade moves it to the DLQ
            log.error("attempts used up, dead-lettered: %s", _describe(exc),
                      extra=self._extra(msg), exc_info=exc)  # fmt: skip
            outcome = await self._settle(msg, msg.nack(), Outcome.DEAD)
            if outcome is Outcome.DEAD:
                await self._on_dead(msg, exc)
            return outcome
        delay = policy.delay(msg.attempt, self._max_nack_delay)
        log.warning("handler failed, retry in %.2fs: %s", delay, _describe(exc),
                    extra=self._extra(msg), exc_info=exc)  # fmt: skip
        return await self._settle(msg, msg.nack(delay), Outcome.NACKED)

    async def _dead(self, msg: Message, reason: str, exc: BaseException) -> Outcome:
        log.error("dead-lettered: %s", reason, extra=self._extra(msg))
        outcome = await self._settle(msg, msg.dead_letter(reason), Outcome.DEAD)
        if outcome is Outcome.DEAD:
            await self._on_dead(msg, exc)
        return outcome

    async def _settle(self, msg: Message, settling: Awaitable[None], done: Outcome) -> Outcome:
        try:
            await settling
        except LeaseExpired:
            log.warning("lease lost before settling: redelivered", extra=self._extra(msg))
            return Outcome.LOST
        except AlreadySettled:
            return Outcome.SETTLED
        except BrokerkitError as exc:
            log.error("settle failed (%s): redelivered", exc, extra=self._extra(msg))
            return Outcome.LOST
        return done

    async def _on_dead(self, msg: Message, exc: BaseException) -> None:
        hook = self.spec.retry.on_dead
        if hook is None:
            return
        try:
            result = hook(msg, exc)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("on_dead hook failed", extra=self._extra(msg))


async def _drain(
    tasks: list[asyncio.Task[None]], timeout: float, abort: asyncio.Event | None
) -> set[asyncio.Task[None]]:
    """Wait for ``tasks`` up to ``timeout`` s, or until ``abort`` is set; the unfinished."""
    deadline = _now() + max(timeout, 0.0)
    pending = {t for t in tasks if not t.done()}
    aborted = asyncio.ensure_future(abort.wait()) if abort is not None else None
    try:
        while pending and (left := deadline - _now()) > 0 and not (abort and abort.is_set()):
            watch = pending | {aborted} if aborted is not None else pending
            await asyncio.wait(watch, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            pending = {t for t in pending if not t.done()}
    finally:
        if aborted is not None:
            aborted.cancel()
    return pending


def _lease_ends(msg: Message) -> float:
    """When ``msg``'s lease runs out, on the consumer's clock (facade-internal)."""
    return msg._deadline


def _describe(exc: BaseException, limit: int = 512) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[: limit - 3] + "..."
