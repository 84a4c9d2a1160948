"""Fault behaviour ``network cut``: the TCP path cut longer than the clients' timeouts.

Needs a hook: ``--proxy`` (``brokerkit check URL --proxy``). The suite then runs TCP
proxies (``contract_tests._proxy``) and connects through them: the producer through
one, the two consumers through another. The broker keeps running; the path is cut
(no byte moves, nothing is closed) for ``--cut-seconds`` (default 20, longer than
the clients' timeouts; CI uses less and says so), then restored. Three cuts:

* ``publish``: the producer's path, while it publishes;
* ``receive``: the consumers' path, while they wait in receive (handlers ack at once);
* ``ack``: the consumers' path, while they hold messages (handlers work 0.2 s each) and ack.

The assertions are those of ``broker restart`` (contract_tests/_stream.py), plus
evidence that the cut reached the client: no publish started during the cut is
confirmed before the restore (``publish``), or nothing published during the cut is
delivered before it (``receive``, ``ack``). A client that bypasses the proxy fails that
(e.g. Kafka, whose brokers advertise their own address: run Kafka with
``advertised.listeners`` on the proxy's port and pass ``--proxy-port``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

import brokerkit

from ._faults import NOT_RUN, in_process, library_warnings, real_url, record
from ._helpers import SCALE, WAIT, SecretURL, eventually
from ._proxy import through_proxy
from ._stream import AFTER_RECOVERY, PACE, Stream, violations
from .conftest import Connect

ACK_TIMEOUT = 5.0
BEFORE = 30
AFTER = 30
HOLD = 0.2
"""Seconds an ``ack``-cut handler works on each message (the publisher paces to match)."""
SETTLE = 0.5
"""Seconds after the cut before the evidence window opens (bytes already in flight)."""


@pytest.mark.behaviour("network cut")
@pytest.mark.parametrize("during", ["publish", "receive", "ack"])
async def test_network_cut_longer_than_client_timeouts_then_restored(
    broker_url: object,
    connect: Connect,
    queue: str,
    group: str,
    during: str,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    if in_process(broker_url):
        pytest.skip(NOT_RUN + "memory:// is in-process: there is no network path to cut")
    if not request.config.getoption("--proxy"):
        pytest.skip(NOT_RUN + "needs --proxy (the suite connects through a TCP proxy it cuts)")
    cut_for = float(request.config.getoption("--cut-seconds"))
    fixed = int(request.config.getoption("--proxy-port"))
    started = time.monotonic()
    url = SecretURL(real_url(broker_url))  # printed redacted, wherever pytest prints it
    # one proxy for the producer, one for the consumers (one for all with a fixed port)
    producer_path = through_proxy(url, fixed)
    consumer_path = producer_path if fixed else through_proxy(url)
    stream: Stream | None = None
    consumers: list[brokerkit.Consumer] = []
    try:
        producer = await connect(SecretURL(producer_path.url))
        slack = producer.capabilities.redelivery_slack
        flush = producer.capabilities.ack_flush_interval
        for _ in range(2):
            conn = await connect(SecretURL(consumer_path.url))
            consumer = conn.consumer(queue, group, ack_timeout=ACK_TIMEOUT, close_timeout=1.0)
            await consumer.open()
            consumers.append(consumer)
        stream = Stream(
            producer,
            consumers,
            queue,
            hold=HOLD if during == "ack" else 0.0,
            pace=HOLD if during == "ack" else PACE,
            bound=cut_for + AFTER_RECOVERY,
            redelivered_within=ACK_TIMEOUT + slack + 2.0,
        )
        stream.start()
        await eventually(
            lambda: len(stream.acked()) >= BEFORE or bool(stream.iterator_errors),
            timeout=WAIT * 3,
            what=f"{BEFORE} messages acked before the cut",
        )
        path = producer_path if during == "publish" else consumer_path
        cut_at = time.monotonic()
        path.cut()
        timed_out = ""
        try:
            await eventually(
                lambda: time.monotonic() - cut_at >= cut_for or bool(stream.iterator_errors),
                timeout=cut_for + 5,
                interval=0.1,
                what="the cut to last",
            )
        finally:
            restored_at = stream.fault_end = time.monotonic()
            path.restore()
        try:
            await eventually(
                lambda: (
                    stream.confirmed_after(restored_at) >= AFTER or bool(stream.iterator_errors)
                ),
                timeout=AFTER_RECOVERY * 2,
                what=f"{AFTER} publishes confirmed after the restore",
            )
            await stream.stop_publishing()
            await eventually(
                lambda: stream.all_acked() or bool(stream.iterator_errors),
                timeout=AFTER_RECOVERY * 2 + ACK_TIMEOUT + slack,
                what="every confirmed message acked",
            )
            seen = sum(len(d) for d in stream.deliveries.values())
            await eventually(
                lambda: sum(len(d) for d in stream.deliveries.values()) > seen,
                timeout=(ACK_TIMEOUT + slack + 1.0) * SCALE,
                what="(no stray redelivery: this wait is expected to time out)",
            )
        except AssertionError as exc:
            if "expected to time out" not in str(exc):
                timed_out = str(exc)
    finally:
        if stream is not None:
            await stream.close()
        for consumer in consumers:
            await asyncio.wait_for(consumer.aclose(), WAIT)
        if fixed:  # a broker that advertises the proxy is reachable only through it
            made: list[str] = request.getfixturevalue("made_queues")
            with contextlib.suppress(brokerkit.BrokerkitError):
                async with brokerkit.connect(SecretURL(producer_path.url)) as cleaner:
                    await cleaner.delete_queue(queue)
                    made.remove(queue)
        producer_path.close()
        if consumer_path is not producer_path:
            consumer_path.close()
    # evidence that the cut reached the client
    window = (cut_at + SETTLE, restored_at)
    if during == "publish":
        leaked = [
            b
            for b, p in stream.publishes.items()
            if p.outcome == "ok" and p.started > window[0] and p.ended is not None
            and p.ended < window[1]
        ]  # fmt: skip
        evidence = "publishes started during the cut confirmed before the restore"
    else:
        late_start = window[0] + stream.hold
        leaked = [
            b
            for b, d in stream.deliveries.items()
            if stream.publishes[b].started > cut_at
            and any(late_start < t < window[1] for t, _ in d)
        ]
        evidence = "messages published during the cut delivered before the restore"
    figures = stream.figures(cut_at, restored_at, flush, 0.0)
    figures.update(
        scheme=url.redacted().split(":", 1)[0],
        during=during,
        cut_s=round(restored_at - cut_at, 1),
        proxy_connections=producer_path.connections
        + (0 if consumer_path is producer_path else consumer_path.connections),
        leaked_through_cut=len(leaked),
        seconds=round(time.monotonic() - started, 1),
        warnings=library_warnings(caplog.records),
    )
    record(request, "network cut", figures)
    problems = violations(figures)
    if leaked:
        problems.append(
            f"the cut did not reach the client ({len(leaked)} {evidence}): it bypasses "
            "the proxy (a broker advertising its own address?)"
        )
    if timed_out:
        problems.append(timed_out)
    assert not problems, f"{problems}; figures: {figures}"
