"""The fault tests' ``warnings`` figure: brokerkit's warnings, counted by message."""

from __future__ import annotations

import logging

import pytest

from contract_tests._faults import WARNINGS_SHOWN, library_warnings


def test_counts_brokerkit_warnings_and_worse_by_message(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("brokerkit.backends.example")
    log.warning("cannot subscribe yet: %s", "refused")
    log.warning("cannot subscribe yet: %s", "refused")
    log.error("book not written")
    log.info("not a warning")
    logging.getLogger("aiormq").warning("not brokerkit's")
    logging.getLogger("brokerkitten").warning("not brokerkit's either")
    assert library_warnings(caplog.records) == {
        "brokerkit.backends.example: cannot subscribe yet: refused": 2,
        "brokerkit.backends.example: book not written": 1,
    }


def test_figures_quote_the_most_frequent_only(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("brokerkit")
    for n in range(WARNINGS_SHOWN + 3):
        for _ in range(n + 1):
            log.warning("message %d", n)
    shown = library_warnings(caplog.records)
    assert len(shown) == WARNINGS_SHOWN
    assert "brokerkit: message 0" not in shown  # the rarest are left out
    assert shown[f"brokerkit: message {WARNINGS_SHOWN + 2}"] == WARNINGS_SHOWN + 3
