"""A stand-in of a consumed confluent-kafka ``Message`` (what the Kafka backend reads of one)."""

from __future__ import annotations

from brokerkit.backends import DEDUP_ID_HEADER, FIFO_GROUP_HEADER


class StubMessage:
    """Offset ``offset`` of ``partition``; the body is the offset unless given."""

    def __init__(
        self,
        offset: int | None,
        partition: int = 0,
        *,
        timestamp_ms: int = 1_000,
        fifo_group: str | None = None,
        dedup_id: str | None = None,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
    ) -> None:
        self._offset, self._partition, self._timestamp = offset, partition, timestamp_ms
        raw = [(k, v.encode()) for k, v in (headers or {}).items()]
        if fifo_group is not None:
            raw.append((FIFO_GROUP_HEADER, fifo_group.encode()))
        if dedup_id is not None:
            raw.append((DEDUP_ID_HEADER, dedup_id.encode()))
        self._headers = raw or None
        key = fifo_group if fifo_group is not None else dedup_id
        self._key = None if key is None else key.encode()  # what brokerkit's publish sets
        self._body = str(offset).encode() if body is None else body

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int | None:
        return self._offset

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def key(self) -> bytes | None:
        return self._key

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp)

    def value(self) -> bytes:
        return self._body

    def error(self) -> None:
        return None


def run(start: int, stop: int, partition: int = 0, **kw: object) -> list[StubMessage]:
    """Consecutive offsets ``start..stop-1`` of one partition."""
    return [StubMessage(o, partition, **kw) for o in range(start, stop)]  # type: ignore[arg-type]
