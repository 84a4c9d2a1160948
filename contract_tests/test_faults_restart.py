"""Fault behaviour ``broker restart``: the broker SIGKILLed and started again mid-stream.

Needs a hook: ``--restart-cmd CMD`` (``brokerkit check URL --restart-cmd CMD``), a command
that kills the broker with SIGKILL, starts it again on the same data and returns once
it is ready: ``scripts/services restart NAME`` for our services, ``scripts/throwaway
restart NAME PORT`` for a throwaway broker. Without it the behaviour is "not run".

While one producer publishes (about 100 a second, one at a time) and two consumers on
their own connections ack, CMD runs. Then: every publish that returned is acked in
the end (lost = 0); a publish during the outage returns after recovery or raises
BrokerUnavailable, never hangs (each call bounded); the consumers' iterators never
raise; nothing whose ack returned is delivered again outside the ack-coalescing window
before the kill. Beside the stream, a third consumer holds one message unsettled across
the restart: its lease (and its attempt count) must survive, so it comes back to that
consumer with attempt 2 once the lease ends. Figures: confirmed, delivered, lost,
duplicates, recovery time, and when the held message came back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import pytest

from ._faults import (
    NOT_RUN,
    in_process,
    library_warnings,
    record,
    run_hook,
    secrets_of,
)
from ._helpers import SCALE, WAIT, eventually, receive
from ._proxy import first_address
from ._stream import AFTER_RECOVERY, KILL_GRACE, Stream, violations
from .conftest import Connect

ACK_TIMEOUT = 5.0
BEFORE = 50
"""Messages acked before the fault: the stream is flowing."""
AFTER = 30
"""Messages confirmed after the broker is back."""
TEARDOWN = 1.0
"""Longest a killed broker's port is taken to accept connections after its last answer."""


@pytest.mark.behaviour("broker restart")
async def test_broker_killed_and_restarted_mid_stream_loses_nothing_confirmed(
    broker_url: object,
    connect: Connect,
    queue: str,
    group: str,
    new_queue: Callable[[str | None], str],
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    command = request.config.getoption("--restart-cmd")
    if in_process(broker_url):
        pytest.skip(NOT_RUN + "memory:// is in-process: there is no broker process to restart")
    if not command:
        pytest.skip(
            NOT_RUN + "needs --restart-cmd CMD (a command that SIGKILLs the broker and "
            "starts it on the same data, e.g. 'scripts/services restart redis')"
        )
    timeout = float(request.config.getoption("--restart-timeout"))
    started = time.monotonic()
    producer = await connect()
    slack = producer.capabilities.redelivery_slack
    flush = producer.capabilities.ack_flush_interval
    consumers = [
        (await connect()).consumer(queue, group, ack_timeout=ACK_TIMEOUT, close_timeout=1.0)
        for _ in range(2)
    ]
    for consumer in consumers:
        await consumer.open()
    held_queue = new_queue(None)
    await producer.publish(held_queue, b"held")
    holder = (await connect()).consumer(held_queue, group, ack_timeout=ACK_TIMEOUT)
    await holder.open()
    held = await receive(holder)  # never settled: its lease must outlive the restart
    assert (held.body, held.attempt) == (b"held", 1)
    held_back: float | None = None
    stream = Stream(producer, consumers, queue, bound=timeout + AFTER_RECOVERY)
    stream.redelivered_within = ACK_TIMEOUT + slack + 2.0
    stream.start()
    timed_out = ""
    fault_start = fault_end = time.monotonic()
    killed: tuple[float, float] | None = None  # the kill happened in (last open, refused]
    hook_s, hook_said = 0.0, ""
    try:
        await eventually(
            lambda: len(stream.acked()) >= BEFORE or bool(stream.iterator_errors),
            timeout=WAIT * 3,
            what=f"{BEFORE} messages acked before the restart",
        )
        fault_start = time.monotonic()
        down = asyncio.ensure_future(_first_refusal(str(broker_url)))
        try:
            hook_s, hook_said = await asyncio.to_thread(
                run_hook, command, timeout, secrets_of(broker_url)
            )
        finally:
            killed = down.result() if down.done() else None
            down.cancel()
        fault_end = stream.fault_end = time.monotonic()
        try:
            await eventually(
                lambda: stream.confirmed_after(fault_end) >= AFTER or bool(stream.iterator_errors),
                timeout=AFTER_RECOVERY * 2,
                what=f"{AFTER} publishes confirmed after the restart",
            )
            again = await receive(holder, AFTER_RECOVERY * 2 + ACK_TIMEOUT + slack)
            held_back = time.monotonic() - fault_end
            assert (again.body, again.attempt) == (b"held", 2), (
                f"the message held across the restart came back as {again.body!r} with "
                f"attempt {again.attempt} (want attempt 2: the lease and its count survive)"
            )
            await again.ack()
            await stream.stop_publishing()
            await eventually(
                lambda: stream.all_acked() or bool(stream.iterator_errors),
                timeout=AFTER_RECOVERY * 2 + ACK_TIMEOUT + slack,
                what="every confirmed message acked",
            )
            # an observation window: anything acked that still comes back shows up here
            seen = sum(len(d) for d in stream.deliveries.values())
            await eventually(
                lambda: sum(len(d) for d in stream.deliveries.values()) > seen,
                timeout=(ACK_TIMEOUT + slack + 1.0) * SCALE,
                what="(no stray redelivery: this wait is expected to time out)",
            )
        except AssertionError as exc:
            timed_out = str(exc)
    finally:
        await stream.close()
        for consumer in [*consumers, holder]:
            await asyncio.wait_for(consumer.aclose(), WAIT)
    # the coalescing window is measured around the kill itself when it was seen (the
    # broker's port refused a connection): a hook may take a while before it kills (an
    # interpreter starting on a loaded machine took about 1.5 s); else around the hook's
    # first KILL_GRACE seconds. The kill is known only to lie between the broker's last
    # sign of life and the first connection its port refused: an ack is in the window if
    # it is in the window of some kill time in that interval. The last sign of life is
    # its last answer (a publish confirmed), not the last connection the port accepted:
    # the kernel keeps accepting them for a killed process until its memory is torn
    # down, which took 0.2-0.4 s on a loaded machine after the broker (Kafka's JVM) had
    # stopped answering (its commits went unanswered; acks coalesced 0.2 s before the
    # port closed came back). At most TEARDOWN before the last accepted connection: a
    # broker silent for longer than that before its kill would hide lost acks
    port_open_after_answer: float | None = None
    if killed is not None:
        last_open, refused = killed
        last_answer = stream.last_answer_before(refused)
        alive = last_open if last_answer is None else min(last_open, last_answer)
        alive = max(alive, last_open - TEARDOWN)
        if last_answer is not None:
            port_open_after_answer = last_open - last_answer
        figures = stream.figures(alive, fault_end, flush, refused - alive)
    else:
        figures = stream.figures(fault_start, fault_end, flush, KILL_GRACE)
    figures.update(
        scheme=str(broker_url).split(":", 1)[0],
        hook_s=round(hook_s, 2),
        killed_after_s=None if killed is None else round(killed[1] - fault_start, 2),
        kill_seen_within_s=None if killed is None else round(killed[1] - killed[0], 3),
        port_open_after_last_answer_s=(
            None if port_open_after_answer is None else round(port_open_after_answer, 3)
        ),
        held_redelivered_s=None if held_back is None else round(held_back, 2),
        seconds=round(time.monotonic() - started, 1),
        hook_said=hook_said.splitlines()[-3:],
        warnings=library_warnings(caplog.records),
    )
    record(request, "broker restart", figures)
    problems = violations(figures)
    if timed_out and "expected to time out" not in timed_out:
        problems.append(timed_out)
    assert not problems, f"{problems}; figures: {figures}"


async def _first_refusal(url: str, every: float = 0.02) -> tuple[float, float] | None:
    """When the broker's first host last accepted and then first refused a TCP connection
    (its process died in between), by polling while the restart hook runs; None for a URL
    without a host (cancelled: the result so far is lost, so the caller reads it only
    when it finished)."""
    address = first_address(url)
    if address is None:
        return None
    host, port = address
    last_open = time.monotonic()
    while True:
        tried = time.monotonic()
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
        except (OSError, TimeoutError):
            return last_open, tried
        last_open = time.monotonic()
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        await asyncio.sleep(every)
