"""Deduplication with every bit of state in RabbitMQ: a ledger stream per queue.

Invariant: for a dedup id ``d``, the message delivered is the one whose record comes
first, in stream order, among the records of ``d`` whose window is still open; every
other copy published inside that window is acked unseen. The stream is one totally
ordered log, so every reader that applies the same rule to it agrees on the winner.

* A publisher stamps each message with its dedup id, publish time and window end
  (``_codec.DEDUP_STAMP_HEADER``); nothing else happens at publish time (``duplicate``
  is None: the publisher cannot tell).
* A receiver tails ``<prefix>.<queue>.ledger`` from ``now - window - 60 s`` on start,
  keeping ``dedup id -> (message id, window end)`` of each id's first open record.
* Before a message with a dedup id is handed out: if the ledger names it, it is a
  redelivery (deliver); if it names another message whose window is open at this
  message's publish time, it is a duplicate (ack, never delivered). Otherwise the
  receiver appends a record for it (publisher confirm), waits until its own tail read
  it back (so every earlier record has been read too), and applies the rule again.

Crash cases: before the append, nothing changed (the message is redelivered and decided
again); after the append but before the ack, the redelivery finds its own record (same
message id: delivered again, at-least-once); a duplicate acked unseen is only ever acked
after the winner's record was confirmed and read back, so a restart rebuilds the same
decision from the stream. Copies racing on several consumers each append; the first
record wins for all of them.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from brokerkit.backends.rabbitmq._link import Link
from brokerkit.backends.rabbitmq._streamlog import StreamLog
from brokerkit.backends.rabbitmq._topology import Topology

__all__ = ["Ledger"]

_HORIZON_MARGIN = 60.0
_PRUNE_EVERY = 1024


class Ledger:
    """The dedup ledger of one queue, as read by one connection."""

    def __init__(self, link: Link, topology: Topology, window: float) -> None:
        self._horizon = window + _HORIZON_MARGIN
        self._first: dict[str, tuple[str, int]] = {}
        self._applied = 0
        self._log = StreamLog(
            link, topology.ledger, start=self._start, apply=self._apply, reset=self._first.clear
        )

    async def admit(self, dedup_id: str, message_id: str, stamp: tuple[int, int] | None) -> bool:
        """True to deliver this message, False for a duplicate inside an open window."""
        published = stamp[0] if stamp else int(time.time() * 1000)
        until = stamp[1] if stamp else published + int(self._horizon * 1000)
        await self._log.started()
        verdict = self._verdict(dedup_id, message_id, published)
        if verdict is not None:
            return verdict
        await self._log.append([{"d": dedup_id, "m": message_id, "t": published, "u": until}])
        verdict = self._verdict(dedup_id, message_id, published)
        return bool(verdict)

    def _verdict(self, dedup_id: str, message_id: str, published: int) -> bool | None:
        first = self._first.get(dedup_id)
        if first is None:
            return None
        if first[0] == message_id:
            return True  # a redelivery of the winner
        if published < first[1]:
            return False  # a duplicate inside the winner's window
        return None  # the window closed: this one needs a record of its own

    def _start(self) -> datetime:
        return datetime.now(UTC) - timedelta(seconds=self._horizon)

    def _apply(self, record: dict[str, Any]) -> None:
        dedup_id, message_id = str(record["d"]), str(record["m"])
        published, until = int(record["t"]), int(record["u"])
        first = self._first.get(dedup_id)
        if first is None or published >= first[1]:
            self._first[dedup_id] = (message_id, until)
        self._applied += 1
        if self._applied % _PRUNE_EVERY == 0:
            self._prune()

    def _prune(self) -> None:
        now = int(time.time() * 1000) - int(_HORIZON_MARGIN * 1000)
        for key in [k for k, (_, until) in self._first.items() if until < now]:
            del self._first[key]

    async def aclose(self) -> None:
        await self._log.aclose()
