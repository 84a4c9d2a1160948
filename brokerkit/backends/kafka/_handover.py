"""Acks that meet a revoke: the revoke's final commit records them.

While a partition is revoked, the consumer thread sits in ``on_revoke`` until the
partition's leased records are settled (``KafkaReceiver.revoke``). A synchronous ack
cannot send its commit to that thread: the commit would wait behind the revoke that
waits for the ack. So an ack of a record of a revoking partition settles the record in
memory at once, which ends the wait and puts the settle into the final snapshot, and
returns when the revoke's final commit recorded it (LeaseExpired if it did not). A
synchronous ack already waiting for its own commit when the revoke begins is taken over
the same way (``begin`` settles it and hands it the final commit's future).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence

from brokerkit.backends import LeaseExpired
from brokerkit.backends.kafka._partition import Key, Partition
from brokerkit.backends.kafka._schedule import Receipt

__all__ = ["Handover", "Taken"]

Taken = asyncio.Future[asyncio.Future[bool]]
"""Resolved by a revoke that took a waiting synchronous ack over: its final commit."""


class Handover:
    """The final commits of partitions being revoked, and the synchronous acks waiting."""

    def __init__(self, loop: asyncio.AbstractEventLoop, settle: Callable[[Receipt, float], object]):
        self._loop = loop
        self._settle = settle
        self._finals: dict[Key, asyncio.Future[bool]] = {}
        """Per partition being revoked: whether its final commit recorded its state."""
        self._acking: dict[Receipt, tuple[Partition, float, Taken]] = {}

    def begin(self, parts: Sequence[Partition]) -> None:
        """A revoke of ``parts`` begins: settle the records whose acks wait for a commit."""
        for part in parts:
            self._finals[part.key] = self._loop.create_future()
        for receipt, (part, at, taken) in list(self._acking.items()):
            if part in parts and not taken.done():
                with contextlib.suppress(LeaseExpired):  # lost: its own commit path says so
                    self._settle(receipt, at)  # ``at``: when the ack was called
                    taken.set_result(self._finals[part.key])

    def final(self, key: Key) -> asyncio.Future[bool] | None:
        """The final commit of ``key`` while it is being revoked, else None."""
        return self._finals.get(key)

    def ended(self, keys: Sequence[Key], committed: set[Key]) -> None:
        """The revoke's final commit is over (``committed``: the keys it recorded)."""
        for key in keys:
            final = self._finals.pop(key, None)
            if final is not None and not final.done():
                final.set_result(key in committed)

    def end_all(self) -> None:
        self.ended(list(self._finals), set())

    @contextlib.contextmanager
    def acking(self, part: Partition, receipt: Receipt, at: float) -> Iterator[Taken]:
        """While a synchronous ack waits for its commit: a revoke may take it over."""
        taken: Taken = self._loop.create_future()
        self._acking[receipt] = (part, at, taken)
        try:
            yield taken
        finally:
            del self._acking[receipt]

    @staticmethod
    async def recorded(message_id: str, final: asyncio.Future[bool], wait: float) -> None:
        """Return once the final commit recorded the settled record, else LeaseExpired."""
        try:
            ok = await asyncio.wait_for(asyncio.shield(final), wait)
        except TimeoutError:
            ok = False
        if not ok:
            raise LeaseExpired(
                f"message {message_id!r}: its partition moved before the ack was recorded"
            )
