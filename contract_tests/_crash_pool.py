"""The consumer processes of the ``crash`` behaviour: spawned, read, SIGKILLed, closed.

Each child runs ``contract_tests._crash_child`` (see its docstring for the events it
prints); a ``Pool`` keeps the children of one queue and group and every event they
print, in one queue. Used by ``test_faults_crash.py`` and by the broker-specific
crash tests in ``tests/integration``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from ._faults import child_env
from ._helpers import SCALE

__all__ = ["START_WAIT", "Child", "Pool"]

START_WAIT = 60.0 * SCALE
"""A child process starts Python, imports the driver and joins the group."""


@dataclass(eq=False)
class Child:
    proc: asyncio.subprocess.Process
    name: str
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    killed_at: float | None = None
    reader: asyncio.Task[None] | None = None


@dataclass
class Pool:
    """Consumer processes of one queue and group; every event they print, in one queue."""

    url: object
    settings: dict[str, Any]
    events: asyncio.Queue[tuple[Child, dict[str, Any]]] = field(default_factory=asyncio.Queue)
    children: list[Child] = field(default_factory=list)

    async def spawn(self) -> Child:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            f"{__package__}._crash_child",  # contract_tests, or brokerkit_contract installed
            json.dumps(self.settings),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,  # a driver's log could name the broker
            env=child_env(self.url),
        )
        child = Child(proc, f"child-{len(self.children)}")
        child.reader = asyncio.ensure_future(self._read(child))
        self.children.append(child)
        return child

    async def _read(self, child: Child) -> None:
        assert child.proc.stdout is not None
        while line := await child.proc.stdout.readline():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("ev") == "ready":
                child.ready.set()
            await self.events.put((child, event))
        await self.events.put((child, {"ev": "exit"}))

    async def ready(self, child: Child) -> None:
        try:
            await asyncio.wait_for(child.ready.wait(), START_WAIT)
        except TimeoutError:
            raise AssertionError(f"{child.name} not ready within {START_WAIT:.0f}s") from None

    def kill(self, child: Child) -> None:
        """SIGKILL: no close, no flush, no nack; the broker finds out by itself."""
        with contextlib.suppress(ProcessLookupError):
            child.proc.send_signal(signal.SIGKILL)
        child.killed_at = time.monotonic()

    def live(self) -> list[Child]:
        return [c for c in self.children if c.killed_at is None and c.proc.returncode is None]

    async def next(self, timeout: float, what: str) -> tuple[Child, dict[str, Any]]:
        try:
            return await asyncio.wait_for(self.events.get(), timeout)
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}") from None

    async def close(self) -> None:
        """Close the children's stdin (they close their consumers and exit); kill stragglers."""
        for child in self.children:
            if child.proc.stdin is not None and child.proc.returncode is None:
                with contextlib.suppress(OSError):
                    child.proc.stdin.close()
        for child in self.children:
            try:
                await asyncio.wait_for(child.proc.wait(), 20)
            except TimeoutError:
                self.kill(child)
                await child.proc.wait()
            if child.reader is not None:
                child.reader.cancel()
