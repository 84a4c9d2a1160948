"""brokerkit check's judgement of the fault behaviours: pass, fail, "not run" (never a pass)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from brokerkit._check_faults import FaultCollector, fault_pytest_args

FAULTS = ("crash", "broker restart")


def _item(nodeid: str, behaviour: str) -> Any:
    marker = SimpleNamespace(args=(behaviour,))
    return SimpleNamespace(nodeid=nodeid, get_closest_marker=lambda name: marker)


def _report(nodeid: str, when: str, outcome: str, reason: str = "", props: Any = ()) -> Any:
    longrepr = ("file.py", 1, f"Skipped: {reason}") if outcome == "skipped" else None
    return SimpleNamespace(
        nodeid=nodeid,
        when=when,
        failed=outcome == "failed",
        skipped=outcome == "skipped",
        longrepr=longrepr,
        user_properties=list(props),
    )


def _collector(*tests: tuple[str, str]) -> FaultCollector:
    collector = FaultCollector(FAULTS)
    for nodeid, behaviour in tests:
        collector.pytest_itemcollected(_item(nodeid, behaviour))
    return collector


def test_all_passed_is_pass_and_figures_are_kept() -> None:
    c = _collector(("a", "crash"), ("b", "crash"))
    figures = ("fault_figures", {"behaviour": "crash", "lost": 0})
    for nodeid in ("a", "b"):
        c.pytest_runtest_logreport(_report(nodeid, "setup", "passed"))
        c.pytest_runtest_logreport(_report(nodeid, "call", "passed", props=[figures]))
    assert c.results()["crash"] == "pass"
    assert c.details()["crash"]["figures"] == [figures[1], figures[1]]  # one per test


def test_a_missing_hook_is_not_run_with_its_reason() -> None:
    c = _collector(("r", "broker restart"))
    c.pytest_runtest_logreport(_report("r", "setup", "skipped", "not run: needs --restart-cmd"))
    assert c.results()["broker restart"] == "not run"
    assert c.details()["broker restart"]["reason"] == "needs --restart-cmd"


@pytest.mark.parametrize("reason", ["no module named x", "slow: pass --run-slow"])
def test_any_other_skip_fails(reason: str) -> None:
    c = _collector(("a", "crash"))
    c.pytest_runtest_logreport(_report("a", "setup", "skipped", reason))
    assert c.results()["crash"] == "fail"


def test_one_failure_fails_even_beside_a_pass() -> None:
    c = _collector(("a", "crash"), ("b", "crash"))
    c.pytest_runtest_logreport(_report("a", "call", "passed"))
    c.pytest_runtest_logreport(_report("b", "call", "failed"))
    assert c.results()["crash"] == "fail"


def test_a_pass_beside_a_not_run_is_not_a_pass() -> None:
    c = _collector(("a", "crash"), ("b", "crash"))
    c.pytest_runtest_logreport(_report("a", "call", "passed"))
    c.pytest_runtest_logreport(_report("b", "setup", "skipped", "not run: in-process"))
    assert c.results()["crash"] == "not run"


def test_deselected_or_uncollected_is_not_run() -> None:
    c = _collector(("a", "crash"))
    c.pytest_deselected([_item("a", "crash")])
    assert c.results() == {"crash": "not run", "broker restart": "not run"}


def test_hook_arguments_for_the_suite() -> None:
    args = fault_pytest_args("scripts/services restart redis", True, 5.0, True, None, 19392)
    assert args == [
        "--restart-cmd",
        "scripts/services restart redis",
        "--proxy",
        "--proxy-port",
        "19392",
        "--cut-seconds",
        "5.0",
        "--soak-long",
    ]
    assert fault_pytest_args(None, False, None, False) == []
    with pytest.raises(ValueError):
        fault_pytest_args("echo 'unbalanced", False, None, False)
