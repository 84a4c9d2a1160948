"""Wire names shared by every backend: the reserved header prefix and the header names
that carry a message's fifo_group, dedup id and packed user headers where a broker has
no native field for them. Defined once, so a message written by one backend's code reads
the same in every other tool (browse, redrive, operators' consoles)."""

from __future__ import annotations

HEADER_PREFIX = "x-brokerkit-"
"""User headers may not start with this (``InvalidMessage``); brokerkit's own start with it."""

FIFO_GROUP_HEADER = HEADER_PREFIX + "fifo-group"
"""The fifo_group of a message, on brokers without a native message-group field."""

DEDUP_ID_HEADER = HEADER_PREFIX + "dedup-id"
"""The dedup id of a message, on brokers without a native deduplication-id field."""

__all__ = ["DEDUP_ID_HEADER", "FIFO_GROUP_HEADER", "HEADER_PREFIX"]
