"""BrokerURL: the connection URL, parsed once into an immutable value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from brokerkit._errors import ConfigError
from brokerkit._redact import REDACTED as _REDACTED
from brokerkit._redact import is_secret_name, redact


@dataclass(frozen=True)
class HostPort:
    """One ``host[:port]`` of a URL's (possibly comma-separated) host list."""

    host: str
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


@dataclass(frozen=True, repr=False)
class BrokerURL:
    """An immutable broker URL: ``scheme://[user[:password]@]host[:port][,host2...]/path?opts``.

    The password (and any query parameter whose name says it is a secret) never
    appears in ``repr``, ``str`` or error messages: use :meth:`redacted`. A user
    without a password is redacted too: schemes such as ``nats://token@host`` carry
    a token there. :meth:`render` is the one way to the real URL, for a client library.
    """

    scheme: str
    hosts: tuple[HostPort, ...] = ()
    username: str | None = None
    password: str | None = field(default=None, compare=False)
    path: str = ""
    query: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, url: str | BrokerURL) -> BrokerURL:
        """Parse a URL string; raise ConfigError naming the part at fault."""
        if isinstance(url, BrokerURL):
            return url
        if not isinstance(url, str):
            raise ConfigError(f"broker URL must be a string, not {type(url).__name__}")
        scheme, sep, rest = url.partition("://")
        if not sep or not scheme:
            raise ConfigError("broker URL has no scheme (expected e.g. 'redis://host:6379/0')")
        scheme = scheme.lower()
        # Each ConfigError is raised outside its except block: the driver-free errors of
        # urllib hold the URL's text, and even a suppressed __context__ keeps them.
        problem = None
        try:
            parts = urlsplit("x://" + rest)
        except ValueError as exc:  # e.g. an unclosed IPv6 bracket; the text may hold a password
            problem = redact(str(exc))
        if problem is not None:
            raise ConfigError(f"{scheme}:// URL is malformed ({problem})")
        netloc = parts.netloc
        username = password = None
        if "@" in netloc:
            userinfo, _, netloc = netloc.rpartition("@")
            user, colon, secret = userinfo.partition(":")
            username = unquote(user) or None
            password = unquote(secret) if colon else None
        hosts = (
            tuple(_parse_host(item, scheme) for item in netloc.split(",") if item) if netloc else ()
        )
        if parts.fragment:
            raise ConfigError(f"{scheme}:// URL must not have a #fragment")
        try:
            pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
        except ValueError:  # its text quotes the query
            pairs = None
        if pairs is None:
            raise ConfigError(f"{scheme}:// URL has a malformed query string")
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise ConfigError(f"{scheme}:// URL repeats the parameter {name!r}")
            seen.add(name)
        return cls(scheme, hosts, username, password, parts.path, tuple(pairs))

    @property
    def params(self) -> Mapping[str, str]:
        """The query parameters as a read-only mapping."""
        return MappingProxyType(dict(self.query))

    def redacted(self) -> str:
        """The URL with the password, a lone user (a token) and secret parameters as ``***``."""
        return self._render(redact=True)

    def secrets(self) -> tuple[str, ...]:
        """The credentials this URL carries: the password, a token, secret parameters' values."""
        found = [self.password] if self.password else []
        if self.username and self.password is None:
            found.append(self.username)
        found += [value for name, value in self.query if value and is_secret_name(name)]
        return tuple(found)

    def redact(self, text: str) -> str:
        """``text`` with this URL's secrets, and anything credential-shaped, as ``***``.

        For printing a text brokerkit did not write (a driver's error, a log line).
        """
        return redact(text, self.secrets())

    def render(self) -> str:
        """The full URL, password included: for handing to a client library only."""
        return self._render(redact=False)

    def _render(self, *, redact: bool) -> str:
        auth = ""
        if redact and self.username is not None and self.password is None:
            auth = _REDACTED + "@"
        elif self.username is not None or self.password is not None:
            auth = quote(self.username or "", safe="")
            if self.password is not None:
                auth += ":" + (_REDACTED if redact else quote(self.password, safe=""))
            auth += "@"
        hosts = ",".join(str(h) for h in self.hosts)
        query = "&".join(
            f"{quote(k, safe='')}="
            + (_REDACTED if redact and is_secret_name(k) else quote(v, safe="/:,"))
            for k, v in self.query
        )
        return f"{self.scheme}://{auth}{hosts}{self.path}" + (f"?{query}" if query else "")

    def __str__(self) -> str:
        return self.redacted()

    def __repr__(self) -> str:
        return f"BrokerURL({self.redacted()!r})"


def _parse_host(item: str, scheme: str) -> HostPort:
    host, port_text = item, ""
    if item.startswith("["):
        end = item.find("]")
        if end < 0:
            raise ConfigError(f"{scheme}:// URL has an unclosed IPv6 bracket in {item!r}")
        host, port_text = item[1:end], item[end + 1 :].removeprefix(":")
    elif ":" in item:
        host, _, port_text = item.rpartition(":")
    if not host:
        raise ConfigError(f"{scheme}:// URL has an empty host in {item!r}")
    if not port_text:
        return HostPort(unquote(host))
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"{scheme}:// URL has an invalid port {port_text!r} for host {host!r}")
    return HostPort(unquote(host), int(port_text))
