"""How ``brokerkit check`` judges a behaviour from its tests' outcomes (pure logic, no broker).

A behaviour passes only on complete evidence: every test ran and passed, or skipped
because ``capabilities`` declares an optional feature absent.
"""

from __future__ import annotations

from brokerkit._check import (
    FAIL,
    NOT_RUN,
    PASS,
    UNMAPPED,
    UNSUPPORTED,
    _Collector,
    _judge,
    _Test,
    judge_all,
)
from contract_tests import UNSUPPORTED as PREFIX


def _t(outcome: str | None, *, selected: bool = True, reason: str = "") -> _Test:
    return _Test("b", selected=selected, outcome=outcome, skip_reason=reason)


def test_all_passed_is_a_pass() -> None:
    assert _judge([_t("passed"), _t("passed")], PREFIX) == (PASS, [], True)


def test_one_failure_fails_whatever_else_passed() -> None:
    assert _judge([_t("passed"), _t("failed")], PREFIX)[0] == FAIL


def test_a_plain_skip_is_a_failure_not_a_pass() -> None:
    result, _, ok = _judge([_t("passed"), _t("skipped", reason="no broker here")], PREFIX)
    assert (result, ok) == (FAIL, False)


def test_an_optional_feature_declared_absent_is_named() -> None:
    skip = _t("skipped", reason=f"{PREFIX}fan_out: capabilities.fan_out is False")
    assert _judge([_t("passed"), skip], PREFIX) == (PASS, ["fan_out"], True)
    assert _judge([skip], PREFIX) == (UNSUPPORTED, ["fan_out"], True)


def test_a_deselected_test_makes_the_behaviour_not_run() -> None:
    assert _judge([_t("passed"), _t(None, selected=False)], PREFIX) == (NOT_RUN, [], True)
    assert _judge([_t(None, selected=False)], PREFIX) == (NOT_RUN, [], True)


def test_a_selected_test_that_never_reported_is_not_run_and_not_ok() -> None:
    assert _judge([_t("passed"), _t(None)], PREFIX) == (NOT_RUN, [], False)


def _collector(*tests: tuple[str, str, str | None]) -> _Collector:
    collector = _Collector()
    for nodeid, behaviour, outcome in tests:
        collector.tests[nodeid] = _Test(behaviour, outcome=outcome)
    return collector


def test_a_failing_test_without_a_behaviour_marker_makes_check_fail() -> None:
    collector = _collector(("t::a", "ack", "passed"), ("t::ops", UNMAPPED, "failed"))
    results, _, ok, stray = judge_all(collector, ("ack",), PREFIX, exit_code=1)
    assert results == {"ack": PASS}
    assert not ok
    assert stray == ["no behaviour marker (failed): t::ops"]


def test_a_passing_test_without_a_known_behaviour_still_makes_check_not_ok() -> None:
    collector = _collector(("t::a", "ack", "passed"), ("t::x", "ack typo", "passed"))
    _, _, ok, stray = judge_all(collector, ("ack",), PREFIX, exit_code=0)
    assert not ok
    assert stray == ["unknown behaviour 'ack typo' (passed): t::x"]


def test_every_test_mapped_and_passed_is_ok() -> None:
    collector = _collector(("t::a", "ack", "passed"), ("t::b", "browse", "passed"))
    results, _, ok, stray = judge_all(collector, ("ack", "browse"), PREFIX, exit_code=0)
    assert (results, ok, stray) == ({"ack": PASS, "browse": PASS}, True, [])


def test_every_contract_test_names_a_behaviour_of_the_suite() -> None:
    """The layout rule behind the three tests above: each ``test_*`` function of the suite
    carries a ``behaviour`` marker naming one of the behaviours ``check`` prints."""
    import ast
    from pathlib import Path

    import contract_tests

    known = {
        *contract_tests.BEHAVIOURS,
        *contract_tests.OPTIONAL_BEHAVIOURS,
        *contract_tests.FAULT_BEHAVIOURS,
    }
    suite = Path(contract_tests.__file__).parent
    modules = sorted(suite.glob("test_*.py"))
    assert modules, f"no test modules under {suite}"
    unmapped = []
    for path in modules:
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if not node.name.startswith("test"):
                continue
            names = [
                d.args[0].value
                for d in node.decorator_list
                if isinstance(d, ast.Call)
                and ast.unparse(d.func) == "pytest.mark.behaviour"
                and d.args
                and isinstance(d.args[0], ast.Constant)
            ]
            if len(names) != 1 or names[0] not in known:
                unmapped.append(f"{path.name}::{node.name} {names}")
    assert not unmapped, f"contract tests without exactly one known behaviour: {unmapped}"
