"""Raw writer for memory://: entries put straight into the in-process broker's log.

memory:// has no wire format, so its test-only injection point
(``brokerkit.backends.memory.inject_raw``) is told what a real broker's decoder would
find: ``bare`` an entry with a foreign header ``X-Foreign``, ``corrupt`` an entry marked
with the defect a damaged headers field gives, ``wrong_type`` a header whose value is an
int, ``oversize`` a body over ``max_message_bytes`` (the facade itself finds that one).
"""

from __future__ import annotations

from brokerkit import BrokerURL
from brokerkit.backends.memory import MemoryBackend, inject_raw

__all__ = ["MemoryRawWriter", "writer"]


class MemoryRawWriter:
    extra_kinds: tuple[str, ...] = ()

    def __init__(self, url: str) -> None:
        backend = MemoryBackend.from_url(BrokerURL.parse(url))
        self._name = backend.name
        self._max = backend.capabilities.max_message_bytes

    async def write(self, queue: str, kind: str, body: bytes) -> None:
        if kind == "bare":
            inject_raw(self._name, queue, body, {"X-Foreign": "yes"})
        elif kind == "corrupt":
            inject_raw(self._name, queue, body, {}, defect="headers field is not JSON")
        elif kind == "wrong_type":
            inject_raw(self._name, queue, body, {"X-Count": 7})
        elif kind == "oversize":
            inject_raw(self._name, queue, body + b"x" * (self._max + 1 - len(body)), {})
        else:
            raise ValueError(f"unknown kind {kind!r}")

    async def aclose(self) -> None:
        pass


def writer(url: str) -> MemoryRawWriter:
    return MemoryRawWriter(url)
