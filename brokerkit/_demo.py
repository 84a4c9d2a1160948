"""``brokerkit demo``: a signup service sending verification emails, on any backend."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import brokerkit

MAX_ATTEMPTS = 3
DAVE_STEPS = ["create account", "verify email", "send welcome"]
DEADLINE = 90.0


class StdoutClosed(Exception):
    """The demo's reader went away (``brokerkit demo | head -3``): it stopped and cleaned up."""


@dataclass
class _Story:
    """What the workers saw, to check the scenario and to tell it."""

    started: float = field(default_factory=time.monotonic)
    sent: list[str] = field(default_factory=list)
    dave: list[str] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)
    dead: list[brokerkit.Message] = field(default_factory=list)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    extra: asyncio.Event = field(default_factory=asyncio.Event)
    reader_gone: bool = False

    def update(self) -> None:
        if len(self.sent) >= 6 and len(self.dead) >= 1:
            self.finished.set()
        if len(self.sent) > 6:
            self.extra.set()


def _tell(story: _Story, line: str, out: Callable[[str], None]) -> None:
    """Print a line; a closed output ends the scenario now (nobody is left to read it)."""
    if story.reader_gone:
        return
    try:
        out(line)
    except BrokenPipeError:
        story.reader_gone = True
        story.finished.set()
        story.extra.set()


def _say(story: _Story, text: str, out: Callable[[str], None]) -> None:
    _tell(story, f"[{time.monotonic() - story.started:5.2f}s] {text}", out)


async def run_demo(url: str, out: Callable[[str], None] = print) -> bool:
    """Run the scenario against ``url``; True when everything happened as promised.

    When ``out`` raises ``BrokenPipeError`` the scenario stops at once, deletes its queue
    and raises :class:`StdoutClosed`.
    """
    run = uuid.uuid4().hex[:8]
    queue = f"signup-emails-{run}"
    dave = f"customer-dave-{run}"
    story = _Story()
    async with brokerkit.connect(url) as broker:
        _tell(story, f"brokerkit demo on {broker.url.redacted()}  (queue {queue})", out)
        jobs = [
            brokerkit.Outgoing(b"alice@example.com", dedup_id=f"{run}-alice"),
            brokerkit.Outgoing(b"bob@example.com", dedup_id=f"{run}-bob", headers={"flaky": "2"}),
            brokerkit.Outgoing(b"mallory@@bad", dedup_id=f"{run}-mallory"),
            brokerkit.Outgoing(b"carol@example.com", dedup_id=f"{run}-carol"),
            brokerkit.Outgoing(b"carol@example.com", dedup_id=f"{run}-carol"),  # a double click
        ]
        jobs += [
            brokerkit.Outgoing(f"dave@example.com:{step}".encode(), fifo_group=dave)
            for step in DAVE_STEPS
        ]
        results = await broker.publish_many(queue, jobs)
        dupes = sum(1 for r in results if r.duplicate)
        told = any(r.duplicate is not None for r in results)
        note = f"{dupes} suppressed by dedup id" if told else "duplicates dropped before delivery"
        _say(story, f"producer: enqueued {len(jobs)} jobs ({note})", out)

        handlers: set[asyncio.Task[None]] = set()

        async def worker(name: str) -> None:
            async with broker.consumer(queue, "mailer", max_attempts=MAX_ATTEMPTS) as consumer:
                async for msg in consumer:  # handle concurrently; the iterator keeps yielding
                    task = asyncio.ensure_future(handle(name, msg))
                    handlers.add(task)
                    task.add_done_callback(handlers.discard)

        async def handle(name: str, msg: brokerkit.Message) -> None:
            address = msg.body.decode()
            story.attempts[address] = msg.attempt
            if "@@" in address:
                _say(story, f"{name}: {address!r} is not an address: dead-lettering it", out)
                await msg.dead_letter("invalid email address")
                return
            if int(msg.headers.get("flaky", "0")) >= msg.attempt:
                backoff = 0.25 * 2**msg.attempt
                _say(
                    story,
                    f"{name}: SMTP timeout for {address} (attempt {msg.attempt}); "
                    f"retrying in {backoff:.1f}s",
                    out,
                )
                await msg.nack(delay=backoff)
                return
            await asyncio.sleep(0.05)  # talk to the mail server
            await msg.ack()
            if msg.fifo_group:
                story.dave.append(address.split(":", 1)[1])
            story.sent.append(address)
            story.update()
            _say(story, f"{name}: sent to {address} (attempt {msg.attempt})", out)

        async def dead_reader() -> None:
            async with broker.dead_letters(queue) as dead:
                async for msg in dead:
                    story.dead.append(msg)
                    story.update()
                    info = msg.dead_letter_info
                    reason = info.reason if info else "?"
                    _say(story, f"dlq: {msg.body.decode()!r} is dead ({reason})", out)
                    await msg.ack()

        tasks = [
            asyncio.ensure_future(c)
            for c in (worker("worker-1"), worker("worker-2"), dead_reader())
        ]
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(story.finished.wait(), DEADLINE)
            # a duplicate would show up as a seventh send: give it a moment to appear
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(story.extra.wait(), 1.0)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, *handlers, return_exceptions=True)
        with contextlib.suppress(brokerkit.UnsupportedFeature):
            await broker.delete_queue(queue)  # the demo leaves nothing on your broker

    checks = {
        "alice got one email": story.sent.count("alice@example.com") == 1,
        "bob succeeded on attempt 3 after two nacks with backoff": story.attempts.get(
            "bob@example.com"
        )
        == 3
        and "bob@example.com" in story.sent,
        "mallory is in the DLQ": [m.body for m in story.dead] == [b"mallory@@bad"],
        "carol was published twice and delivered once": story.sent.count("carol@example.com") == 1,
        "dave's jobs ran in order": story.dave == DAVE_STEPS,
    }
    _tell(story, "", out)
    for text, ok in checks.items():
        _tell(story, f"  {'ok ' if ok else 'FAILED'} {text}", out)
    if story.reader_gone:
        raise StdoutClosed
    return all(checks.values())
