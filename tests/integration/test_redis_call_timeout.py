"""``socket_timeout`` bounds every Redis call (``Runner``), not every reply (redis-py).

The client ``from_url`` makes has no per-read socket timeout (an event-loop timer per
reply cost half of a pipeline's time); each try of a call runs under ``socket_timeout``
(plus a blocking command's own wait) instead. Against the shared test Redis
(``BROKERKIT_REDIS_URL``, default 127.0.0.1:6379/0); ``BLPOP`` on a key nobody writes is a
call that answers late without keeping the server busy.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
from _redis import opened_backend, url_with

import brokerkit
from brokerkit.backends import QueueRef
from brokerkit.backends.redis_streams import RedisBackend

TIMEOUT = 0.2


@pytest.fixture
async def backend() -> AsyncIterator[RedisBackend]:
    backend = await opened_backend(url_with(f"socket_timeout={TIMEOUT}"))
    try:
        yield backend
    finally:
        await backend.aclose()


async def test_a_call_that_outlasts_socket_timeout_is_cut_and_no_later_call_reads_its_reply(
    backend: RedisBackend,
) -> None:
    key = f"t-timeout-{uuid.uuid4().hex[:10]}"
    link = backend.link
    # answers (nil) after 0.6 s: every try is cut at 0.2 s (+ a tick), so the call gives up
    # (uncut, it would return None); the unit tests time the cut (test_redis_call_deadlines.py)
    with pytest.raises(brokerkit.BrokerUnavailable, match="did not answer"):
        await link.command("BLPOP", key, 0.6)
    # the cut connections were dropped: every later call reads its own reply, never a late nil
    for i in range(20):
        assert await link.command("ECHO", f"n{i}") == f"n{i}".encode()
    queue = f"t-timeout-{uuid.uuid4().hex[:10]}"
    try:
        results = await backend.publish(
            QueueRef(queue), [brokerkit.Outgoing(b"m%d" % i) for i in range(300)]
        )
        assert len({r.id for r in results}) == 300
    finally:
        await backend.delete_queue(queue)


async def test_a_blocking_command_may_wait_its_own_time_beyond_socket_timeout(
    backend: RedisBackend,
) -> None:
    key = f"t-timeout-{uuid.uuid4().hex[:10]}"
    started = time.monotonic()
    assert await backend.link.command("BLPOP", key, 0.4, wait=0.4) is None
    assert time.monotonic() - started >= 0.4
