"""OpenTelemetry tracing for an App: ``pip install 'brokerkit-mq[opentelemetry]'``.

::

    app = brokerkit.App(url, middleware=[OpenTelemetryTracing()])

On publish, a PRODUCER span ``send <queue>`` and the W3C ``traceparent``/``tracestate``
injected into the message's headers (through the globally configured propagator); on
handling, the context is extracted from the headers and a CONSUMER span
``process <queue>`` is its child. Attributes follow the messaging semantic conventions
(``messaging.system``, ``messaging.destination.name``, ``messaging.operation.type``,
``messaging.consumer.group.name``, ``messaging.message.id``, body size, and
``brokerkit.attempt``). Only ``opentelemetry-api`` is needed: spans are recorded when
the application configures an SDK, and are no-ops otherwise.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from brokerkit._errors import ConfigError
from brokerkit._message import Outgoing, PublishResult
from brokerkit._middleware import Handle, Middleware, Outcome, Publish, Route

try:
    from opentelemetry import propagate, trace
except ModuleNotFoundError:  # pragma: no cover - depends on the environment
    raise ConfigError(
        "brokerkit.tracing needs opentelemetry-api: pip install 'brokerkit-mq[opentelemetry]'"
    ) from None

if TYPE_CHECKING:
    from brokerkit._consumer import Message

__all__ = ["OpenTelemetryTracing"]

# messaging.system: the semantic conventions' names where they have one
_SYSTEMS = {"amqp": "rabbitmq", "amqps": "rabbitmq", "sqs": "aws_sqs", "rediss": "redis",
            "tls": "nats"}  # fmt: skip
_FAILED = (Outcome.NACKED, Outcome.DEAD, Outcome.LOST)


class OpenTelemetryTracing(Middleware):
    """Spans per publish and per handling, context carried in the message headers."""

    def __init__(
        self, tracer_provider: trace.TracerProvider | None = None, system: str = ""
    ) -> None:
        self._tracer = trace.get_tracer("brokerkit", tracer_provider=tracer_provider)
        self._system = system

    def handle(self, call_next: Handle, route: Route) -> Handle:
        tracer = self._tracer
        name = f"process {route.queue}"
        base = {
            "messaging.system": self._system or _SYSTEMS.get(route.system, route.system),
            "messaging.destination.name": route.queue,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.consumer.group.name": route.group,
        }

        async def traced(msg: Message) -> Outcome:
            parent = propagate.extract(msg.headers)
            attributes: dict[str, Any] = {
                **base,
                "messaging.message.id": msg.id,
                "messaging.message.body.size": len(msg.body),
                "brokerkit.attempt": msg.attempt,
            }
            with tracer.start_as_current_span(
                name, context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes
            ) as span:
                outcome = await call_next(msg)
                span.set_attribute("brokerkit.outcome", outcome.value)
                if outcome in _FAILED:
                    span.set_status(trace.StatusCode.ERROR, outcome.value)
                return outcome

        return traced

    def publish(self, call_next: Publish) -> Publish:
        tracer = self._tracer

        async def traced(queue: str, message: Outgoing) -> PublishResult:
            attributes: dict[str, Any] = {
                "messaging.system": self._system or "brokerkit",
                "messaging.destination.name": queue,
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.message.body.size": len(message.body),
            }
            with tracer.start_as_current_span(
                f"send {queue}", kind=trace.SpanKind.PRODUCER, attributes=attributes
            ) as span:
                headers = dict(message.headers)
                propagate.inject(headers)
                result = await call_next(queue, replace(message, headers=headers))
                span.set_attribute("messaging.message.id", result.id)
                return result

        return traced
