"""Payload codecs: typed payloads to bytes and back, with validation by pydantic.

A codec turns a payload into a body (``encode``) and a body into a validated payload
(``decode``, given pydantic's ``TypeAdapter`` for the handler's model). Its
``content_type`` travels in the ``content-type`` header of every message the App publishes.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

import pydantic

T = TypeVar("T")

CONTENT_TYPE_HEADER = "content-type"

__all__ = ["CONTENT_TYPE_HEADER", "JSON", "Codec", "JsonCodec", "describe_invalid"]


@runtime_checkable
class Codec(Protocol):
    """How an App turns payloads into bodies and back. JSON (``JsonCodec``) by default.

    ``decode`` raises ``pydantic.ValidationError`` for a body that does not fit the model
    (the App dead-letters it at once, naming the fields) and may raise any other
    exception for a body it cannot read at all (dead-lettered too).
    """

    content_type: str

    def encode(self, payload: Any) -> bytes: ...

    def decode(self, body: bytes, model: pydantic.TypeAdapter[T]) -> T: ...


class JsonCodec:
    """JSON through pydantic: models, dataclasses, TypedDicts, plain dicts and lists."""

    content_type = "application/json"

    def __init__(self) -> None:
        self._adapters: dict[type, pydantic.TypeAdapter[Any]] = {}

    def encode(self, payload: Any) -> bytes:
        if isinstance(payload, pydantic.BaseModel):
            return payload.__pydantic_serializer__.to_json(payload)
        kind = type(payload)
        adapter = self._adapters.get(kind)
        if adapter is None:
            adapter = self._adapters.setdefault(kind, pydantic.TypeAdapter(kind))
        return adapter.dump_json(payload)

    def decode(self, body: bytes, model: pydantic.TypeAdapter[T]) -> T:
        return model.validate_json(body)


JSON = JsonCodec()
"""The default codec."""


def describe_invalid(error: pydantic.ValidationError, limit: int = 512) -> str:
    """``invalid payload: email: value is not a valid email address; age: ...``.

    The dead-letter reason for a payload that failed validation: each failing field by
    its path, with pydantic's message (never the value, which may be personal data).
    """
    parts = []
    for item in error.errors(include_url=False, include_input=False):
        where = ".".join(str(p) for p in item["loc"]) or "(body)"
        parts.append(f"{where}: {item['msg']}")
    reason = "invalid payload: " + "; ".join(parts)
    return reason if len(reason) <= limit else reason[: limit - 3] + "..."
