"""The operator commands end to end on every real broker, as an operator runs them.

``python -m brokerkit publish / peek / dlq / redrive / stats`` in subprocesses from the
repository root (so they import this checkout), against each URL of ``BROKERKIT_URLS``
(comma-separated, as for the contract suite; the shared local Redis, NATS and Kafka when
unset). memory:// is skipped: it lives in one process, and each command is its own.
The message is dead-lettered through the API in between, as a failing service would.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import brokerkit

ROOT = Path(__file__).resolve().parents[2]
LOCAL = "redis://127.0.0.1:6379/0,nats://127.0.0.1:4222,kafka://127.0.0.1:9092"
URLS = [
    u.strip()
    for u in os.environ.get("BROKERKIT_URLS", LOCAL).split(",")
    if u.strip() and not u.strip().startswith("memory:")
]
WAIT = 20.0 * float(os.environ.get("BROKERKIT_TIMEOUT_SCALE", "1"))


def _redact(url: str, text: str) -> str:
    return brokerkit.BrokerURL.parse(url).redact(text)


def _run(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m brokerkit ARGS`` (the URL first) from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "brokerkit", args[0], url, *args[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "BROKERKIT_URL": ""},
    )


def cli(url: str, *args: str) -> str:
    """A command that must succeed; its standard output."""
    done = _run(url, *args)
    assert done.returncode == 0, _redact(url, f"{args}: {done.stdout}\n{done.stderr}")
    return done.stdout


def cli_refuses(url: str, *args: str) -> str:
    """A command that must fail with a clear message (exit 1, no traceback)."""
    done = _run(url, *args)
    assert done.returncode == 1, _redact(url, f"{args}: {done.stdout}\n{done.stderr}")
    assert "Traceback" not in done.stderr, _redact(url, done.stderr)
    return done.stderr


def counts(ready: int, dead: int) -> Callable[[dict[str, Any]], bool]:
    """``stats`` shows ``ready`` and ``dead`` (a figure the backend cannot tell is None)."""
    return lambda s: s["ready"] in (ready, None) and s["dead"] in (dead, None)


def stats_until(url: str, queue: str, check: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """``stats --json`` until ``check`` holds (an ack may be coalesced for a moment)."""
    deadline = time.monotonic() + WAIT
    while True:
        figures: dict[str, Any] = json.loads(cli(url, "stats", queue, "--json"))[queue]
        if check(figures):
            return figures
        assert time.monotonic() < deadline, f"stats of {queue!r} stayed {figures}"
        time.sleep(0.2)


async def _dead_letter_one(url: str, queue: str) -> str:
    async with brokerkit.connect(url) as broker:
        async with broker.consumer(queue, prefetch=1) as consumer:
            msg = await asyncio.wait_for(consumer.__anext__(), WAIT)
            assert msg.attempt == 1, "peek counted a delivery"
            await msg.dead_letter("bad address")
            return msg.id


async def _delete(url: str, queue: str) -> None:
    async with brokerkit.connect(url) as broker:
        await broker.delete_queue(queue)


@pytest.mark.parametrize("url", URLS, ids=[brokerkit.BrokerURL.parse(u).redacted() for u in URLS])
def test_publish_peek_dead_letter_dlq_redrive_stats(url: str) -> None:
    queue = f"opscli-{uuid.uuid4().hex[:12]}"
    try:
        try:
            published = json.loads(cli(url, "publish", queue, "hello", "-H", "k=v", "--json"))
        except AssertionError as exc:
            if "BrokerUnavailable" in str(exc) or "unavailable" in str(exc).lower():
                pytest.skip(_redact(url, f"no broker: {exc}"))
            raise
        browse = brokerkit.connect(url).capabilities.browse
        if browse:
            [shown] = json.loads(cli(url, "peek", queue, "--json"))
            assert shown["id"] == published["id"]
            assert (shown["body"], shown["headers"]) == ({"text": "hello"}, {"k": "v"})
            assert "hello" in cli(url, "peek", queue)
        else:  # refused clearly, never a destructive read
            for command in (("peek", queue), ("dlq", queue), ("peek", queue, "--dlq")):
                assert "UnsupportedFeature" in cli_refuses(url, *command)
        stats_until(url, queue, counts(1, 0))

        dead_id = asyncio.run(_dead_letter_one(url, queue))
        assert dead_id == published["id"]
        if browse:
            [dead] = json.loads(cli(url, "dlq", queue, "--json"))
            assert dead["dead_letter"]["reason"] == "bad address"
            assert dead["dead_letter"]["original_id"] == published["id"]
            assert "reason='bad address'" in cli(url, "dlq", queue)
            twice = [cli(url, "peek", queue, "--dlq", "--json") for _ in range(2)]
            assert twice[0] == twice[1], "peek --dlq changed the DLQ"
            assert [d["dead_letter"]["attempts"] for d in json.loads(twice[0])] == [1]
            assert json.loads(cli(url, "peek", queue, "--json")) == []
        stats_until(url, queue, counts(0, 1))

        assert "moved 1 message(s)" in cli(url, "redrive", queue, "--yes")
        stats_until(url, queue, counts(1, 0))
        if browse:
            assert json.loads(cli(url, "dlq", queue, "--json")) == []
            [back] = json.loads(cli(url, "peek", queue, "--json"))
            assert (back["body"], back["headers"]) == ({"text": "hello"}, {"k": "v"})
    finally:
        asyncio.run(_delete(url, queue))


@pytest.mark.parametrize("url", [u for u in URLS if u.startswith(("redis", "nats"))])
def test_bench_raw_prints_the_raw_clients_figures_beside_brokerkits(url: str) -> None:
    out = cli(url, "bench", "--messages", "300", "--rounds", "2", "--raw")
    for series in ("publish", "consume+ack"):
        [ours] = [line for line in out.splitlines() if line.split()[:2] == [series, "median"]]
        [raw] = [line for line in out.splitlines() if line.split()[:2] == [series, "(raw)"]]
        assert "min" in ours and "max" in ours and "brokerkit/raw" in raw, out
