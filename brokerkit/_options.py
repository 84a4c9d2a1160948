"""Typed URL query options: each backend declares a frozen pydantic model, parsed here once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from brokerkit._errors import ConfigError
from brokerkit._url import BrokerURL

__all__ = ["Options", "parse_options"]


class Options(BaseModel):
    """Base of every backend's options: frozen, and unknown parameters are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


OptionsT = TypeVar("OptionsT", bound=Options)


def parse_options(
    source: BrokerURL | Mapping[str, Any], model: type[OptionsT], *, scheme: str | None = None
) -> OptionsT:
    """Parse a URL's query (or a mapping, e.g. a config file's section) into ``model``.

    Raises ConfigError naming the parameter; values are never echoed (a parameter may
    carry a secret). ``scheme`` names the source in errors when it is a mapping.
    """
    if isinstance(source, BrokerURL):
        values: Mapping[str, Any] = dict(source.query)
        where = f"{source.scheme}:// URL"
    else:
        values = source
        where = f"{scheme}:// options" if scheme else "options"
    known = ", ".join(sorted(model.model_fields)) or "none"
    problems = []
    try:
        return model.model_validate(dict(values))
    except ValidationError as exc:
        for err in exc.errors(include_input=False, include_url=False):
            name = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown parameter {name!r} (known: {known})")
            else:
                problems.append(f"parameter {name!r}: {err['msg']}")
    # raised outside the except block: the ValidationError holds every value (a password
    # too), and even a suppressed __context__ keeps it on the ConfigError
    raise ConfigError(f"{where}: " + "; ".join(problems))
