"""The ``Delivery`` of each record a receive hands out (``Record``s and runs of plain ones).

Positional construction: this runs once per message.
"""

from __future__ import annotations

from brokerkit.backends import NO_HEADERS, Delivery
from brokerkit.backends.kafka._schedule import Batch, Receipt
from brokerkit.backends.kafka._segments import OPEN

__all__ = ["deliveries"]


def deliveries(batch: Batch) -> list[Delivery[Receipt]]:
    """One ``Delivery`` per record (positional: this runs once per message)."""
    out: list[Delivery[Receipt]] = []
    append = out.append
    for rec, receipt in zip(batch.records, batch.tokens, strict=True):
        part = rec.part
        offset = rec.offset
        extras = part.extras.copy()
        extras["offset"] = offset
        extras["timestamp_ms"] = rec.timestamp
        append(
            Delivery(
                f"{part.partition}-{offset}",
                rec.body,
                dict(rec.headers) if rec.headers else NO_HEADERS,
                rec.fifo_group,
                rec.dedup_id,
                rec.count,
                receipt,
                extras,
                rec.defect,
            )
        )
    for run in batch.runs:
        seg = run.seg
        part = seg.part
        state, msgs, heads, first = seg.state, seg.msgs, seg.heads, seg.first
        shared, prefix = part.extras, f"{part.partition}-"
        origin = run.origin
        for index in range(run.lo, run.hi):
            if state[index] != OPEN:
                continue  # its lease ended while the count commit was on its way
            msg = msgs[index]
            offset = first + index
            extras = shared.copy()
            extras["offset"] = offset
            extras["timestamp_ms"] = msg.timestamp()[1]
            headers = heads[index] if heads is not None else None
            append(
                Delivery(
                    prefix + str(offset),
                    msg.value() or b"",
                    dict(headers) if headers else NO_HEADERS,
                    None,
                    None,
                    1,
                    origin - index,
                    extras,
                )
            )
    return out
