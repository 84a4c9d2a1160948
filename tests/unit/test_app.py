"""The App's policy on ``memory://``: decode, dispatch by outcome, retries, keep-alive, drain.

Pure facade-level logic (the App never sees a backend); each test has its own broker.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import pydantic
import pytest

import brokerkit
import brokerkit.backends
from brokerkit.testing import assert_dead_lettered, memory_url, run_until_idle, take_one


class Signup(pydantic.BaseModel):
    to: str
    name: str = "friend"


FAST = brokerkit.RetryPolicy(max_attempts=3, initial=0.01, maximum=0.02)


async def _publish(url: str, queue: str, *bodies: bytes) -> None:
    async with brokerkit.connect(url) as broker:
        for body in bodies:
            await broker.publish(queue, body)


async def test_a_return_acks_and_the_payload_is_validated_into_the_model() -> None:
    url, got = memory_url(), []
    app = brokerkit.App(url)

    @app.handler("emails", group="mailer", model=Signup)
    async def send(email: Signup) -> None:
        got.append(email)

    await app.publish("emails", Signup(to="a@example.com"))
    await run_until_idle(app)
    assert got == [Signup(to="a@example.com")]
    async with brokerkit.connect(url) as broker:
        with pytest.raises(AssertionError, match="no message"):
            await take_one(broker, "emails", group="mailer", timeout=0.3)  # acked: gone


async def test_publish_sends_json_with_a_content_type_header() -> None:
    url = memory_url()
    async with brokerkit.App(url) as app:
        await app.publish("q", Signup(to="b@example.com"), headers={"x-trace": "1"})
        await app.publish("q", {"plain": [1, 2]})
        await app.publish("q", b"raw bytes")
        first = await take_one(app.broker, "q")
        second = await take_one(app.broker, "q")
        third = await take_one(app.broker, "q")
    assert json.loads(first.body) == {"to": "b@example.com", "name": "friend"}
    assert dict(first.headers) == {"content-type": "application/json", "x-trace": "1"}
    assert json.loads(second.body) == {"plain": [1, 2]}
    assert (third.body, dict(third.headers)) == (b"raw bytes", {})


async def test_an_invalid_payload_is_dead_lettered_at_once_naming_the_field() -> None:
    url, dead = memory_url(), []
    app = brokerkit.App(url)

    async def on_dead(msg: brokerkit.Message, exc: BaseException) -> None:
        dead.append(type(exc))

    @app.handler("emails", model=Signup, retry=brokerkit.RetryPolicy(on_dead=on_dead))
    async def send(email: Signup) -> None:
        raise AssertionError("never called")

    await _publish(url, "emails", b'{"name": "no address"}', b"not json")
    await run_until_idle(app)
    async with brokerkit.connect(url) as broker:
        first = await assert_dead_lettered(broker, "emails", reason="to: Field required")
        second = await assert_dead_lettered(broker, "emails", reason="invalid payload")
    assert first.dead_letter_info and first.dead_letter_info.attempts == 1
    assert "no address" not in (first.dead_letter_info.reason)  # the value is not echoed
    assert second.body == b"not json"
    assert dead == [pydantic.ValidationError, pydantic.ValidationError]


async def test_an_exception_is_retried_with_backoff_then_dead_lettered_at_max_attempts() -> None:
    url, attempts, dead = memory_url(), [], []
    policy = brokerkit.RetryPolicy(
        max_attempts=3, initial=0.05, maximum=0.05, jitter=False,
        on_dead=lambda msg, exc: dead.append(str(exc)),
    )  # fmt: skip
    app = brokerkit.App(url)

    @app.handler("jobs", retry=policy)
    async def work(body: bytes, msg: brokerkit.Message) -> None:
        attempts.append((msg.attempt, time.monotonic()))
        raise RuntimeError("flaky")

    await _publish(url, "jobs", b"x")
    await run_until_idle(app, idle=0.5)
    assert [a for a, _ in attempts] == [1, 2, 3]
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(attempts)]
    assert all(gap >= 0.045 for gap in gaps), gaps  # nack(delay) held each retry back
    assert dead == ["flaky"]
    async with brokerkit.connect(url) as broker:
        await assert_dead_lettered(broker, "jobs", reason="max_attempts")


async def test_reject_and_dead_on_dead_letter_at_once_and_retry_on_limits_retries() -> None:
    url, calls = memory_url(), []
    app = brokerkit.App(url)
    policy = brokerkit.RetryPolicy(retry_on=(TimeoutError,), dead_on=(KeyError,))

    @app.handler("jobs", retry=policy)
    async def work(body: bytes) -> None:
        calls.append(body)
        if body == b"reject":
            raise brokerkit.Reject("bad customer")
        if body == b"key":
            raise KeyError("k")
        raise ValueError("not retried either")

    await _publish(url, "jobs", b"reject", b"key", b"value")
    await run_until_idle(app)
    assert sorted(calls) == [b"key", b"reject", b"value"]  # one attempt each
    async with brokerkit.connect(url) as broker:
        reasons = set()
        for _ in range(3):
            msg = await assert_dead_lettered(broker, "jobs")
            assert msg.dead_letter_info is not None
            reasons.add(msg.dead_letter_info.reason)
    assert reasons == {"bad customer", "KeyError: 'k'", "ValueError: not retried either"}


def test_the_retry_delay_is_full_jitter_capped_by_the_broker() -> None:
    policy = brokerkit.RetryPolicy(initial=1.0, maximum=1000.0)
    for attempt in range(1, 12):
        ceiling = min(1000.0, 2.0 ** (attempt - 1))
        delays = [policy.delay(attempt, cap=12 * 3600) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling / 2  # jittered over the whole range, not fixed
    assert policy.delay(20, cap=7.0) <= 7.0  # never above max_nack_delay
    fixed = brokerkit.RetryPolicy(initial=2.0, jitter=False)
    assert [fixed.delay(a, cap=100) for a in (1, 2, 3)] == [2.0, 4.0, 8.0]
    with pytest.raises(brokerkit.InvalidArgument):
        brokerkit.RetryPolicy(retry_on=ValueError)  # type: ignore[arg-type]


async def test_a_slow_handler_keeps_its_lease() -> None:
    url, attempts = memory_url(), []
    app = brokerkit.App(url)

    @app.handler("slow", ack_timeout=0.4)
    async def work(body: bytes, msg: brokerkit.Message) -> None:
        attempts.append(msg.attempt)
        await asyncio.sleep(1.5)  # almost four leases long

    await _publish(url, "slow", b"x")
    await run_until_idle(app, idle=0.8)
    assert attempts == [1]  # never redelivered: extend() kept it


async def test_concurrency_bounds_the_handlers_running_at_once() -> None:
    url, running, peak, done = memory_url(), 0, 0, []
    app = brokerkit.App(url)

    @app.handler("many", concurrency=4)
    async def work(body: bytes) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.002)
        running -= 1
        done.append(body)

    async with brokerkit.connect(url) as broker:
        await broker.publish_many("many", [brokerkit.Outgoing(b"%d" % i) for i in range(200)])
    await run_until_idle(app)
    assert peak == 4 and len(done) == 200


async def test_stop_drains_in_flight_handlers_and_gives_back_the_unfinished() -> None:
    url, finished = memory_url(), []
    app = brokerkit.App(url)
    started = asyncio.Event()

    @app.handler("drain", concurrency=2)
    async def work(body: bytes) -> None:
        started.set()
        await asyncio.sleep(0.2 if body == b"quick" else 30)
        finished.append(body)

    await _publish(url, "drain", b"quick", b"stuck")
    await app.start()
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.sleep(0.05)  # both handlers are running
    unfinished = await app.stop(drain_timeout=1.0)
    assert (unfinished, finished) == (1, [b"quick"])
    async with brokerkit.connect(url) as broker:
        again = await take_one(broker, "drain")  # given back, never acked
    assert (again.body, again.attempt) == (b"stuck", 2)


async def test_serve_stops_on_request_stop_and_a_second_request_cuts_the_drain() -> None:
    url = memory_url()
    app = brokerkit.App(url)
    started = asyncio.Event()

    @app.handler("q")
    async def work(body: bytes) -> None:
        started.set()
        await asyncio.sleep(30)

    await _publish(url, "q", b"x")
    serving = asyncio.ensure_future(app.serve(drain_timeout=30.0))
    await asyncio.wait_for(started.wait(), 5)
    app.request_stop()
    await asyncio.sleep(0.1)
    assert not serving.done()  # draining
    app.request_stop()
    assert await asyncio.wait_for(serving, 5) == 1


async def test_middleware_wraps_handle_and_publish_in_order() -> None:
    url, seen = memory_url(), []

    class Record(brokerkit.Middleware):
        def __init__(self, name: str) -> None:
            self.name = name

        def handle(self, call_next: Any, route: brokerkit.Route) -> Any:
            async def wrapped(msg: brokerkit.Message) -> brokerkit.Outcome:
                seen.append(f"{self.name}>{route.queue}/{route.group}")
                outcome = await call_next(msg)
                seen.append(f"{self.name}<{outcome.value}")
                return outcome

            return wrapped

        def publish(self, call_next: Any) -> Any:
            async def wrapped(queue: str, message: brokerkit.Outgoing) -> Any:
                seen.append(f"{self.name} publish {queue}")
                return await call_next(queue, message)

            return wrapped

    app = brokerkit.App(url, middleware=[Record("outer"), Record("inner")])

    @app.handler("mw", group="g")
    async def work(body: bytes) -> None:
        pass

    await app.publish("mw", b"x")
    await run_until_idle(app)
    assert seen == [
        "outer publish mw", "inner publish mw",
        "outer>mw/g", "inner>mw/g", "inner<acked", "outer<acked",
    ]  # fmt: skip


async def test_a_pluggable_codec() -> None:
    url, got = memory_url(), []

    class Upper:
        content_type = "text/x-upper"

        def encode(self, payload: Any) -> bytes:
            return str(payload).upper().encode()

        def decode(self, body: bytes, model: pydantic.TypeAdapter[Any]) -> Any:
            return model.validate_python(body.decode().lower())

    app = brokerkit.App(url, codec=Upper())
    assert isinstance(app.codec, brokerkit.Codec)

    @app.handler("c", model=str)
    async def work(text: str) -> None:
        got.append(text)

    await app.publish("c", "hello")
    await _publish(url, "c", b"")  # no content-type: decoded by the App's codec anyway
    await run_until_idle(app)
    assert sorted(got) == ["", "hello"]


def test_handler_arguments_are_checked_at_once() -> None:
    app = brokerkit.App(memory_url())
    with pytest.raises(brokerkit.InvalidName):
        app.handler("bad.name")
    with pytest.raises(brokerkit.InvalidArgument):
        app.handler("q", concurrency=0)
    with pytest.raises(brokerkit.InvalidArgument, match="async def"):
        app.handler("q")(lambda body: None)

    @app.handler("q")
    async def one(body: bytes) -> None:
        pass

    with pytest.raises(brokerkit.InvalidArgument, match="exists"):
        app.handler("q")


async def test_start_without_handlers_or_url_fails_clearly(monkeypatch: Any) -> None:
    monkeypatch.delenv("BROKERKIT_URL", raising=False)
    with pytest.raises(brokerkit.InvalidArgument, match="no handlers"):
        await brokerkit.App(memory_url()).start()
    app = brokerkit.App()

    @app.handler("q")
    async def one(body: bytes) -> None:
        pass

    with pytest.raises(brokerkit.ConfigError, match="BROKERKIT_URL"):
        await app.start()


class _Flaky(brokerkit.backends.Receiver[Any]):
    """A memory:// receiver whose first receives fail as a broker outage would."""

    def __init__(self, inner: brokerkit.backends.Receiver[Any], failures: int) -> None:
        self.inner, self.failures = inner, failures

    async def receive(self, max_messages: int, wait: float) -> list[Any]:
        if self.failures:
            self.failures -= 1
            raise brokerkit.BrokerUnavailable("127.0.0.1:1: connection refused")
        return await self.inner.receive(max_messages, wait)

    async def ack(self, delivery: Any) -> None:
        await self.inner.ack(delivery)

    async def nack(self, delivery: Any, delay: float) -> None:
        await self.inner.nack(delivery, delay)

    async def extend(self, delivery: Any, ack_timeout: float) -> None:
        await self.inner.extend(delivery, ack_timeout)

    async def release(self, deliveries: Any) -> None:
        await self.inner.release(deliveries)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_workers_survive_a_failing_receive_and_a_broker_of_ones_own() -> None:
    from brokerkit.backends.memory import MemoryBackend

    url, got = memory_url(), []

    class FlakyBackend(MemoryBackend):
        async def subscribe(self, queue: Any, group: str, settings: Any) -> Any:
            return _Flaky(await super().subscribe(queue, group, settings), failures=2)

    broker = brokerkit.from_backend(FlakyBackend.from_url(brokerkit.BrokerURL.parse(url)))
    app = brokerkit.App(broker)

    @app.handler("f", concurrency=1)
    async def work(body: bytes) -> None:
        got.append(body)

    await _publish(url, "f", b"after the outage")
    await run_until_idle(app, idle=2.0, timeout=20)  # the retries wait 0.5 s, then 1 s
    assert got == [b"after the outage"]  # the worker waited and received again
    await broker.publish("f", b"still open")  # the App left the user's broker open
    await broker.aclose()
