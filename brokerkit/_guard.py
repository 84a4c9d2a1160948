"""How every ``brokerkit`` command shows a URL and an error: redacted, always."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable
from typing import TypeVar

import click

from brokerkit._errors import BrokerkitError
from brokerkit._redact import RedactingFormatter, describe_error, redact
from brokerkit._url import BrokerURL

T = TypeVar("T")

__all__ = ["guarded", "secrets_of", "shown"]


def secrets_of(url: str) -> tuple[str, ...]:
    try:
        return BrokerURL.parse(url).secrets()
    except BrokerkitError:  # unparsable: the structural redaction still applies
        return ()


def shown(url: str) -> str:
    try:
        return BrokerURL.parse(url).redacted()
    except BrokerkitError:
        return redact(url)


def guarded(url: str, action: Callable[[], T]) -> T:
    """Run a command's work; its errors become a redacted message and exit status 1."""
    secrets = secrets_of(url)
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, RedactingFormatter):
            handler.formatter.secrets = secrets
    try:
        return action()
    except BrokerkitError as exc:
        raise click.ClickException(describe_error(exc, secrets)) from None
    except Exception as exc:  # a bug: a client library's error got through the API
        text = "".join(traceback.format_exception(exc))
        raise click.ClickException(
            "unexpected error (a brokerkit bug, please report it):\n" + redact(text, secrets)
        ) from None
