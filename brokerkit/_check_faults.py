"""The fault behaviours of ``brokerkit check`` (CONTRACT.md section 9, v1.1).

A pytest plugin object beside the check's own collector: it judges the tests marked
with a fault behaviour (``contract_tests.FAULT_BEHAVIOURS``) and keeps their figures.

* ``pass``: every selected test of the behaviour ran and passed;
* ``fail``: one failed, or skipped for any reason but a missing hook;
* ``not run``: its tests were skipped because the hook they need was not given (or the
  fault cannot apply, e.g. memory:// is in-process), or deselected; the reason (which
  names the flag that would run it) is kept. Never counted as a pass.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

PASS, FAIL, NOT_RUN = "pass", "fail", "not run"
_NOT_RUN_PREFIX = "not run: "  # contract_tests._faults.NOT_RUN
_FIGURES = "fault_figures"  # contract_tests._faults.FIGURES


@dataclass
class _Test:
    behaviour: str
    outcome: str | None = None
    reason: str = ""
    figures: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FaultCollector:
    """Collects the outcome, skip reason and figures of each fault test."""

    behaviours: tuple[str, ...]
    tests: dict[str, _Test] = field(default_factory=dict)

    def pytest_itemcollected(self, item: Any) -> None:
        marker = item.get_closest_marker("behaviour")
        if marker is not None and marker.args[0] in self.behaviours:
            self.tests[item.nodeid] = _Test(marker.args[0])

    def pytest_deselected(self, items: list[Any]) -> None:
        for item in items:
            test = self.tests.get(item.nodeid)
            if test is not None:
                test.outcome, test.reason = "deselected", "deselected (-k)"

    def pytest_runtest_logreport(self, report: Any) -> None:
        test = self.tests.get(report.nodeid)
        if test is None:
            return
        for key, value in report.user_properties:
            if key == _FIGURES and value not in test.figures:
                test.figures.append(value)
        if report.failed:
            test.outcome = "failed"
        elif report.skipped and test.outcome != "failed":
            test.outcome, test.reason = "skipped", _skip_reason(report)
        elif report.when == "call" and test.outcome is None:
            test.outcome = "passed"

    def results(self) -> dict[str, str]:
        return {b: self._judge(b)[0] for b in self.behaviours}

    def details(self) -> dict[str, dict[str, Any]]:
        """Per behaviour: its result, why it was not run (if so), the figures of its tests."""
        out: dict[str, dict[str, Any]] = {}
        for behaviour in self.behaviours:
            result, reason = self._judge(behaviour)
            tests = [t for t in self.tests.values() if t.behaviour == behaviour]
            entry: dict[str, Any] = {"result": result}
            if reason:
                entry["reason"] = reason
            figures = [f for t in tests for f in t.figures]
            if figures:
                entry["figures"] = figures
            out[behaviour] = entry
        return out

    def failures(self) -> list[str]:
        """The node ids of fault tests that failed, or skipped for any reason but a hook."""
        return [
            nodeid
            for nodeid, t in self.tests.items()
            if t.outcome == "failed"
            or (t.outcome == "skipped" and not t.reason.startswith(_NOT_RUN_PREFIX))
        ]

    def _judge(self, behaviour: str) -> tuple[str, str]:
        tests = [t for t in self.tests.values() if t.behaviour == behaviour]
        if not tests:
            return NOT_RUN, "no test of this behaviour was collected"
        if any(t.outcome == "failed" for t in tests):
            return FAIL, ""
        other_skips = [
            t for t in tests if t.outcome == "skipped" and not t.reason.startswith(_NOT_RUN_PREFIX)
        ]
        if other_skips:
            return FAIL, f"skipped, not for a missing hook: {other_skips[0].reason}"
        if all(t.outcome == "passed" for t in tests):
            return PASS, ""
        reasons = [t.reason.removeprefix(_NOT_RUN_PREFIX) for t in tests if t.outcome != "passed"]
        unreached = [t for t in tests if t.outcome is None]
        if unreached and not reasons:
            return NOT_RUN, "the run stopped before its tests"
        return NOT_RUN, "; ".join(dict.fromkeys(r for r in reasons if r))


def fault_pytest_args(
    restart_cmd: str | None,
    proxy: bool,
    cut_seconds: float | None,
    soak_long: bool,
    restart_timeout: float | None = None,
    proxy_port: int | None = None,
) -> list[str]:
    """The suite's options for the hooks ``brokerkit check`` was given."""
    args: list[str] = []
    if restart_cmd:
        shlex.split(restart_cmd)  # fail early on unbalanced quotes (ValueError)
        args += ["--restart-cmd", restart_cmd]
    if restart_timeout is not None:
        args += ["--restart-timeout", str(restart_timeout)]
    if proxy:
        args.append("--proxy")
    if proxy_port:
        args += ["--proxy-port", str(proxy_port)]
    if cut_seconds is not None:
        args += ["--cut-seconds", str(cut_seconds)]
    if soak_long:
        args.append("--soak-long")
    return args


def _skip_reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)
