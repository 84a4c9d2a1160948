"""The commit-metadata codec: the state of one partition's offsets above its commit point.

Kafka commits one offset per partition: "everything below C is done". brokerkit
settles messages one by one, so the state of the offsets at and above C travels
in the commit's metadata string (bounded by the broker's
``offset.metadata.max.bytes``, 4096 by default):

* ``SETTLED`` for a record acked, dead-lettered or skipped as a duplicate above C,
  so a new owner does not hand it out again;
* the number of deliveries so far (``count >= 1``) for a record that was handed
  out and not settled, so ``attempt`` survives a crash or a rebalance;
* optionally the wall-clock time (ms) before which a nacked record must not be
  delivered again.

Offsets not mentioned are "never delivered" (count 0). The format is
``bk1`` followed by ``;gap.len.state`` runs (base 36): ``gap`` offsets after the
previous run's end (the first run counts from C), ``len`` consecutive offsets,
``state`` = ``s`` or ``<count>[@<due_ms>]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "METADATA_BUDGET",
    "SETTLED",
    "OffsetState",
    "decode_metadata",
    "encode_metadata",
    "encode_runs",
    "state_text",
]

SETTLED = -1
"""The ``count`` of a settled offset."""

METADATA_BUDGET = 3800
"""Characters of commit metadata we allow ourselves (the broker default limit is 4096)."""

_PREFIX = "bk1"


@dataclass(frozen=True, slots=True)
class OffsetState:
    """What is durable about one offset at or above the commit point."""

    count: int
    """Deliveries so far, or SETTLED."""
    due_ms: int = 0
    """Not to be delivered again before this wall-clock time (ms since the epoch)."""


def _b36(n: int) -> str:
    if n < 0:
        raise ValueError("negative")
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out


def state_text(count: int, due_ms: int = 0) -> str:
    """The metadata text of one state (``count`` may be SETTLED)."""
    if count == SETTLED:
        return "s"
    text = _b36(count)
    return f"{text}@{_b36(due_ms)}" if due_ms else text


def encode_runs(
    commit: int, runs: Iterable[tuple[int, int, str]], budget: int = METADATA_BUDGET
) -> tuple[str, int]:
    """Encode ``(start, length, state_text)`` runs (ascending, disjoint, all ``>= commit``).

    Returns the text and the end of the offsets it covers: when the text would
    exceed ``budget`` the highest runs are dropped, and offsets from the returned
    end on read as "never delivered".
    """
    parts = [_PREFIX]
    size = len(_PREFIX)
    prev_end = commit
    for start, length, text in runs:
        token = f";{_b36(start - prev_end)}.{_b36(length)}.{text}"
        if size + len(token) > budget:
            return "".join(parts), prev_end
        parts.append(token)
        size += len(token)
        prev_end = start + length
    return "".join(parts), -1


def encode_metadata(
    commit: int, states: Iterable[tuple[int, OffsetState]], budget: int = METADATA_BUDGET
) -> str:
    """Encode ``(offset, state)`` pairs (ascending offsets, all ``>= commit``).

    States of count 0 are omitted. When the text would exceed ``budget``, the
    highest offsets are dropped (they then read as "never delivered": the only
    loss is a possible re-delivery or an undercounted attempt, never a lost message).
    """
    runs: list[list[Any]] = []
    for offset, state in states:
        if offset < commit or state.count == 0:
            continue
        text = state_text(state.count, state.due_ms)
        if runs and runs[-1][2] == text and runs[-1][0] + runs[-1][1] == offset:
            runs[-1][1] += 1
        else:
            runs.append([offset, 1, text])
    return encode_runs(commit, ((r[0], r[1], r[2]) for r in runs), budget)[0]


def decode_metadata(commit: int, metadata: str | None) -> dict[int, OffsetState]:
    """The states encoded by ``encode_metadata``; foreign or damaged text reads as empty."""
    if not metadata or not metadata.startswith(_PREFIX):
        return {}
    out: dict[int, OffsetState] = {}
    prev_end = commit
    try:
        for token in metadata[len(_PREFIX) :].split(";")[1:]:
            gap_text, len_text, state_text = token.split(".")
            start = prev_end + int(gap_text, 36)
            length = int(len_text, 36)
            if state_text == "s":
                state = OffsetState(SETTLED)
            else:
                count_text, _, due_text = state_text.partition("@")
                state = OffsetState(int(count_text, 36), int(due_text, 36) if due_text else 0)
            for offset in range(start, start + length):
                out[offset] = state
            prev_end = start + length
    except ValueError:
        return {}
    return out
