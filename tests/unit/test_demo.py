"""``brokerkit demo`` on the in-memory backend: the story holds and nothing is left behind."""

from __future__ import annotations

from brokerkit._demo import run_demo
from brokerkit.backends.memory import _Hub


async def test_demo_passes_every_check_and_deletes_its_queue() -> None:
    lines: list[str] = []
    assert await run_demo("memory://demo-test", out=lines.append), "\n".join(lines)
    assert any("ok  mallory is in the DLQ" in line for line in lines)
    assert _Hub.named("demo-test").queues == {}  # delete_queue ran
