"""Prometheus metrics for an App: ``pip install 'brokerkit-mq[prometheus]'``.

::

    app = brokerkit.App(url, middleware=[PrometheusMetrics()])   # or --metrics-port

Per handler (labels ``queue``, ``group``: low cardinality, never a message id):
``brokerkit_acked_total``, ``brokerkit_nacked_total``, ``brokerkit_dead_lettered_total``,
``brokerkit_lease_lost_total``, ``brokerkit_settled_by_handler_total``,
``brokerkit_handler_duration_seconds`` (histogram) and ``brokerkit_in_flight`` (gauge);
per queue: ``brokerkit_published_total``. Each PrometheusMetrics has its own registry
(``registry=prometheus_client.REGISTRY`` to use the global one).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from brokerkit._errors import ConfigError
from brokerkit._message import Outgoing, PublishResult
from brokerkit._middleware import Handle, Middleware, Outcome, Publish, Route

try:
    import prometheus_client
except ModuleNotFoundError:  # pragma: no cover - depends on the environment
    raise ConfigError(
        "brokerkit.metrics needs prometheus-client: pip install 'brokerkit-mq[prometheus]'"
    ) from None

if TYPE_CHECKING:
    from brokerkit._consumer import Message

__all__ = ["MetricsServer", "PrometheusMetrics", "serve_metrics"]

_LABELS = ("queue", "group")


class PrometheusMetrics(Middleware):
    """Counts every settle by outcome, times handlers, gauges in-flight, counts publishes."""

    def __init__(
        self,
        registry: prometheus_client.CollectorRegistry | None = None,
        namespace: str = "brokerkit",
    ) -> None:
        self.registry = registry if registry is not None else prometheus_client.CollectorRegistry()
        kw: dict[str, Any] = {"namespace": namespace, "registry": self.registry}
        counter = prometheus_client.Counter
        self.outcomes = {
            Outcome.ACKED: counter("acked", "Messages acked", _LABELS, **kw),
            Outcome.NACKED: counter("nacked", "Messages nacked for a retry", _LABELS, **kw),
            Outcome.DEAD: counter("dead_lettered", "Messages sent to the DLQ", _LABELS, **kw),
            Outcome.LOST: counter("lease_lost", "Leases lost before settling", _LABELS, **kw),
            Outcome.SETTLED: counter(
                "settled_by_handler", "Messages the handler settled itself", _LABELS, **kw
            ),
        }
        self.duration = prometheus_client.Histogram(
            "handler_duration_seconds", "Time to handle and settle a message", _LABELS, **kw
        )
        self.in_flight = prometheus_client.Gauge(
            "in_flight", "Messages being handled now", _LABELS, **kw
        )
        self.published = counter("published", "Messages published", ("queue",), **kw)

    def handle(self, call_next: Handle, route: Route) -> Handle:
        labels = (route.queue, route.group)
        counters = {outcome: c.labels(*labels) for outcome, c in self.outcomes.items()}
        duration = self.duration.labels(*labels)
        gauge = self.in_flight.labels(*labels)
        clock = time.perf_counter

        async def measured(msg: Message) -> Outcome:
            gauge.inc()
            started = clock()
            try:
                outcome = await call_next(msg)
            finally:
                duration.observe(clock() - started)
                gauge.dec()
            counters[outcome].inc()
            return outcome

        return measured

    def publish(self, call_next: Publish) -> Publish:
        children: dict[str, Any] = {}

        async def counted(queue: str, message: Outgoing) -> PublishResult:
            result = await call_next(queue, message)
            child = children.get(queue)
            if child is None:
                child = children[queue] = self.published.labels(queue)
            child.inc()
            return result

        return counted


class _WithMiddleware(Protocol):
    """An App, as far as ``serve_metrics`` needs one (no import of the App: no cycle)."""

    middleware: list[Middleware]


class MetricsServer:
    """The ``/metrics`` endpoint serving one registry, in a thread of its own."""

    def __init__(self, registry: prometheus_client.CollectorRegistry, port: int, addr: str):
        self._server, self._thread = prometheus_client.start_http_server(
            port, addr, registry=registry
        )
        self.port: int = self._server.server_port

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)


def serve_metrics(app: _WithMiddleware, port: int, addr: str = "0.0.0.0") -> MetricsServer:
    """Serve ``app``'s metrics on ``addr:port`` (``/metrics``; port 0 picks a free one).

    Adds a PrometheusMetrics middleware (outermost) unless the App has one; call it
    before the App starts.
    """
    metrics = next((m for m in app.middleware if isinstance(m, PrometheusMetrics)), None)
    if metrics is None:
        metrics = PrometheusMetrics()
        app.middleware.insert(0, metrics)
    return MetricsServer(metrics.registry, port, addr)
