"""Stopping a broker or CLI process a test started."""

from __future__ import annotations

import subprocess


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
