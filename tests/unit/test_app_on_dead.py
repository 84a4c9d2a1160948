"""The App's ``on_dead`` hook on a ``Reject``: once per message that reached the DLQ, never
for a move that failed (memory://'s ``fail_publishes`` refuses the DLQ on demand).

Planted and caught: ``_dead`` calling the hook whatever the settle's outcome (a failed
move reported dead); the ``Reject`` path dead-lettering without the hook; the hook
handed another exception than the handler's.
"""

from __future__ import annotations

import asyncio

import brokerkit
from brokerkit.backends.memory import fail_publishes
from brokerkit.testing import assert_dead_lettered, memory_url, run_until_idle


def _app(url: str, calls: list[bytes], dead: list[tuple[bytes, BaseException]]) -> brokerkit.App:
    app = brokerkit.App(url)

    def on_dead(msg: brokerkit.Message, exc: BaseException) -> None:
        dead.append((msg.body, exc))

    @app.handler("jobs", ack_timeout=0.5, retry=brokerkit.RetryPolicy(on_dead=on_dead))
    async def work(body: bytes) -> None:
        calls.append(body)
        raise brokerkit.Reject(f"no thanks: {body.decode()}")

    return app


async def test_on_dead_is_called_once_with_the_reject_for_a_rejected_message() -> None:
    url, calls, dead = memory_url(), [], []
    app = _app(url, calls, dead)
    async with brokerkit.connect(url) as broker:
        await broker.publish("jobs", b"a")
        await run_until_idle(app)
        msg = await assert_dead_lettered(broker, "jobs", reason="no thanks: a")
    assert calls == [b"a"]
    assert [body for body, _ in dead] == [b"a"]
    exc = dead[0][1]
    assert isinstance(exc, brokerkit.Reject) and exc.reason == "no thanks: a"
    assert msg.dead_letter_info is not None and msg.dead_letter_info.attempts == 1


async def test_on_dead_is_not_called_for_a_move_the_dlq_refused() -> None:
    """The first move fails (the DLQ refuses it): no hook; the message comes back after
    its lease, is rejected again and moved: one hook call, one dead letter."""
    url, calls, dead = memory_url(), [], []
    app = _app(url, calls, dead)
    name = url.removeprefix("memory://")
    async with brokerkit.connect(url) as broker:
        await broker.publish("jobs", b"b")
        fail_publishes(name, "jobs", 1, dead_letters=True)
        await run_until_idle(app, idle=1.5)
        await assert_dead_lettered(broker, "jobs", reason="no thanks: b")
        async with broker.dead_letters("jobs", prefetch=1) as more:
            assert await _nothing(more), "the refused move left a copy in the DLQ"
    assert calls == [b"b", b"b"]
    assert [body for body, _ in dead] == [b"b"]


async def _nothing(consumer: brokerkit.Consumer, seconds: float = 0.5) -> bool:
    try:
        await asyncio.wait_for(consumer.__anext__(), seconds)
    except TimeoutError:
        return True
    return False
