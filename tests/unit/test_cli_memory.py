"""``memory://`` from the ``brokerkit`` command, run as a user runs it: one process a command.

Each command starts its own memory:// broker, gone when it exits. Publish, redrive and
declare refuse it (ConfigError, exit 1: nobody could ever see their effect); peek, dlq and
stats run and note on stderr that they see only their own, empty broker; demo, check and
bench, which do all their work inside the one command, keep working.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def brokerkit(*args: str, url_env: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BROKERKIT_URLS", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = str(REPO)
    env["BROKERKIT_URL"] = url_env
    return subprocess.run(
        [sys.executable, "-m", "brokerkit", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["publish", "memory://", "emails", "hello"],
        ["publish", "memory://named", "emails", "--fifo-group", "g", "hello"],
        ["redrive", "memory://", "emails", "--yes"],
        ["declare", "memory://", "emails", "--group", "mailer"],
    ],
)
def test_a_command_whose_effect_would_vanish_refuses_memory(args: list[str]) -> None:
    done = brokerkit(*args)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "ConfigError: memory:// is per-process" in done.stderr, done.stderr
    assert "gone when the command exits" in done.stderr
    assert "published" not in done.stdout and "moved" not in done.stdout, done.stdout
    assert "declared" not in done.stdout and "Traceback" not in done.stderr


def test_the_url_from_the_environment_is_refused_too() -> None:
    done = brokerkit("publish", "emails", "hello", url_env="memory://")
    assert done.returncode == 1 and "memory:// is per-process" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["peek", "memory://", "emails"], "0 message(s)"),
        (["peek", "memory://", "emails", "--dlq"], "0 message(s)"),
        (["dlq", "memory://", "emails"], "0 message(s)"),
        (["stats", "memory://", "emails"], "emails"),
    ],
)
def test_a_read_command_runs_and_notes_that_it_sees_only_its_own_broker(
    args: list[str], shown: str
) -> None:
    done = brokerkit(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert shown in done.stdout
    assert "note: memory:// is per-process" in done.stderr, done.stderr
    assert "sees nothing another command published" in done.stderr


def test_a_real_url_gets_no_note_before_it_connects() -> None:
    # nothing listens on port 1: the command fails to connect, and says nothing of memory://
    done = brokerkit("peek", "redis://127.0.0.1:1/0", "emails")
    assert done.returncode == 1 and "per-process" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "memory://"],
        ["bench", "memory://", "--messages", "50", "--rounds", "1"],
        ["check", "memory://", "-k", "test_connect_async_with"],
    ],
)
def test_commands_that_work_within_themselves_keep_memory(args: list[str]) -> None:
    done = brokerkit(*args)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "per-process" not in done.stdout + done.stderr
