"""Every ``Capabilities`` field has its bound test in ``contract_tests/test_bounds.py``.

``test_bounds.COVERS`` maps each field to the tests that fail when a backend exceeds it;
a field added to ``Capabilities`` without one (or exempt with a reason, ``EXEMPT``)
fails here, and so does a listed test that is missing, not a contract test or carries
no behaviour marker of the suite.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import warnings
from types import ModuleType

import pytest

from brokerkit.backends.base import Capabilities
from contract_tests import BEHAVIOURS, OPTIONAL_BEHAVIOURS

with warnings.catch_warnings():  # the suite's conftest registers "behaviour"; not loaded here
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    test_bounds = importlib.import_module("contract_tests.test_bounds")


def _problems(fields: set[str], module: ModuleType) -> list[str]:
    """What keeps ``fields`` from each having a bound test in ``module``."""
    covers: dict[str, tuple[str, ...]] = module.COVERS
    exempt: dict[str, str] = module.EXEMPT
    missing = fields - set(covers) - set(exempt)
    out = [f"{name}: no bound test in COVERS" for name in sorted(missing)]
    out += [f"{name}: not a Capabilities field" for name in sorted(set(covers) - fields)]
    out += [f"{name}: both covered and exempt" for name in sorted(set(covers) & set(exempt))]
    out += [f"{name}: exempt without a reason" for name, why in exempt.items() if not why.strip()]
    known = set(BEHAVIOURS) | set(OPTIONAL_BEHAVIOURS)
    for name, tests in sorted(covers.items()):
        if not tests:
            out.append(f"{name}: an empty list of tests")
        for test in tests:
            fn = getattr(module, test, None)
            if not test.startswith("test_") or not inspect.iscoroutinefunction(fn):
                out.append(f"{name}: {test} is not an async test of {module.__name__}")
                continue
            marks = [m.args[0] for m in getattr(fn, "pytestmark", []) if m.name == "behaviour"]
            if not marks or not set(marks) <= known:
                out.append(f"{name}: {test} has no behaviour marker of the suite ({marks})")
    return out


def test_every_capabilities_field_has_a_bound_test() -> None:
    fields = {f.name for f in dataclasses.fields(Capabilities)}
    assert _problems(fields, test_bounds) == []


def test_every_test_of_test_bounds_is_listed_for_a_field() -> None:
    listed = {t for tests in test_bounds.COVERS.values() for t in tests}
    defined = {n for n in vars(test_bounds) if n.startswith("test_")}
    assert defined - listed == set()


def test_a_field_without_a_test_is_reported() -> None:
    """The check can fail: a new field, a stale entry and a missing test are each named."""
    fields = {f.name for f in dataclasses.fields(Capabilities)} | {"max_new_bound"}
    module = ModuleType("fake_bounds")
    module.COVERS = {**test_bounds.COVERS, "gone": ("test_nowhere",)}  # type: ignore[attr-defined]
    module.EXEMPT = dict(test_bounds.EXEMPT)  # type: ignore[attr-defined]
    for tests in test_bounds.COVERS.values():
        for test in tests:
            setattr(module, test, getattr(test_bounds, test))
    problems = _problems(fields, module)
    assert "max_new_bound: no bound test in COVERS" in problems
    assert "gone: not a Capabilities field" in problems
    assert any("test_nowhere is not an async test" in p for p in problems)
    assert len(problems) == 3, problems
