"""The optional extras: Prometheus metrics and OpenTelemetry context propagation; logging."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry import context, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from prometheus_client import generate_latest

import brokerkit
from brokerkit.metrics import PrometheusMetrics
from brokerkit.testing import memory_url, run_until_idle, take_one
from brokerkit.tracing import OpenTelemetryTracing

FAST = brokerkit.RetryPolicy(max_attempts=2, initial=0.01, maximum=0.01)


def _value(metrics: PrometheusMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_metrics_count_each_outcome_time_handlers_and_count_publishes() -> None:
    url, metrics = memory_url(), PrometheusMetrics()
    app = brokerkit.App(url, middleware=[metrics])

    @app.handler("m", group="g", retry=FAST)
    async def work(body: bytes) -> None:
        if body == b"poison":
            raise brokerkit.Reject("no")
        if body == b"flaky":
            raise RuntimeError("again")

    for body in (b"ok", b"ok", b"poison", b"flaky"):
        await app.publish("m", body)
    await run_until_idle(app)
    labels = {"queue": "m", "group": "g"}
    assert _value(metrics, "brokerkit_published_total", queue="m") == 4
    assert _value(metrics, "brokerkit_acked_total", **labels) == 2
    assert _value(metrics, "brokerkit_nacked_total", **labels) == 1  # flaky, attempt 1
    assert _value(metrics, "brokerkit_dead_lettered_total", **labels) == 2  # poison, flaky 2
    assert _value(metrics, "brokerkit_handler_duration_seconds_count", **labels) == 5
    assert _value(metrics, "brokerkit_in_flight", **labels) == 0
    text = generate_latest(metrics.registry).decode()
    assert "message_id" not in text and "brokerkit_lease_lost_total" in text


async def test_metrics_count_lease_lost_and_track_in_flight() -> None:
    metrics = PrometheusMetrics()
    route = brokerkit.Route("q", "g", "fn", "memory")
    seen_in_flight: list[float | None] = []

    async def lost(msg: Any) -> brokerkit.Outcome:
        seen_in_flight.append(_value(metrics, "brokerkit_in_flight", queue="q", group="g"))
        return brokerkit.Outcome.LOST

    await metrics.handle(lost, route)(object())  # type: ignore[arg-type]
    assert seen_in_flight == [1.0]
    assert _value(metrics, "brokerkit_lease_lost_total", queue="q", group="g") == 1
    assert _value(metrics, "brokerkit_in_flight", queue="q", group="g") == 0


async def test_trace_context_travels_in_headers_from_publish_to_the_handler() -> None:
    url, seen = memory_url(), []
    app = brokerkit.App(url, middleware=[OpenTelemetryTracing()])

    @app.handler("t")
    async def work(body: bytes, msg: brokerkit.Message) -> None:
        seen.append((trace.get_current_span().get_span_context().trace_id, dict(msg.headers)))

    parent = SpanContext(
        trace_id=0x0AF7651916CD43DD8448EB211C80319C, span_id=0xB7AD6B7169203331,
        is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )  # fmt: skip
    token = context.attach(trace.set_span_in_context(NonRecordingSpan(parent)))
    try:
        await app.publish("t", b"x")
    finally:
        context.detach(token)
    await run_until_idle(app)
    ((trace_id, headers),) = seen
    assert trace_id == parent.trace_id  # the handler runs in the publisher's trace
    assert headers["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")


async def test_nothing_is_logged_per_message_at_info(caplog: pytest.LogCaptureFixture) -> None:
    url = memory_url()
    app = brokerkit.App(url)

    @app.handler("l")
    async def work(body: bytes) -> None:
        if body == b"bad":
            raise brokerkit.Reject("bad one")

    for i in range(20):
        await app.publish("l", b"%d" % i)
    await app.publish("l", b"bad")
    with caplog.at_level(logging.DEBUG, logger="brokerkit"):
        await run_until_idle(app)
    info = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(info) <= 2  # started / nothing per message
    (dead,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert dead.name == "brokerkit._worker" and dead.getMessage() == "dead-lettered: bad one"
    assert (dead.queue, dead.group, dead.attempt) == ("l", "default", 1)  # type: ignore[attr-defined]
    assert dead.message_id  # type: ignore[attr-defined]
    async with brokerkit.connect(url) as broker:
        with pytest.raises(AssertionError):
            await take_one(broker, "l", timeout=0.2)
