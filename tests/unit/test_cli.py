"""The ``brokerkit`` command's options around redaction: pytest options, --log-level."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _brokerkit(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BROKERKIT_URLS", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, "-m", "brokerkit", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_passes_the_options_after_double_dash_to_pytest() -> None:
    done = _brokerkit("check", "memory://", "-k", "test_connect_async_with", "--", "-v")
    assert "test_connect_async_with_closes_and_use_after_close_raises[memory://] PASSED" in (
        done.stderr
    ), done.stderr[-2000:]
    # its sibling connect tests were deselected: partial evidence is "not run", never "pass"
    assert "  connect              not run" in done.stdout


def test_log_level_logs_to_stderr_through_the_redacting_formatter() -> None:
    done = _brokerkit("--log-level", "debug", "demo", "memory://")
    assert done.returncode == 0, done.stderr[-2000:]
    assert " DEBUG asyncio: Using selector" in done.stderr
    quiet = _brokerkit("demo", "memory://")
    assert "DEBUG" not in quiet.stderr
