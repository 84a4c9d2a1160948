"""A stream of publishes and consumers that a fault is thrown at (broker restart, network cut).

One producer connection publishes one message at a time, paced, each call bounded by
``asyncio.wait_for``; two consumers, each on its own connection, iterate and ack. The
stream records, per message body, when its publish returned (or how it failed), every
delivery and every ack, so the fault tests can assert and report:

* every publish that returned is acked by a consumer in the end (``lost`` must be 0),
  or was handled and its ``ack()`` raised and it never came back (``ack_raised_kept``):
  an ack that raises has an unknown outcome (the contract says the message *may* be
  delivered again). Over a cut longer than the client's patience, the ack's bytes wait
  in the cut path and reach the broker when it is restored: the broker records the ack
  the client gave up on (seen on Redis, NATS and RabbitMQ with 20 s cuts, 2026-12-03).
  It counts only once ``redelivered_within`` seconds passed after that ack with no
  delivery: had the broker not recorded it, the lease would have run out by then;
* a publish during the outage returns or raises ``BrokerUnavailable``: never hangs
  (bounded), never raises anything else;
* the consumers keep iterating by themselves (their iterator never raises, and an
  ``ack()`` raises only the errors the contract names);
* nothing whose ``ack()`` returned is delivered again, except an ack that returned within
  ``capabilities.ack_flush_interval`` of the moment the broker became unreachable (the
  documented coalescing window; for a restart hook, its first ``KILL_GRACE`` seconds).

A publish *in flight at the fault* (called before it, returned after it) may have been
stored before the fault and sent again after it, its confirm lost (the contract promises
no dedup without a ``dedup_id``). A second copy of such a message, delivered after the
first was acked, is reported as ``published_twice``, not as an acked message that came
back. On RabbitMQ (no broker-side dedup of a resend) this was the cause of every
"acked message came back" seen in broker restart runs: the message of the one publish in
flight at the kill, delivered and acked after the restart, then delivered again when that
publish was resent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import brokerkit

from ._helpers import SCALE

PACE = 0.01
"""Seconds between two publishes of the stream (about 100 messages a second)."""
AFTER_RECOVERY = 30.0 * SCALE
"""A publish blocked by the outage must end at most this long after the broker is back."""
OVERLAP = 0.5
"""A second delivery this soon after the first one's ack returned is an overlap, not a
lost ack: the broker's lease ran out while the message sat in the cut network (its
clock starts when it sends), so it sent it again while the first holder was still
acking. Reported as ``overlapping_redeliveries``; a lost ack shows up a lease later."""
KILL_GRACE = 1.0
"""The restart hook kills the broker within this long of starting (acks that returned
before it may be lost with the broker, within the coalescing window)."""


def _where(exc: BaseException) -> str:
    """The type and where it was raised (file:line; no message: it could carry a broker
    address)."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    at = " < ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in reversed(frames))
    return f"{type(exc).__name__} at {at}" if at else type(exc).__name__


class LoopLag:
    """How late the event loop ran, sampled every ``EVERY`` s: an ack's commit that the
    backend sends from a loop timer (a coalesced ack) goes out late by as much, so a lost
    ack is reported with the lag between its return and the kill (a figure, not an
    excuse: the verdict does not change)."""

    EVERY = 0.01

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []  # (when, how late)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(self.EVERY)
            self.samples.append((before, time.monotonic() - before - self.EVERY))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def worst(self, start: float, end: float) -> float:
        """The largest lateness of a sample that began in [start, end]."""
        return max((late for t, late in self.samples if start <= t <= end), default=0.0)


@dataclass
class Publish:
    started: float
    ended: float | None = None
    outcome: str = "pending"  # "ok", "unavailable", "hung", or an error type name


@dataclass
class Stream:
    producer: brokerkit.Broker
    consumers: list[brokerkit.Consumer]
    queue: str
    hold: float = 0.0
    """Seconds each handler holds a message before it acks (to be caught mid-ack)."""
    pace: float = PACE
    """Seconds between two publishes (keep it above hold / consumers: no backlog)."""
    bound: float = 120.0
    """Longest a single publish call may take before it counts as a hang."""
    redelivered_within: float = 30.0
    """A message whose ack raised comes back within this long if the broker did not
    record the ack (its lease, plus the backend's redelivery slack, plus a margin),
    counted from the ack or from ``fault_end``, whichever is later."""
    fault_end: float = 0.0
    """When the broker was reachable again (set by the test: no redelivery can arrive
    through a cut path)."""
    publishes: dict[str, Publish] = field(default_factory=dict)
    deliveries: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    acks: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # (t, "ok"|type)
    iterator_errors: list[str] = field(default_factory=list)
    paused: asyncio.Event = field(default_factory=asyncio.Event)  # set: publisher paused
    lag: LoopLag = field(default_factory=LoopLag)
    _stop: bool = False
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self.lag.start()
        self._tasks.append(asyncio.ensure_future(self._publisher()))
        for consumer in self.consumers:
            self._tasks.append(asyncio.ensure_future(self._consume(consumer)))

    async def _publisher(self) -> None:
        i = 0
        while not self._stop:
            if self.paused.is_set():
                await asyncio.sleep(self.pace)
                continue
            body = f"m{i:06d}"
            i += 1
            record = self.publishes[body] = Publish(time.monotonic())
            try:
                await asyncio.wait_for(self.producer.publish(self.queue, body.encode()), self.bound)
                record.outcome = "ok"
            except brokerkit.BrokerUnavailable:
                record.outcome = "unavailable"
            except TimeoutError:
                record.outcome = "hung"
            except brokerkit.BrokerkitError as exc:
                record.outcome = type(exc).__name__
            record.ended = time.monotonic()
            await asyncio.sleep(self.pace)

    async def _consume(self, consumer: brokerkit.Consumer) -> None:
        try:
            async for msg in consumer:
                body = msg.body.decode()
                self.deliveries.setdefault(body, []).append((time.monotonic(), msg.attempt))
                if self.hold:
                    await asyncio.sleep(self.hold)  # the handler's work
                try:
                    await msg.ack()
                except brokerkit.BrokerkitError as exc:
                    self.acks.setdefault(body, []).append((time.monotonic(), type(exc).__name__))
                except Exception as exc:  # not an error the contract names: ends the loop
                    self.iterator_errors.append(f"ack() raised {_where(exc)}")
                    return
                else:
                    self.acks.setdefault(body, []).append((time.monotonic(), "ok"))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.iterator_errors.append(_where(exc))

    async def stop_publishing(self) -> None:
        self._stop = True
        publisher = self._tasks[0]
        await asyncio.wait([publisher], timeout=self.bound + 5)

    async def close(self) -> None:
        self._stop = True
        self.lag.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # ---- what happened

    def confirmed(self) -> set[str]:
        return {b for b, p in self.publishes.items() if p.outcome == "ok"}

    def last_answer_before(self, t: float) -> float | None:
        """When the broker last confirmed a publish before ``t``: the latest moment it is
        known to have been alive (None if it confirmed nothing before ``t``)."""
        ends = [
            p.ended for p in self.publishes.values()
            if p.outcome == "ok" and p.ended is not None and p.ended < t
        ]  # fmt: skip
        return max(ends, default=None)

    def acked(self) -> set[str]:
        return {b for b, acks in self.acks.items() if any(r == "ok" for _, r in acks)}

    def confirmed_after(self, t: float) -> int:
        return sum(1 for p in self.publishes.values() if p.outcome == "ok" and p.started > t)

    def ack_raised_kept(self) -> set[str]:
        """Handled, every ``ack()`` raised, and not delivered again for
        ``redelivered_within`` s after the last one (or after ``fault_end``): the broker
        recorded that ack."""
        now = time.monotonic()
        kept = set()
        for body, acks in self.acks.items():
            if any(r == "ok" for _, r in acks):
                continue
            last_ack = max(t for t, _ in acks)
            last_delivery = max(t for t, _ in self.deliveries.get(body, [(0.0, 0)]))
            quiet_since = max(last_ack, self.fault_end)
            if last_delivery < last_ack and now - quiet_since >= self.redelivered_within:
                kept.add(body)
        return kept

    def all_acked(self) -> bool:
        return self.confirmed() <= self.acked() | self.ack_raised_kept()

    def count(self, predicate: Callable[[Publish], bool]) -> int:
        return sum(1 for p in self.publishes.values() if predicate(p))

    def figures(
        self, fault_start: float, fault_end: float, flush: float, kill_grace: float
    ) -> dict[str, Any]:
        """The figures of one fault run, and the violations among them."""
        confirmed = self.confirmed()
        acked = self.acked()
        kept = self.ack_raised_kept()
        redelivered_in_window, redelivered_after_ack, overlapping = [], [], []
        published_twice = []
        in_flight = {  # publish called before the fault and returned after it (or never)
            b
            for b, p in self.publishes.items()
            if p.started < fault_start + kill_grace and (p.ended is None or p.ended > fault_start)
        }
        duplicates = 0
        for body, seen in self.deliveries.items():
            duplicates += len(seen) - 1
            ok_acks = [t for t, r in self.acks.get(body, []) if r == "ok"]
            if not ok_acks:
                continue
            first_ok = min(ok_acks)
            again = [t for t, _ in seen if t > first_ok]
            if not again:
                continue
            if min(again) - first_ok < OVERLAP:
                overlapping.append(body)
                continue
            if body in in_flight:  # stored before the fault, resent after it
                published_twice.append(body)
                continue
            # the coalescing window around the moment the broker became unreachable
            if fault_start - flush - 0.05 <= first_ok <= fault_start + kill_grace + flush + 0.05:
                redelivered_in_window.append(body)
            else:
                lag = self.lag.worst(first_ok - 0.5, fault_start + kill_grace)
                redelivered_after_ack.append(
                    f"{body} (acked at {first_ok - fault_start:+.2f}s, "
                    f"again {min(again) - first_ok:.2f}s later; loop late by up to {lag:.2f}s)"
                )
        late = [
            b
            for b, p in self.publishes.items()
            if p.ended is not None and p.ended - max(p.started, fault_end) > AFTER_RECOVERY
        ]
        after = [p for b, p in self.publishes.items() if p.started >= fault_end and b in acked]
        first_after = min(
            (min(t for t, _ in self.deliveries[b]) for b, p in self.publishes.items()
             if p.started >= fault_end and b in self.deliveries),
            default=None,
        )  # fmt: skip
        durations = [p.ended - p.started for p in self.publishes.values() if p.ended is not None]
        ack_errors = sum(1 for acks in self.acks.values() for _, r in acks if r != "ok")
        return {
            "published": len(self.publishes),
            "confirmed": len(confirmed),
            "unavailable": self.count(lambda p: p.outcome == "unavailable"),
            "hung": self.count(lambda p: p.outcome == "hung"),
            "publish_errors": sorted(
                {p.outcome for p in self.publishes.values()} - {"ok", "unavailable", "hung"}
            ),
            "publish_max_s": round(max(durations, default=0.0), 2),
            "published_late": len(late),
            "delivered": len(self.deliveries),
            "lost": len(confirmed - acked - kept),
            "lost_examples": sorted(confirmed - acked - kept)[:5],
            "ack_raised_kept": len(kept),
            "loop_late_max_s": round(self.lag.worst(fault_start - 2, fault_start + kill_grace), 3),
            "duplicates": duplicates,
            "ack_errors": ack_errors,
            "acked_redelivered_in_window": len(redelivered_in_window),
            "acked_redelivered_outside_window": len(redelivered_after_ack),
            "acked_redelivered_examples": sorted(redelivered_after_ack)[:5],
            "overlapping_redeliveries": len(overlapping),
            "published_twice": sorted(published_twice),
            "iterator_errors": self.iterator_errors,
            "outage_s": round(fault_end - fault_start, 2),
            "recovery_s": None if first_after is None else round(first_after - fault_end, 2),
            "confirmed_after_fault": len(after),
        }


def violations(figures: dict[str, Any]) -> list[str]:
    """What the contract forbids under a fault, from ``Stream.figures``."""
    out = []
    if figures["lost"]:
        out.append(f"{figures['lost']} confirmed messages never acked: {figures['lost_examples']}")
    if figures["hung"] or figures["published_late"]:
        out.append(
            f"publishes hung: {figures['hung']} past the bound, {figures['published_late']} "
            f"ended more than {AFTER_RECOVERY:.0f}s after recovery"
        )
    if figures["publish_errors"]:
        out.append(f"publish raised other than BrokerUnavailable: {figures['publish_errors']}")
    if figures["iterator_errors"]:
        out.append(f"a consumer's loop raised (no recovery): {figures['iterator_errors']}")
    if figures["acked_redelivered_outside_window"]:
        out.append(
            f"{figures['acked_redelivered_outside_window']} messages whose ack() returned "
            f"outside the coalescing window came back: {figures['acked_redelivered_examples']}"
        )
    if figures["recovery_s"] is None:
        out.append("nothing published after the fault was delivered")
    return out
