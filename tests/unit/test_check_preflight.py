"""``brokerkit check`` against a closed port: the connect pre-flight ends it in seconds.

Run as a subprocess (``python -m brokerkit``, as a user would), against a port where
nothing listens, with a password in the URL that must not be printed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 9.0  # the bound is 10 s; a loaded CI machine gets the rest as slack
SECRET = "pre-flight-secret"


def closed_port() -> int:
    """A port nothing listens on: bound, then released (no listen, so refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def check(url: str, *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "brokerkit", "check", url, *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    return done, time.monotonic() - started


@pytest.mark.parametrize(
    "url",
    [
        f"redis://user:{SECRET}@127.0.0.1:{{port}}/0",
        f"amqp://guest:{SECRET}@127.0.0.1:{{port}}/",
        "sqs://?endpoint=http://127.0.0.1:{port}&region=us-east-1",
    ],
)
def test_a_closed_port_fails_in_seconds_with_the_cause(url: str) -> None:
    port = closed_port()
    done, elapsed = check(url.format(port=port))
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert elapsed < DEADLINE, f"{elapsed:.1f} s: {out}"
    assert "connection refused" in out and f"127.0.0.1:{port}" in out, out
    assert SECRET not in out


def test_a_closed_port_in_json_is_the_contract_object_with_the_cause() -> None:
    port = closed_port()
    done, elapsed = check(f"redis://user:{SECRET}@127.0.0.1:{port}/0", "--json")
    assert done.returncode != 0 and elapsed < DEADLINE, done.stderr
    summary = json.loads(done.stdout)
    assert summary["url"] == f"redis://user:***@127.0.0.1:{port}/0"
    assert summary["results"]["connect"] == "fail"
    assert set(summary["results"].values()) == {"fail", "not run"}
    assert (summary["passed"], summary["failed"], summary["ok"]) == (0, 1, False)
    assert "connection refused" in summary["error"] and f"127.0.0.1:{port}" in summary["error"]
    assert SECRET not in done.stdout + done.stderr
