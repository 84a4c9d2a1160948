"""``brokerkit check``: run the installed contract suite against a URL, summarise by behaviour."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brokerkit._check_faults import FaultCollector
from brokerkit._errors import ConfigError
from brokerkit._redact import RedactingStream
from brokerkit._url import BrokerURL

PASS, FAIL, UNSUPPORTED = "pass", "fail", "unsupported"


@dataclass
class _Collector:
    """A pytest plugin object: maps each test to its behaviour and records outcomes."""

    behaviour_of: dict[str, str] = field(default_factory=dict)
    outcomes: dict[str, list[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def pytest_collection_modifyitems(self, items: list[Any]) -> None:
        for item in items:
            marker = item.get_closest_marker("behaviour")
            if marker is not None:
                self.behaviour_of[item.nodeid] = marker.args[0]

    def pytest_runtest_logreport(self, report: Any) -> None:
        behaviour = self.behaviour_of.get(report.nodeid)
        if behaviour is None:
            return
        if report.when == "call" or report.outcome != "passed":
            self.outcomes.setdefault(behaviour, []).append(report.outcome)
            if report.outcome == "failed":
                self.failures.append(report.nodeid)


def _verbose(pytest_args: list[str] | None) -> bool:
    return any(
        a == "--verbose" or (a.startswith("-v") and a.strip("v") == "-") for a in pytest_args or []
    )


def run_check(
    url: str, *, pytest_args: list[str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Run the suite against ``url``: the result object of CONTRACT.md section 9, failed tests."""
    parsed = BrokerURL.parse(url)
    try:
        import pytest

        import contract_tests
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"brokerkit check needs {exc.name!r}: pip install 'brokerkit[check]'"
        ) from None
    from brokerkit._registry import backend_class

    backend = backend_class(parsed.scheme)
    suite = Path(contract_tests.__file__).parent
    collector = _Collector()
    faults = FaultCollector(tuple(getattr(contract_tests, "FAULT_BEHAVIOURS", ())))
    args = [
        str(suite),
        "-c",
        str(suite / "suite.ini"),
        "--rootdir",
        str(suite),
        "-p",
        "no:cacheprovider",
        *([] if _verbose(pytest_args) else ["-q"]),  # -q would cancel a -v given after --
        "--run-slow",
        "--no-env-urls",  # check URL checks URL alone, whatever BROKERKIT_URLS says
        "--broker-url",
        url,
        *(pytest_args or []),
    ]
    output = RedactingStream(sys.stderr, parsed.secrets())  # the suite redacts its reports;
    with contextlib.redirect_stdout(output):  # this catches whatever else pytest prints
        try:
            pytest.main(args, plugins=[collector, faults])
        finally:
            output.flush()
    results: dict[str, str] = {}
    for behaviour in contract_tests.BEHAVIOURS:
        outcomes = collector.outcomes.get(behaviour, [])
        if "failed" in outcomes or "passed" not in outcomes:
            results[behaviour] = FAIL  # a mandatory behaviour with no passing test has failed
        else:
            results[behaviour] = PASS
    results.update(faults.results())  # the fault behaviours (v1.1), after the 17
    summary = {
        "url": parsed.redacted(),
        "backend": f"{backend.__module__}.{backend.__qualname__}",
        "results": results,
        "passed": sum(1 for r in results.values() if r == PASS),
        "failed": sum(1 for r in results.values() if r == FAIL),
    }
    summary["faults"] = faults.details()  # per fault: result, reason if not run, figures
    return summary, collector.failures
