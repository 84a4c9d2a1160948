"""scripts/audit's verdicts, on pip-audit reports made up for the purpose.

A stand-in ``pip_audit`` package on the script's path prints a canned report, so
each verdict is checked without a vulnerability service (none is reachable from
the sandbox) and without a real vulnerable package.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "audit"

VULN = {"id": "PYSEC-2099-1", "aliases": ["CVE-2099-0001"], "fix_versions": ["2.0"]}


def _run(tmp_path: Path, report: Any, allow: str = "", **env: str) -> tuple[int, str]:
    fake = tmp_path / "fake" / "pip_audit"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "__main__.py").write_text(f"print({json.dumps(report)!r})\n")
    allowlist = tmp_path / "allowlist"
    allowlist.write_text(allow)
    done = subprocess.run(
        [sys.executable, str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PYTHONPATH": str(tmp_path / "fake"),
            "BROKERKIT_AUDIT_ALLOWLIST": str(allowlist),
            **env,
        },
    )
    return done.returncode, done.stdout + done.stderr


def _report(*vulns: dict[str, Any]) -> dict[str, Any]:
    return {
        "dependencies": [
            {"name": "redis", "version": "1.0", "vulns": list(vulns)},
            {"name": "click", "version": "8.0", "vulns": []},
        ],
        "fixes": [],
    }


def test_a_known_vulnerability_fails_the_run(tmp_path: Path) -> None:
    code, out = _run(tmp_path, _report(VULN))
    assert code == 1, out
    assert "VULNERABLE redis 1.0: PYSEC-2099-1 (fixed in 2.0)" in out


@pytest.mark.parametrize("listed", ["PYSEC-2099-1", "CVE-2099-0001"])
def test_an_allowlisted_vulnerability_is_reported_and_passes(tmp_path: Path, listed: str) -> None:
    code, out = _run(tmp_path, _report(VULN), f"{listed} redis  only the sync client is affected\n")
    assert code == 0, out
    assert "allowed    redis 1.0: PYSEC-2099-1" in out and "only the sync client" in out


def test_an_allowlist_entry_without_a_reason_is_an_error(tmp_path: Path) -> None:
    code, out = _run(tmp_path, _report(VULN), "PYSEC-2099-1 redis\n")
    assert code != 0 and "expected 'ID package reason'" in out


def test_a_clean_report_passes(tmp_path: Path) -> None:
    code, out = _run(tmp_path, _report())
    assert code == 0 and "no known vulnerabilities" in out, out


def test_an_unreachable_service_says_no_audit_was_done(tmp_path: Path) -> None:
    skipped = {
        "name": "redis",
        "skip_reason": "Dependency not found on PyPI and could not be audited",
    }
    report = {"dependencies": [skipped], "fixes": []}
    code, out = _run(tmp_path, report)
    assert code == 0 and "NO VULNERABILITY AUDIT WAS DONE" in out, out
    code, out = _run(tmp_path / "strict", report, BROKERKIT_AUDIT_REQUIRED="1")
    assert code == 2 and "NO VULNERABILITY AUDIT WAS DONE" in out, out


def test_a_vulnerability_outside_brokerkits_dependencies_is_reported_only(tmp_path: Path) -> None:
    report = _report()
    report["dependencies"].append({"name": "not-a-brokerkit-dep", "version": "1", "vulns": [VULN]})
    code, out = _run(tmp_path, report)
    assert code == 0, out
    assert "vulnerable not-a-brokerkit-dep 1: PYSEC-2099-1" in out and "reported only" in out
