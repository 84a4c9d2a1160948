"""``brokerkit check``'s progress names the wait of a test that waits out a fixed window.

SQS fixes its dedup window at 300 s, so each dedup window test there waits five minutes
after a plain ``[ 40/87] dedup window`` line: the line now says what the wait is for.
Pure logic: capabilities are fixed when a backend is built, before any I/O.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import pytest

from brokerkit._check_progress import Progress, fixed_wait

SQS = "sqs://?endpoint=http://127.0.0.1:4566&region=us-east-1"


def test_a_fixed_window_is_named_with_its_length() -> None:
    assert fixed_wait("dedup window", SQS) == "waits out the broker's fixed 300 s dedup window"


@pytest.mark.parametrize(
    ("behaviour", "url"),
    [
        ("dedup window", "memory://"),  # configurable: the suite shortens it to 2 s
        ("dedup window", "redis://127.0.0.1:6379/0"),
        ("nack", SQS),  # no window to wait out
        ("dedup window", None),  # a test without a broker
        ("dedup window", "nope://x"),  # not a URL brokerkit knows: nothing to say
    ],
)
def test_no_note_where_nothing_fixed_is_waited_out(behaviour: str, url: str | None) -> None:
    assert fixed_wait(behaviour, url) is None


@dataclass
class _Marker:
    args: tuple[str, ...]


@dataclass
class _Callspec:
    params: dict[str, Any]


@dataclass
class _Item:
    nodeid: str
    behaviour: str
    url: str
    callspec: _Callspec = field(init=False)

    def __post_init__(self) -> None:
        self.callspec = _Callspec({"broker_url": self.url})

    def get_closest_marker(self, name: str) -> _Marker | None:
        return _Marker((self.behaviour,)) if name == "behaviour" else None


@dataclass
class _Session:
    items: list[_Item]


def _plain_lines(url: str) -> list[str]:
    items = [
        _Item(f"t.py::test_dedup_same_id[{url}]", "dedup", url),
        _Item(f"t.py::test_dedup_window_expires[{url}]", "dedup window", url),
        _Item(f"t.py::test_dedup_window_is_fixed[{url}]", "dedup window", url),
        _Item(f"t.py::test_nack_redelivers[{url}]", "nack", url),
    ]
    stream = io.StringIO()
    progress = Progress(stream, fancy=False)
    progress.pytest_collection_finish(_Session(items))
    for item in items:
        progress.pytest_runtest_logstart(item.nodeid)
        progress.pytest_runtest_logfinish(item.nodeid)
    return stream.getvalue().splitlines()


def test_each_test_that_waits_out_the_window_gets_a_line_saying_so() -> None:
    assert _plain_lines(SQS) == [
        "[0/4] dedup",
        f"[1/4] dedup window: test_dedup_window_expires[{SQS}] waits out the broker's fixed "
        "300 s dedup window",
        f"[2/4] dedup window: test_dedup_window_is_fixed[{SQS}] waits out the broker's fixed "
        "300 s dedup window",
        "[3/4] nack",
    ]


def test_a_configurable_window_keeps_one_line_per_behaviour() -> None:
    assert _plain_lines("memory://") == ["[0/4] dedup", "[1/4] dedup window", "[3/4] nack"]
