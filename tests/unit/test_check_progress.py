"""``brokerkit check`` shows which behaviour runs and how many tests are done, not dots.

Run as a subprocess on memory:// with a few behaviours selected: stderr a pipe (plain
lines, what a CI log gets) and a pseudo-terminal (the rich bar).
"""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

from contract_tests import BEHAVIOURS, FAULT_BEHAVIOURS, OPTIONAL_BEHAVIOURS

ROOT = Path(__file__).resolve().parents[2]
SELECT = "test_nack_redelivers or test_dedup_same_id"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "160"}


def check(*args: str, env: dict[str, str] = ENV) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "brokerkit", "check", "memory://", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )


def test_not_a_terminal_gets_one_plain_line_per_behaviour_and_no_dots() -> None:
    done = check("-k", SELECT)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    progress = [line for line in lines if re.match(r"\[\s*\d+/\d+\] \S", line)]
    assert any(line.endswith("] nack") for line in progress), done.stderr
    assert any(line.endswith("] dedup") for line in progress), done.stderr
    total = {re.match(r"\[\s*\d+/(\d+)\]", line)[1] for line in progress}  # type: ignore[index]
    assert len(total) == 1, progress
    assert not [line for line in lines if re.fullmatch(r"[.sFEx]+(\s*\[\s*\d+%\])?", line)]
    assert "100%" not in done.stderr


def test_json_keeps_its_shape() -> None:
    done = check("-k", SELECT, "--json")
    summary = json.loads(done.stdout)
    assert {"url", "backend", "results", "passed", "failed"} <= summary.keys()
    assert set(summary["results"].values()) <= {"pass", "fail", "unsupported", "not run"}
    assert list(summary["results"]) == [*BEHAVIOURS, *OPTIONAL_BEHAVIOURS, *FAULT_BEHAVIOURS]
    assert "error" not in summary and summary["failed"] == 0
    assert not done.stdout.lstrip().startswith("[") and done.stdout.rstrip().endswith("}")


def test_a_terminal_gets_the_progress_bar() -> None:
    primary, secondary = pty.openpty()
    chunks: list[bytes] = []

    def drain() -> None:  # keep reading, or a full pty buffer would block the child
        while True:
            try:
                data = os.read(primary, 65536)
            except OSError:
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    done = subprocess.run(
        [sys.executable, "-m", "brokerkit", "check", "memory://", "-k", SELECT],
        stdout=subprocess.PIPE,
        stderr=secondary,
        cwd=ROOT,
        env=ENV,
        timeout=300,
    )
    os.close(secondary)
    reader.join(timeout=10)
    os.close(primary)
    shown = b"".join(chunks).decode("utf-8", "replace")
    assert done.returncode == 0, shown
    assert re.search(r"\d+/\d+", shown) and "nack: test_nack_redelivers" in shown, shown
    assert "pass" in done.stdout.decode()


def test_verbose_from_pytest_addopts_keeps_pytests_own_lines() -> None:
    done = check("-k", SELECT, env={**ENV, "PYTEST_ADDOPTS": "-vv"})  # one v is cancelled by -q
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"PASSED +\[ *\d+%\]", done.stderr), done.stderr
    assert not re.search(r"^\[\s*\d+/\d+\] ", done.stderr, re.M), done.stderr
