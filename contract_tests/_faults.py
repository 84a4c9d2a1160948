"""Shared pieces of the fault behaviours (CONTRACT.md section 9, v1.1).

The fault tests (``test_faults_*.py``) need hooks a user may not give: a restart
command, a TCP proxy. A fault test that lacks its hook skips with a reason that starts
with :data:`NOT_RUN`; ``brokerkit check`` reports that behaviour ``"not run"`` (with the
reason, which names the flag that would run it), never as a pass. Any other skip of a
fault test is counted as a failure.

Figures (confirmed, delivered, lost, duplicates, lateness, recovery time, throughput)
are printed in the test's output, attached to the test report as
``user_properties`` (``brokerkit check`` shows them) and, with ``--fault-report PATH``,
appended to PATH as one JSON object per line.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import brokerkit

NOT_RUN = "not run: "
"""Prefix of the skip reason of a fault test whose hook was not given (or cannot apply)."""

FIGURES = "fault_figures"
"""The ``user_properties`` key under which a fault test records its figures."""

CUT_SECONDS = 20.0
"""Default network cut: longer than the clients' timeouts (issue 16). CI passes less."""


def add_fault_options(parser: pytest.Parser) -> None:
    """The fault behaviours' hooks (called from the suite's ``pytest_addoption``)."""
    group = parser.getgroup("brokerkit faults")
    group.addoption(
        "--restart-cmd",
        default=None,
        help="command that kills the broker (SIGKILL) and starts it again on the same data, "
        "returning once it is ready: runs the 'broker restart' behaviour",
    )
    group.addoption(
        "--restart-timeout",
        type=float,
        default=300.0,
        help="seconds the restart command may take before the test fails (default 300)",
    )
    group.addoption(
        "--proxy",
        action="store_true",
        help="connect through a TCP proxy the suite controls and cut it: runs 'network cut'",
    )
    group.addoption(
        "--proxy-port",
        type=int,
        default=0,
        help="listen port of the proxy (for a broker that advertises it, e.g. Kafka's "
        "advertised.listeners); default: a free port",
    )
    group.addoption(
        "--cut-seconds",
        type=float,
        default=float(os.environ.get("BROKERKIT_CUT_SECONDS", CUT_SECONDS)),
        help=f"how long the network stays cut (default {CUT_SECONDS:g}, env BROKERKIT_CUT_SECONDS)",
    )
    group.addoption(
        "--soak-long",
        action="store_true",
        help="run the long soak (50 000 messages) instead of the short one",
    )
    group.addoption(
        "--fault-report",
        default=None,
        help="append each fault test's figures to this file (one JSON object per line)",
    )


WARNINGS_SHOWN = 5
"""How many distinct library warnings a fault test's figures quote (the most frequent)."""


def library_warnings(records: Iterable[logging.LogRecord]) -> dict[str, int]:
    """brokerkit's log records of level WARNING and above (a test's ``caplog.records``),
    counted by message (cut to 160 characters): the WARNINGS_SHOWN most frequent. A fault
    test puts them in its figures, so a failure says what the library was retrying (a
    subscription refused, a book not written) even where the captured log is cut from
    the output. The messages are already redacted: the suite's record factory masks the
    URLs' secrets in every record."""
    seen = Counter(
        f"{r.name}: {r.getMessage()}"[:160]
        for r in records
        if r.levelno >= logging.WARNING and r.name.split(".", 1)[0] == "brokerkit"
    )
    return dict(seen.most_common(WARNINGS_SHOWN))


def real_url(url: object) -> str:
    """The URL to hand to a child process or to rewrite: the real one, password included.

    ``broker_url`` is the suite's ``SecretURL`` (a ``str`` whose ``str()`` hides the
    password), a ``BrokerURL`` or a plain string; this never prints it, only passes it on.
    """
    secret_url = getattr(url, "secret_url", None)  # the suite's SecretURL
    if callable(secret_url):
        return str(secret_url())
    if isinstance(url, brokerkit.BrokerURL):
        return url.render()
    return str(url)


def shown(url: object) -> str:
    """The URL as tests may print it: redacted."""
    return brokerkit.BrokerURL.parse(real_url(url)).redacted()


def in_process(url: object) -> bool:
    """True for memory:// (one process: no broker to kill, restart or cut)."""
    return brokerkit.BrokerURL.parse(real_url(url)).scheme == "memory"


def record(request: pytest.FixtureRequest, behaviour: str, figures: dict[str, Any]) -> None:
    """Print and attach a fault test's figures (and append them to --fault-report)."""
    entry = {"behaviour": behaviour, "test": request.node.name, **figures}
    request.node.user_properties.append((FIGURES, entry))
    print(f"[{behaviour}] {request.node.name}: {json.dumps(figures, sort_keys=True)}")
    path = request.config.getoption("--fault-report")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry, sort_keys=True) + "\n")


def child_env(url: object) -> dict[str, str]:
    """Environment for a child process: the real URL in BROKERKIT_CHILD_URL (never on its
    command line, where ``ps`` would show it), and this process's import path."""
    roots = [
        str(Path(brokerkit.__file__).resolve().parent.parent),
        str(Path(__file__).resolve().parent.parent),  # the suite's own package, by any name
    ]
    old = os.environ.get("PYTHONPATH")
    path = os.pathsep.join(dict.fromkeys([*roots, *([old] if old else [])]))
    return {**os.environ, "BROKERKIT_CHILD_URL": real_url(url), "PYTHONPATH": path}


def run_hook(command: str, timeout: float, secrets: tuple[str, ...] = ()) -> tuple[float, str]:
    """Run a user's hook command (shlex-split, no shell) with a timeout.

    Returns (seconds taken, its output's last lines with ``secrets`` masked). A non-zero
    exit or the timeout fails the test, quoting that redacted tail.
    """
    argv = shlex.split(command)
    if not argv:
        raise AssertionError("the hook command is empty")
    started = time.monotonic()
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the hook {argv[0]!r} did not finish within {timeout:.0f}s") from None
    except OSError as exc:
        raise AssertionError(f"the hook {argv[0]!r} could not run: {exc.strerror}") from None
    took = time.monotonic() - started
    text = done.stdout.decode(errors="replace")
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    tail = "\n".join(text.splitlines()[-15:])
    if done.returncode != 0:
        raise AssertionError(f"the hook {argv[0]!r} exited {done.returncode}:\n{tail}")
    return took, tail


def secrets_of(url: object) -> tuple[str, ...]:
    """The password of ``url`` (to mask in hook output)."""
    parsed = brokerkit.BrokerURL.parse(real_url(url))
    return tuple(s for s in (parsed.password,) if s)


def python() -> str:
    return sys.executable
