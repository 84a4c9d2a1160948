"""The ``brokerkit`` command's options around redaction: pytest options, --log-level."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from brokerkit._cli import CLOSED_PIPE_STATUS

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


def _closed_early(args: list[str], lines: int, *, buffered: bool) -> tuple[int, str, float]:
    """Run ``brokerkit ARGS``, read ``lines`` lines of its stdout, close the pipe, wait.

    ``(status, stderr, seconds from closing to exit)``; the process is killed (and the test
    fails) when it does not end within 30 s of the close.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("BROKERKIT_URLS", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(REPO)
    env.pop("PYTHONUNBUFFERED", None)
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "brokerkit", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        for _ in range(lines):
            assert proc.stdout.readline(), "the command ended before printing enough"
        proc.stdout.close()  # like `| head -N`: the reader is gone
        closed = time.monotonic()
        try:
            status = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"brokerkit {' '.join(args)} still runs 30 s after") from None
        return status, proc.stderr.read().decode(), time.monotonic() - closed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


@pytest.mark.parametrize(
    ("args", "lines", "buffered"),
    [
        (["demo"], 3, False),  # `brokerkit demo | head -3` on a terminal-like, unbuffered stdout
        (["demo"], 0, True),  # block-buffered: the pipe is met at the final flush
        (["demo", "memory://"], 1, False),
        (["bench", "memory://", "--messages", "50", "--rounds", "1"], 0, True),
        (["--help"], 0, False),
    ],
)
def test_a_closed_stdout_ends_the_command_quietly(
    args: list[str], lines: int, buffered: bool
) -> None:
    status, stderr, seconds = _closed_early(args, lines, buffered=buffered)
    assert status in (0, CLOSED_PIPE_STATUS), (status, stderr[-2000:])
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr[-2000:]
    assert "Exception ignored" not in stderr, stderr[-2000:]
    assert seconds < 15, f"{seconds:.1f} s from the closed pipe to the exit"
