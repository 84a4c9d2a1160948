"""``brokerkit check``: run the installed contract suite against a URL, summarise by behaviour."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from brokerkit._check_faults import FaultCollector
from brokerkit._errors import ConfigError
from brokerkit._preflight import preflight
from brokerkit._redact import RedactingStream
from brokerkit._url import BrokerURL

PASS, FAIL, UNSUPPORTED, NOT_RUN = "pass", "fail", "unsupported", "not run"
UNMAPPED = "(no behaviour marker)"
"""The behaviour of a collected test without a ``behaviour`` marker: a defect of the suite,
so ``check`` is not ok while one is selected, whatever its outcome."""


@dataclass
class _Test:
    """One collected test of a behaviour: selected or not, and how each phase ended."""

    behaviour: str
    selected: bool = True
    outcome: str | None = None  # "passed", "failed", "skipped"; None while it has not run
    skip_reason: str = ""


@dataclass
class _Collector:
    """A pytest plugin object: maps each test to its behaviour and records outcomes.

    Every collected test of a behaviour is remembered, so one deselected (``-k``) or
    never reached (an interrupted run) leaves a trace instead of vanishing.
    """

    ignore: tuple[str, ...] = ()
    """Behaviours judged elsewhere (the fault behaviours: their own collector)."""
    tests: dict[str, _Test] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    collection_errors: list[str] = field(default_factory=list)

    def pytest_itemcollected(self, item: Any) -> None:
        marker = item.get_closest_marker("behaviour")
        behaviour = UNMAPPED if marker is None or not marker.args else str(marker.args[0])
        if behaviour not in self.ignore:
            self.tests[item.nodeid] = _Test(behaviour)

    def pytest_deselected(self, items: list[Any]) -> None:
        for item in items:
            test = self.tests.get(item.nodeid)
            if test is not None:
                test.selected = False

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.collection_errors.append(report.nodeid or "(collection)")

    def pytest_runtest_logreport(self, report: Any) -> None:
        test = self.tests.get(report.nodeid)
        if test is None:
            return
        if report.failed:
            if test.outcome != "failed":
                self.failures.append(report.nodeid)
            test.outcome = "failed"
        elif report.skipped and test.outcome != "failed":
            test.outcome = "skipped"
            test.skip_reason = _skip_reason(report)
        elif report.when == "call" and test.outcome is None:
            test.outcome = "passed"


def _skip_reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        return reason.removeprefix("Skipped: ")
    return str(longrepr)


def _judge(tests: list[_Test], unsupported_prefix: str) -> tuple[str, list[str], bool]:
    """One behaviour's result, the optional features it lacks, and whether all selected passed.

    Pass only when every test of the behaviour was selected, ran and passed, or skipped
    because ``capabilities`` declares an optional feature absent. A deselected or unreached
    test makes it "not run"; a failure or any other skip makes it "fail".
    """
    selected = [t for t in tests if t.selected]
    features = sorted(
        {
            t.skip_reason.removeprefix(unsupported_prefix).split(":", 1)[0]
            for t in selected
            if t.outcome == "skipped" and t.skip_reason.startswith(unsupported_prefix)
        }
    )
    bad = [
        t
        for t in selected
        if t.outcome == "failed"
        or (t.outcome == "skipped" and not t.skip_reason.startswith(unsupported_prefix))
    ]
    if bad:
        return FAIL, features, False
    unreached = [t for t in selected if t.outcome is None]
    if not selected or unreached or len(selected) < len(tests):
        return NOT_RUN, features, not unreached
    if all(t.outcome == "skipped" for t in selected):
        return UNSUPPORTED, features, True
    return PASS, features, True


def _unmapped_kind(test: _Test) -> str:
    if test.behaviour == UNMAPPED:
        return "no behaviour marker"
    return f"unknown behaviour {test.behaviour!r}"


def judge_all(
    collector: _Collector, behaviours: tuple[str, ...], unsupported_prefix: str, *, exit_code: int
) -> tuple[dict[str, str], dict[str, list[str]], bool, list[str]]:
    """Each named behaviour's result, the optional features each lacks, whether the run is
    ok, and the selected tests that map to no named behaviour.

    Every selected test counts towards ``ok``: one without a ``behaviour`` marker, or whose
    marker names no behaviour of the suite, makes the run not ok (and is listed), whether it
    passed or failed, since ``check`` could not say which behaviour it proved.
    """
    results: dict[str, str] = {}
    lacking: dict[str, list[str]] = {}
    ok = exit_code in (0, 1) and not collector.collection_errors
    for behaviour in behaviours:
        tests = [t for t in collector.tests.values() if t.behaviour == behaviour]
        result, features, selected_passed = _judge(tests, unsupported_prefix)
        if result == NOT_RUN and collector.collection_errors:
            result = FAIL  # a module that did not import may hold this behaviour's tests
        results[behaviour] = result
        if features:
            lacking[behaviour] = features
        ok = ok and selected_passed and result != FAIL
    stray = [
        f"{_unmapped_kind(t)} ({t.outcome or 'not reached'}): {nodeid}"
        for nodeid, t in collector.tests.items()
        if t.selected and t.behaviour not in behaviours
    ]
    if stray:
        ok = False
    if not any(t.selected for t in collector.tests.values()):
        ok = False  # nothing ran: no evidence of anything
    return results, lacking, ok, stray


def _verbose(pytest_args: list[str] | None) -> bool:
    return any(
        a == "--verbose" or (a.startswith("-v") and a.strip("v") == "-") for a in pytest_args or []
    )


def unreachable_summary(
    url: BrokerURL, backend: str, behaviours: tuple[str, ...], faults: tuple[str, ...], cause: str
) -> dict[str, Any]:
    """The result object when the connect pre-flight failed: connect "fail", the rest "not run".

    The shape of CONTRACT.md section 9, with ``"error"`` (the redacted cause) beside it.
    """
    results = {b: FAIL if b == "connect" else NOT_RUN for b in (*behaviours, *faults)}
    return {
        "url": url.redacted(),
        "backend": backend,
        "results": results,
        "passed": 0,
        "failed": 1,
        "not_run": len(results) - 1,
        "unsupported": {},
        "ok": False,
        "faults": {f: {"result": NOT_RUN, "reason": "the broker was unreachable"} for f in faults},
        "error": cause,
    }


def suite_package() -> ModuleType:
    """The contract suite beside this brokerkit: the repository's ``contract_tests/`` in a
    source checkout (an editable install included), else the installed ``brokerkit_contract``
    (the wheel maps the folder to that name, so it cannot collide with a user's package)."""
    source = Path(__file__).resolve().parent.parent / "contract_tests"
    if (source / "suite.ini").is_file():
        if str(source.parent) not in sys.path:
            sys.path.insert(0, str(source.parent))
        module = importlib.import_module("contract_tests")
        if Path(str(module.__file__)).resolve().parent == source:
            return module
    return importlib.import_module("brokerkit_contract")


def run_check(
    url: str, *, pytest_args: list[str] | None = None
) -> tuple[dict[str, Any], list[str]]:
    """Run the suite against ``url``: the result object of CONTRACT.md section 9, failed tests."""
    parsed = BrokerURL.parse(url)
    try:
        import pytest

        contract_tests = suite_package()
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"brokerkit check needs {exc.name!r}: pip install 'brokerkit-mq[check]'"
        ) from None
    from brokerkit._check_progress import Progress  # a pytest plugin: imports pytest
    from brokerkit._registry import backend_class

    backend = backend_class(parsed.scheme)
    backend_name = f"{backend.__module__}.{backend.__qualname__}"
    suite = Path(str(contract_tests.__file__)).parent
    fault_behaviours = tuple(getattr(contract_tests, "FAULT_BEHAVIOURS", ()))
    cause = asyncio.run(preflight(url))
    if cause is not None:
        summary = unreachable_summary(
            parsed, backend_name, tuple(contract_tests.BEHAVIOURS), fault_behaviours, cause
        )
        return summary, []  # the cause is summary["error"]
    collector = _Collector(ignore=fault_behaviours)
    faults = FaultCollector(fault_behaviours)
    verbose = _verbose(pytest_args)
    plugins: list[Any] = [collector, faults]
    progress = None if verbose else Progress(sys.stderr, secrets=parsed.secrets())
    if progress is not None:  # -v: pytest's own per-test lines instead
        plugins.append(progress)
    args = [
        str(suite),
        "-c",
        str(suite / "suite.ini"),
        "--rootdir",
        str(suite),
        "-p",
        "no:cacheprovider",
        *([] if verbose else ["-q"]),  # -q would cancel a -v given after --
        "--run-slow",
        "--no-env-urls",  # check URL checks URL alone, whatever BROKERKIT_URLS says
        "--broker-url",
        url,
        *(pytest_args or []),
    ]
    output = RedactingStream(sys.stderr, parsed.secrets())  # the suite redacts its reports;
    with contextlib.redirect_stdout(output):  # this catches whatever else pytest prints
        try:
            exit_code = pytest.main(args, plugins=plugins)
        finally:
            if progress is not None:
                progress.stop()
            output.flush()
    named = (*contract_tests.BEHAVIOURS, *getattr(contract_tests, "OPTIONAL_BEHAVIOURS", ()))
    results, lacking, ok, stray = judge_all(
        collector, named, contract_tests.UNSUPPORTED, exit_code=int(exit_code)
    )
    fault_results = faults.results()  # the fault behaviours (v1.1), after the 17
    results.update(fault_results)
    ok = ok and FAIL not in fault_results.values()
    summary = {
        "url": parsed.redacted(),
        "backend": backend_name,
        "results": results,
        "passed": sum(1 for r in results.values() if r == PASS),
        "failed": sum(1 for r in results.values() if r == FAIL),
        "not_run": sum(1 for r in results.values() if r == NOT_RUN),
        "unsupported": lacking,
        "ok": ok,
    }
    failures = collector.failures + [f"collection error: {e}" for e in collector.collection_errors]
    failures += stray
    failures += [
        f"skipped (not an optional feature): {nodeid}: {t.skip_reason}"
        for nodeid, t in collector.tests.items()
        if t.selected
        and t.outcome == "skipped"
        and not t.skip_reason.startswith(contract_tests.UNSUPPORTED)
    ]
    failures += faults.failures()
    summary["faults"] = faults.details()  # per fault: result, reason if not run, figures
    return summary, failures
