"""Key layout, entry encoding and script calls: the small pure pieces shared by both halves."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis import exceptions as rex
from redis.asyncio import Redis

from brokerkit.backends import NO_EXTRAS, NO_HEADERS, Delivery, Outgoing, json_headers

__all__ = [
    "FIFO_ID_PREFIX",
    "Keys",
    "Receipt",
    "Script",
    "command",
    "decode_entry",
    "decode_plain",
    "encode_entry",
    "encode_outgoing",
    "public_id",
    "run_script",
]

# Entry fields: short names keep entries small; "b" body, "g" fifo_group, "d" dedup_id,
# "h" headers as one JSON object (ASCII-escaped, so every str round-trips exactly).
F_BODY, F_GROUP, F_DEDUP, F_HEADERS = b"b", b"g", b"d", b"h"


@dataclass(frozen=True, slots=True)
class Keys:
    """Every key of a queue carries the queue name as a ``{hash tag}`` (one cluster slot)."""

    prefix: str

    def base(self, queue: str) -> str:
        return f"{self.prefix}{{{queue}}}"

    def stream(self, queue: str, dead_letters: bool = False) -> str:
        """``<prefix>{queue}:s`` the queue, ``<prefix>{queue}:d`` its DLQ: the streams of
        messages without a fifo_group; :meth:`fifo` names the twin of those with one."""
        return self.base(queue) + (":d" if dead_letters else ":s")

    @staticmethod
    def fifo(stream: str) -> str:
        """``…:sf`` (``…:df``): the twin stream holding the messages with a fifo_group."""
        return stream + "f"

    def dedup(self, queue: str, dedup_id: str, dead_letters: bool = False) -> str:
        """``<prefix>{queue}:dd:<id>`` (a DLQ's own: ``…:ddd:<id>``): where a dedup id lives."""
        return f"{self.base(queue)}:{'ddd' if dead_letters else 'dd'}:{dedup_id}"

    @staticmethod
    def group(stream: str, group: str) -> tuple[str, str, str]:
        """(due ZSET, bell stream, fifo list prefix) of one consumer group of ``stream``.

        The bell of a pair is the one of its plain stream; lists live under the fifo twin.
        """
        base = f"{stream}:g:{group}:"
        return base + "due", base + "bell", base + "f:"


def encode_entry(
    body: bytes,
    fifo_group: str | None,
    dedup_id: str | None,
    headers: Mapping[str, str],
) -> list[bytes]:
    """The stream entry of a message as a flat field/value list (body first)."""
    fields = [F_BODY, body]
    if fifo_group is not None:
        fields += (F_GROUP, fifo_group.encode())
    if dedup_id is not None:
        fields += (F_DEDUP, dedup_id.encode())
    if headers:
        fields += (F_HEADERS, json.dumps(dict(headers), separators=(",", ":")).encode())
    return fields


def encode_outgoing(msg: Outgoing) -> list[bytes]:
    return encode_entry(msg.body, msg.fifo_group, msg.dedup_id, msg.headers)


Receipt = tuple[bytes, int, float]
"""A delivery's receipt: (entry id, PEL delivery count, holds_until). The first two are the
lease token; holds_until is the loop time by which the lease surely still holds, as of the
read (a renewal by ``extend`` is kept by the receiver, never written into the receipt). A
tuple of atoms, which the cyclic GC stops tracking."""

FIFO_ID_PREFIX = "f:"
"""Public ids of entries of a fifo twin stream start with this (the twins' ids may collide)."""


def public_id(entry_id: bytes, fifo: bool) -> str:
    return FIFO_ID_PREFIX + entry_id.decode() if fifo else entry_id.decode()


def decode_plain(entries: Iterable[Any], holds_until: float = math.inf) -> list[Delivery[Receipt]]:
    """First deliveries (count 1) read by ``XREADGROUP`` from a plain stream: ``entries`` is
    its raw ``[entry id, fields]`` list. The common entry (just a body) is made here without
    a field loop or a call; ``fields`` may be a flat list or a dict (should a client parse
    it)."""
    out: list[Delivery[Receipt]] = []
    append = out.append
    for entry_id, flat in entries:
        if len(flat) == 2 and flat[0] == F_BODY:
            receipt = (entry_id, 1, holds_until)
            append(
                Delivery(entry_id.decode(), flat[1], NO_HEADERS, None, None, 1, receipt, NO_EXTRAS)
            )
            continue
        if isinstance(flat, Mapping):
            flat = [x for pair in flat.items() for x in pair]
        append(decode_entry(entry_id, flat, 1, holds_until, fifo=False))
    return out


def decode_entry(
    entry_id: bytes,
    flat: Sequence[bytes],
    count: int,
    holds_until: float = math.inf,
    *,
    fifo: bool,
) -> Delivery[Receipt]:
    """A Delivery from an entry id, its flat field list and its PEL delivery count.

    ``fifo`` says which stream of the pair the entry is in (the fifo twin or not). The
    receipt is a ``Receipt``: ``(entry id, count, holds_until)``. Nothing raises: an
    entry brokerkit did not write is decoded as the rule of docs/contract.md says (see
    ``_decode_fields``); a damaged one comes with ``defect`` set.
    """
    body: bytes | None = None
    fifo_group = dedup_id = defect = None
    headers: Mapping[str, str] = NO_HEADERS
    try:  # what brokerkit writes, decoded at once; anything else below
        for i in range(0, len(flat) - 1, 2):
            name, value = flat[i], flat[i + 1]
            if name == F_BODY:
                body = value
            elif name == F_GROUP:
                fifo_group = value.decode()
            elif name == F_DEDUP:
                dedup_id = value.decode()
            elif name == F_HEADERS:
                headers = json.loads(value)
                for text in headers.values():  # AttributeError: not a JSON object
                    if type(text) is not str:
                        raise ValueError
            else:
                raise ValueError
        if body is None or (fifo_group is None) == fifo:
            raise ValueError
    except (ValueError, AttributeError):  # UnicodeDecodeError, JSONDecodeError: ValueErrors
        body, fifo_group, dedup_id, headers, defect = _decode_fields(flat, fifo)
    count = int(count)
    return Delivery(
        id=public_id(entry_id, fifo),
        body=body,
        headers=headers,
        fifo_group=fifo_group,
        dedup_id=dedup_id,
        attempt=count,
        receipt=(entry_id, count, holds_until),
        extras=NO_EXTRAS,
        defect=defect,
    )


def _decode_fields(
    flat: Sequence[bytes], fifo: bool
) -> tuple[bytes, str | None, str | None, Mapping[str, str], str | None]:
    """(body, fifo_group, dedup_id, headers, defect) of an entry's fields.

    Fields brokerkit never writes are the foreign producer's: kept as headers where name
    and value are UTF-8, dropped otherwise. An entry without any brokerkit field is
    foreign: empty body (a stream entry has none but its fields). A defect: ``h`` not a
    JSON object of strings, ``g`` or ``d`` not UTF-8, a ``g`` on the plain stream or none
    on the fifo twin, brokerkit fields but no ``b``. A fifo_group that cannot be settled
    as one (not UTF-8, or on the plain stream) is given as None.
    """
    body: bytes | None = None
    group = dedup = blob = None
    foreign: dict[str, str] = {}
    for i in range(0, len(flat) - 1, 2):
        name, value = flat[i], flat[i + 1]
        if name == F_BODY:
            body = value
        elif name == F_GROUP:
            group = value
        elif name == F_DEDUP:
            dedup = value
        elif name == F_HEADERS:
            blob = value
        else:
            try:
                foreign[name.decode()] = value.decode()
            except UnicodeDecodeError:
                pass  # not representable as str -> str: dropped
    defects: list[str] = []
    headers: Mapping[str, str] = NO_HEADERS
    if blob is not None:
        headers, wrong = json_headers(blob)
        if wrong:
            defects.append(wrong)
    fifo_group, dedup_id = _text(group, "fifo_group", defects), _text(dedup, "dedup_id", defects)
    if fifo and group is None:
        defects.append("entry of the fifo stream has no fifo_group field")
    elif group is not None and not fifo:
        defects.append("fifo_group field on an entry of the plain stream")
        fifo_group = None
    if body is None and (group is not None or dedup is not None or blob is not None):
        defects.append("entry has no body field")
    if foreign:
        headers = {**foreign, **headers}
    return body or b"", fifo_group, dedup_id, headers, "; ".join(defects) or None


def _text(value: bytes | None, field: str, defects: list[str]) -> str | None:
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        defects.append(f"{field} field is not UTF-8")
        return None


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script called by SHA; the text is sent once when the server lacks it."""

    text: str
    sha: str

    @classmethod
    def of(cls, text: str) -> Script:
        return cls(text, hashlib.sha1(text.encode()).hexdigest())


async def command(client: Redis, *args: Any) -> Any:
    """One raw Redis command (redis-py leaves ``execute_command`` untyped)."""
    return await client.execute_command(*args)  # type: ignore[no-untyped-call]


async def run_script(
    client: Redis, script: Script, keys: Sequence[Any], args: Sequence[Any]
) -> Any:
    """EVALSHA, falling back to EVAL (which caches it) after a restart or SCRIPT FLUSH."""
    try:
        return await command(client, "EVALSHA", script.sha, len(keys), *keys, *args)
    except rex.NoScriptError:
        return await command(client, "EVAL", script.text, len(keys), *keys, *args)
