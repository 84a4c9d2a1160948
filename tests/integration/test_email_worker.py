"""End to end: examples/email_worker.py stopped mid-stream by SIGTERM, then restarted.

Checks that nothing is lost (every valid email is sent once the restarted worker is
done), nothing is acked unfinished (each acked email's handler published its outbox
confirmation, and none is sent twice), poison lands in the DLQ with the field named,
the drain lets in-flight sends finish (exit status 0), and /metrics serves the counters.

* on ``memory://`` (per process), the App runs in this process under the real runner,
  and SIGTERM is sent to this process;
* on every real broker in ``BROKERKIT_URLS`` (what ``scripts/test-all`` sets: each running
  broker whose backend exists), the worker is ``brokerkit run`` in a subprocess.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import brokerkit
from brokerkit._runner import EXIT_OK, _main
from brokerkit.testing import assert_dead_lettered, memory_url

ROOT = Path(__file__).resolve().parents[2]
VALID = 300
POISON = [b'{"to": "not-an-address", "name": "p"}', b'{"to": "x@blocked.example", "name": "b"}']
REAL_URLS = [
    u.strip()
    for u in os.environ.get("BROKERKIT_URLS", "").split(",")
    if u.strip() and not u.strip().startswith("memory:")
]


def _emails() -> list[bytes]:
    return [json.dumps({"to": f"u{i}@example.com", "name": f"u{i}"}).encode() for i in range(VALID)]


async def _fill(broker: brokerkit.Broker, queue: str) -> None:
    await broker.publish_many(queue, [brokerkit.Outgoing(b) for b in [*POISON, *_emails()]])


async def _count_sent(consumer: brokerkit.Consumer, seen: list[str]) -> None:
    async for msg in consumer:
        seen.append(json.loads(msg.body)["to"])
        await msg.ack()


async def _until(check: Callable[[], bool | Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await _holds(check):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def _holds(check: Callable[[], bool | Awaitable[bool]]) -> bool:
    result = check()
    return await result if not isinstance(result, bool) else result


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


async def _acked_at_least(port: int, queue: str, count: int) -> str:
    """Scrape the worker's /metrics until its acked counter for ``queue`` reaches ``count``;
    the last page."""
    series = 'brokerkit_acked_total{group="mailer",queue="' + queue + '"} '
    page = [""]

    async def reached() -> bool:
        try:
            page[0] = await asyncio.to_thread(_scrape, port)
        except OSError:  # not serving yet: the worker is still starting
            return False
        return any(
            line.startswith(series) and float(line[len(series) :]) >= count
            for line in page[0].splitlines()
        )

    await _until(reached, 60, f"the worker's /metrics to count {count} acks")
    return page[0]


async def _check_outcome(broker: brokerkit.Broker, queue: str, sent: list[str]) -> None:
    expected = sorted(f"u{i}@example.com" for i in range(VALID))
    await _until(lambda: len(sent) >= VALID, 60, f"{VALID} sent emails")
    assert sorted(sent) == expected  # nothing lost, nothing sent twice
    first = await assert_dead_lettered(broker, queue, timeout=10)
    second = await assert_dead_lettered(broker, queue, timeout=10)
    reasons = sorted(m.dead_letter_info.reason for m in (first, second) if m.dead_letter_info)
    assert reasons[0].startswith("invalid payload: to: String should match pattern"), reasons
    assert reasons[1] == "recipient blocked"


async def _run_twice(
    broker: brokerkit.Broker,
    queue: str,
    start: Callable[[], Awaitable[None]],
    sigterm: Callable[[], None],
    wait_exit: Callable[[], Awaitable[int]],
    metrics_port: Callable[[], int],
    busy: Callable[[], int] | None = None,
) -> None:
    sent: list[str] = []
    await _fill(broker, queue)
    async with broker.consumer(f"{queue}-sent", "check") as outbox:
        counter = asyncio.ensure_future(_count_sent(outbox, sent))
        try:
            await start()
            # the worker's own count, not the outbox's: the outbox consumer may lag (a
            # Kafka group still joining) until the worker is nearly done
            text = await _acked_at_least(metrics_port(), queue, 40)
            assert "brokerkit_handler_duration_seconds_bucket" in text
            in_flight = busy() if busy else None
            sigterm()
            assert await wait_exit() == EXIT_OK  # drained: every in-flight send finished
            assert in_flight is None or in_flight > 0  # the drain had work to finish
            stopped_at = len(sent)
            assert stopped_at < VALID, "the worker finished before SIGTERM: nothing tested"
            await start()  # the restart picks up the rest
            await _check_outcome(broker, queue, sent)
            sigterm()
            assert await wait_exit() == EXIT_OK
        finally:
            counter.cancel()
            await asyncio.gather(counter, return_exceptions=True)


async def test_the_example_worker_on_memory_drains_on_sigterm_and_restarts() -> None:
    sys.path.insert(0, str(ROOT))
    from brokerkit.metrics import serve_metrics
    from examples import email_worker

    app = email_worker.app
    app.url = memory_url()
    server = serve_metrics(app, 0, "127.0.0.1")
    running: list[asyncio.Task[int]] = []

    class Service:
        async def serve(self, *, drain_timeout: float) -> int:
            return await app.serve(drain_timeout=drain_timeout)

        def request_stop(self) -> None:
            app.request_stop()

    async def start() -> None:
        running.append(asyncio.ensure_future(_main(Service(), 10.0)))

    async def wait_exit() -> int:
        return await asyncio.wait_for(running.pop(), 30)

    try:
        async with brokerkit.connect(app.url) as broker:
            await _run_twice(
                broker, email_worker.QUEUE, start, lambda: os.kill(os.getpid(), signal.SIGTERM),
                wait_exit, lambda: server.port, busy=lambda: app.busy,
            )  # fmt: skip
    finally:
        server.stop()
        app.middleware.clear()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_IDS = [brokerkit.BrokerURL.parse(u).redacted() for u in REAL_URLS]


@pytest.mark.parametrize("url", REAL_URLS, ids=_IDS)
async def test_the_example_worker_as_a_process_drains_on_sigterm_and_restarts(url: str) -> None:
    queue = f"emails-{os.urandom(6).hex()}"
    port = _free_port()
    procs: list[asyncio.subprocess.Process] = []
    env = {**os.environ, "EMAIL_QUEUE": queue, "BROKERKIT_URL": url}
    args = ["-c", "from brokerkit._cli import main; main()", "run", "examples.email_worker:app",
            "--metrics-port", str(port), "--drain-timeout", "20"]  # fmt: skip

    async def start() -> None:
        procs.append(await asyncio.create_subprocess_exec(sys.executable, *args, cwd=ROOT, env=env))

    async def wait_exit() -> int:
        return await asyncio.wait_for(procs.pop().wait(), 40)

    try:
        async with brokerkit.connect(url) as broker:
            await _run_twice(
                broker, queue, start, lambda: procs[-1].send_signal(signal.SIGTERM), wait_exit,
                lambda: port,
            )  # fmt: skip
            for name in (queue, f"{queue}-sent"):
                await broker.delete_queue(name)
    finally:
        for proc in procs:
            proc.kill()
            await proc.wait()
