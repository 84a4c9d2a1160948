"""``brokerkit check``'s connect pre-flight: an unreachable broker fails in seconds, with why.

Without it the suite runs every behaviour against a dead address, each test waiting out
the backend's bounded connect retry (minutes in all), and the cause drowns in 17 failures.

Two steps, both before pytest starts:

1. a TCP probe of every address the URL names with a port (its hosts, and an
   ``http(s)://`` endpoint among its query values, e.g. SQS's ``endpoint=``), all at once,
   :data:`PROBE_TIMEOUT` each: when none answers, the check ends here with each
   address's cause ("connection refused at 127.0.0.1:6390");
2. a real connect through the facade (``brokerkit.connect(url)``, opened and closed), so
   a wrong password or a broker of another kind fails here too, with the backend's own
   error. It is bounded by :data:`CONNECT_BUDGET` when the probe had nothing to try (a
   host without a port, whose default only the backend knows), else by the more
   generous :data:`REACHABLE_BUDGET`: something answered, so a slow start on a loaded
   machine is not cut short.

Every text is redacted: the URL's credentials never reach the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

import brokerkit
from brokerkit._redact import describe_error
from brokerkit._url import BrokerURL, HostPort

__all__ = ["CONNECT_BUDGET", "PROBE_TIMEOUT", "REACHABLE_BUDGET", "preflight"]

PROBE_TIMEOUT = 3.0
CONNECT_BUDGET = 6.0
REACHABLE_BUDGET = 60.0
_WEB_PORTS = {"http": 80, "https": 443}


def addresses(url: BrokerURL) -> list[HostPort]:
    """The ``host:port`` pairs ``url`` names outright: hosts with a port, endpoint URLs."""
    found = [h for h in url.hosts if h.port is not None]
    for _, value in url.query:
        if "://" not in value:
            continue
        with contextlib.suppress(ValueError):
            parts = urlsplit(value)
            port = parts.port or _WEB_PORTS.get(parts.scheme.lower())
            if parts.hostname and port:
                found.append(HostPort(parts.hostname, port))
    return list(dict.fromkeys(found))


async def _probe(address: HostPort) -> str | None:
    """None when ``address`` accepts a TCP connection, else why not (in a few words)."""
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(address.host, address.port), PROBE_TIMEOUT
        )
    except ConnectionRefusedError:
        return f"connection refused at {address}"
    except TimeoutError:
        return f"no answer from {address} within {PROBE_TIMEOUT:g} s"
    except OSError as exc:
        return f"cannot connect to {address}: {exc.strerror or exc}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


async def preflight(url: str) -> str | None:
    """None when ``url``'s broker accepts a connection, else the cause, redacted.

    Raises ConfigError (before any I/O) for a URL its backend refuses.
    """
    parsed = BrokerURL.parse(url)
    broker = brokerkit.connect(parsed)  # no I/O: a bad URL is its ConfigError, raised first
    secrets = parsed.secrets()
    targets = addresses(parsed)
    budget = CONNECT_BUDGET
    if targets:
        causes = await asyncio.gather(*(_probe(a) for a in targets))
        if all(causes):
            return describe_error(
                brokerkit.BrokerUnavailable(
                    f"{parsed.scheme}:// broker unreachable: " + "; ".join(c for c in causes if c)
                ),
                secrets,
            )
        budget = REACHABLE_BUDGET
    try:
        async with asyncio.timeout(budget):
            async with broker:
                pass
    except TimeoutError:
        where = ", ".join(str(h) for h in parsed.hosts) or parsed.redacted()
        return f"BrokerUnavailable: {where} did not accept a connection within {budget:g} s"
    except brokerkit.BrokerkitError as exc:
        return describe_error(exc, secrets)
    return None
