"""Names and arguments of every RabbitMQ object one brokerkit queue is made of.

Pure data, no I/O. For queue ``Q`` and prefix ``P`` (default ``brokerkit``):

======================  ==========  ====================================================
``P.Q``                 quorum      messages without a fifo_group (competing consumers)
``P.Q.p.<i>``           quorum+SAC  partition ``i`` of ``N``: fifo_group ``g`` lives in
                                    ``crc32(g) % N``; ``x-single-active-consumer``
``P.Q.dlq``             quorum      the dead-letter queue
``P.Q.ledger``          stream      dedup ledger: the first record of an id wins
``P.Q.attempts``        stream      attempt book: hand-outs of redeliveries (``_attempts``)
``P.Q.meta``            classic     marker: ``x-dead-letter-routing-key=partitions=N``
``P.Q.owner``           classic     marker: the one consumer group of the queue
``P.Q.dlq.owner``       classic     marker: the one consumer group of the DLQ
======================  ==========  ====================================================

Every quorum queue carries ``x-delivery-limit`` = ``DELIVERY_LIMIT`` (2**31 - 1): the
facade dead-letters at ``max_attempts``, so the broker must never drop or dead-letter a
message behind its back (4.0+ would otherwise apply a default limit of 20), and with a
limit set a quorum queue puts a returned message at the head (3.10 without one puts it
at the back, which would break FIFO order). Marker queues hold no messages
(``x-max-length=0``, ``x-overflow=reject-publish``); their value sits in an argument that
RabbitMQ compares on every redeclare, so the first declare wins atomically and a later,
different one fails with PRECONDITION_FAILED naming the stored value.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DELIVERY_LIMIT",
    "MARKER_EXCHANGE",
    "Topology",
    "marker_arguments",
    "partition_of",
]

DELIVERY_LIMIT = 2**31 - 1
MARKER_EXCHANGE = "brokerkit-marker"
"""The dead-letter exchange named by marker queues: never declared, never used."""

STREAM_MAX_AGE = "7D"
"""Retention of the ledger and attempts streams (dedup windows are at most a day; a
redelivery's attempt count is remembered this long)."""


def partition_of(fifo_group: str, partitions: int) -> int:
    """The partition a fifo_group lives in: ``crc32(utf-8 group) % partitions``."""
    return zlib.crc32(fifo_group.encode()) % partitions


def quorum_arguments(*, single_active: bool) -> dict[str, Any]:
    args: dict[str, Any] = {"x-queue-type": "quorum", "x-delivery-limit": DELIVERY_LIMIT}
    if single_active:
        args["x-single-active-consumer"] = True
    return args


def stream_arguments() -> dict[str, Any]:
    return {"x-queue-type": "stream", "x-max-age": STREAM_MAX_AGE}


def marker_arguments(value: str) -> dict[str, Any]:
    return {
        "x-dead-letter-exchange": MARKER_EXCHANGE,
        "x-dead-letter-routing-key": value,
        "x-max-length": 0,
        "x-overflow": "reject-publish",
    }


@dataclass(frozen=True, slots=True)
class Topology:
    """The RabbitMQ names of one brokerkit queue."""

    prefix: str
    queue: str

    @property
    def base(self) -> str:
        return f"{self.prefix}.{self.queue}"

    @property
    def free(self) -> str:
        return self.base

    def partition(self, index: int) -> str:
        return f"{self.base}.p.{index}"

    @property
    def dlq(self) -> str:
        return f"{self.base}.dlq"

    @property
    def ledger(self) -> str:
        return f"{self.base}.ledger"

    @property
    def attempts(self) -> str:
        return f"{self.base}.attempts"

    @property
    def meta(self) -> str:
        return f"{self.base}.meta"

    def owner(self, dead_letters: bool) -> str:
        return f"{self.dlq}.owner" if dead_letters else f"{self.base}.owner"

    def everything(self, partitions: int) -> list[str]:
        """Every queue of the design, for ``delete_queue``."""
        return [
            self.free,
            *(self.partition(i) for i in range(partitions)),
            self.dlq,
            self.ledger,
            self.attempts,
            self.meta,
            self.owner(False),
            self.owner(True),
        ]
