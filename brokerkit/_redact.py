"""Redaction of credentials from any text brokerkit prints, logs or raises: written once.

CONTRACT.md section 1: credentials never appear in ``repr``, ``str``, log lines or
exception texts. Our own texts are built from redacted values; this module is the
safety net for texts we do not build ourselves (a driver's exception kept as
``__cause__``, a log record of a client library, a pytest report) and is applied
wherever such a text is printed.

Three passes, each on its own enough for its kind of leak:

1. the exact secrets of the URL in use (and their URL-quoted and repr-escaped forms);
2. the userinfo of anything that looks like a URL (``scheme://user:pass@`` ->
   ``scheme://user:***@``; a lone ``scheme://token@`` -> ``scheme://***@``);
3. credential-shaped ``name=value`` / ``'name': 'value'`` pairs (``password=``,
   ``sasl.password``, ``token``, ``secret``, ``api_key``, ...) and ``Bearer`` tokens.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import IO, Any
from urllib.parse import quote, quote_plus

__all__ = [
    "REDACTED",
    "RedactingFormatter",
    "RedactingStream",
    "describe_error",
    "is_secret_name",
    "redact",
]

REDACTED = "***"

# A secret shorter than this is not replaced where it merely occurs in free text (it
# would garble every message); the structural passes 2 and 3 still hide it.
MIN_EXACT = 4

_SECRET_WORDS = r"pass|pwd|secret|token|credential|key"
_SECRET_NAME = re.compile(rf"{_SECRET_WORDS}|^auth(?:orization)?$", re.IGNORECASE)

_URL_USERINFO = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#@'\"<>]*(?:@[^\s/?#@'\"<>]*)*)@"
)

# a credential-shaped name, its closing quote, separator, opening quote, value
_PAIR = re.compile(
    rf"(?<![\w.-])(?P<name>[\w.-]*(?:{_SECRET_WORDS})[\w.-]*|auth(?:orization)?)"
    r"(?P<close>['\"]?)(?P<sep>\s*[=:]\s*)(?P<quote>['\"]?)(?P<value>[^\s'\"&,;(){}\[\]<>][^\s'\"&,;)}\]>]*)",
    re.IGNORECASE,
)

_BEARER = re.compile(r"\b(?P<kind>Bearer)\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """True for a parameter or field name that says its value is a credential."""
    return _SECRET_NAME.search(name) is not None


def _forms(secret: str) -> set[str]:
    """The ways ``secret`` may be spelled in a text: raw, URL-quoted, repr-escaped."""
    forms = {secret, quote(secret, safe=""), quote_plus(secret, safe=""), repr(secret)[1:-1]}
    return {f for f in forms if len(f) >= MIN_EXACT}


def _userinfo(match: re.Match[str]) -> str:
    userinfo = match["userinfo"]
    user, colon, _ = userinfo.partition(":")
    kept = f"{user}:{REDACTED}" if colon else REDACTED  # a lone userinfo may be a token
    return f"{match['scheme']}{kept}@"


def _pair(match: re.Match[str]) -> str:
    if match["value"] == REDACTED:
        return match[0]
    return f"{match['name']}{match['close']}{match['sep']}{match['quote']}{REDACTED}"


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with ``secrets`` and anything credential-shaped replaced by ``***``."""
    forms: set[str] = set()
    for secret in secrets:
        if secret:
            forms |= _forms(secret)
    for form in sorted(forms, key=len, reverse=True):  # longest first: one may contain another
        text = text.replace(form, REDACTED)
    text = _URL_USERINFO.sub(_userinfo, text)
    text = _BEARER.sub(lambda m: f"{m['kind']} {REDACTED}", text)
    return _PAIR.sub(_pair, text)


def describe_error(exc: BaseException, secrets: Iterable[str | None] = ()) -> str:
    """``Type: text`` of ``exc`` and of its whole ``__cause__``/``__context__`` chain, redacted.

    For a command to print: the brokerkit error first, then what caused it
    (the driver's error), each on its own line.
    """
    lines: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    first = True
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        line = f"{type(current).__name__}: {text}" if text else type(current).__name__
        lines.append(line if first else f"  caused by {line}")
        first = False
        if current.__cause__ is not None:
            current = current.__cause__
        elif current.__suppress_context__:
            current = None
        else:
            current = current.__context__
    return redact("\n".join(lines), secrets)


class RedactingFormatter(logging.Formatter):
    """A log formatter whose output (message, exception, stack) is redacted."""

    def __init__(self, fmt: str | None = None, secrets: Iterable[str | None] = ()) -> None:
        super().__init__(fmt)
        self.secrets = tuple(s for s in secrets if s)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record), self.secrets)


class RedactingStream:
    """A text stream that redacts each write before passing it on (line-buffered).

    Text is held until a newline so a secret split across two writes is still found.
    """

    def __init__(self, target: IO[str], secrets: Iterable[str | None] = ()) -> None:
        self._target = target
        self._secrets = tuple(s for s in secrets if s)
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        head, newline, tail = self._pending.rpartition("\n")
        if newline:
            self._target.write(redact(head + newline, self._secrets))
            self._pending = tail
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._target.write(redact(self._pending, self._secrets))
            self._pending = ""
        self._target.flush()

    def isatty(self) -> bool:
        return self._target.isatty()

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, ... of the real stream
        return getattr(self._target, name)
