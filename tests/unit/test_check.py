"""How ``brokerkit check`` judges a behaviour from its tests' outcomes (pure logic, no broker).

A behaviour passes only on complete evidence: every test ran and passed, or skipped
because ``capabilities`` declares an optional feature absent.
"""

from __future__ import annotations

from brokerkit._check import FAIL, NOT_RUN, PASS, UNSUPPORTED, _judge, _Test
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
