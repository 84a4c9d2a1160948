"""Typed URL query options: each backend declares a frozen pydantic model, parsed here once."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from brokerkit._errors import ConfigError
from brokerkit._url import BrokerURL

__all__ = ["Options", "parse_options"]


class Options(BaseModel):
    """Base of every backend's options: frozen, and unknown parameters are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


OptionsT = TypeVar("OptionsT", bound=Options)


def parse_options(url: BrokerURL, model: type[OptionsT]) -> OptionsT:
    """Parse ``url``'s query into ``model``; raise ConfigError naming the parameter.

    Values are never echoed (a parameter may carry a secret).
    """
    known = ", ".join(sorted(model.model_fields)) or "none"
    problems = []
    try:
        return model.model_validate(dict(url.query))
    except ValidationError as exc:
        for err in exc.errors(include_input=False, include_url=False):
            name = ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown parameter {name!r} (known: {known})")
            else:
                problems.append(f"parameter {name!r}: {err['msg']}")
    # raised outside the except block: the ValidationError holds every value (a password
    # too), and even a suppressed __context__ keeps it on the ConfigError
    raise ConfigError(f"{url.scheme}:// URL: " + "; ".join(problems))
