"""The public backend toolkit (``brokerkit.backends``): pinned, and its pure logic tested."""

from __future__ import annotations

import math

import pytest

import brokerkit
import brokerkit.backends as toolkit
from brokerkit.backends import (
    Backend,
    BrokerRefused,
    BrokerUnavailable,
    ConfigError,
    ErrorMap,
    HostPort,
    LeaseBook,
    LeaseExpired,
    Options,
    QueueRef,
    Receiver,
    parse_options,
    retry_unavailable_blocking,
)


def test_toolkit_is_pinned() -> None:
    assert set(toolkit.__all__) == {
        "DEDUP_ID_HEADER", "FIFO_GROUP_HEADER", "HEADER_PREFIX", "NO_EXTRAS", "NO_HEADERS",
        "Backend", "BrokerRefused", "BrokerURL", "BrokerUnavailable", "Capabilities",
        "ConfigError", "DedupWindow", "Delivery", "ErrorMap", "GroupGate", "HostPort",
        "LeaseBook", "LeaseExpired", "Leased", "MessageTooLarge", "Options", "Outgoing",
        "PublishCopy", "PublishResult", "QueueRef", "QueueStats", "Receiver", "ReceiverSettings",
        "ResourceClosed", "UnsupportedFeature", "parse_options", "publish_results",
        "retry_unavailable", "retry_unavailable_blocking", "header_defect", "json_headers",
        "str_headers", "valid_token",
    }  # fmt: skip
    for name in toolkit.__all__:
        assert getattr(toolkit, name) is not None


def test_the_seam_has_seven_required_methods() -> None:
    required = Backend.__abstractmethods__ | Receiver.__abstractmethods__
    assert sorted(Backend.__abstractmethods__) == ["from_url", "publish", "subscribe"]
    assert sorted(Receiver.__abstractmethods__) == ["ack", "extend", "nack", "receive"]
    assert len(required) == 7


def test_queue_ref_names_the_queue_or_its_dlq() -> None:
    ref = QueueRef("orders")
    assert ref.dlq == QueueRef("orders", dead_letters=True)
    assert ref.dlq.main == ref and ref.main == ref
    assert str(ref.dlq) == "orders (DLQ)"


class _DriverDown(OSError):
    pass


class _DriverSaidNo(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(f"refused: {code}")
        self.code = code


ERRORS = ErrorMap(
    (_DriverDown, lambda e: BrokerUnavailable("the broker is down")),
    (_DriverSaidNo, lambda e: None if e.code == "pass" else BrokerRefused("no", code=e.code)),  # type: ignore[attr-defined]
    (Exception, lambda e: ConfigError("anything else")),
)


def test_error_map_picks_the_first_matching_rule_and_keeps_the_cause() -> None:
    driver = _DriverSaidNo("NOPERM")
    with pytest.raises(BrokerRefused) as caught, ERRORS:
        raise driver
    assert caught.value.code == "NOPERM" and caught.value.__cause__ is driver
    with pytest.raises(BrokerUnavailable), ERRORS:
        raise _DriverDown("econnrefused")
    # a rule may pass on (None): the next rule that matches decides
    with pytest.raises(ConfigError), ERRORS:
        raise _DriverSaidNo("pass")


def test_error_map_passes_brokerkit_errors_and_cancellation_through() -> None:
    original = LeaseExpired("lost")
    with pytest.raises(LeaseExpired) as caught, ERRORS:
        raise original
    assert caught.value is original
    with pytest.raises(KeyboardInterrupt), ERRORS:
        raise KeyboardInterrupt
    assert ErrorMap().translate(ValueError("x")) is None


def test_parse_options_takes_a_mapping_too() -> None:
    class Opts(Options):
        partitions: int = 1

    assert parse_options({"partitions": "3"}, Opts).partitions == 3
    with pytest.raises(ConfigError, match="unknown parameter 'secret'") as caught:
        parse_options({"secret": "hunter2"}, Opts, scheme="x")
    assert "hunter2" not in str(caught.value)


def test_lease_book_hands_out_in_order_and_gates_fifo_groups() -> None:
    book: LeaseBook[int] = LeaseBook()
    for key, group in [(1, "a"), (2, "a"), (3, None), (4, "b")]:
        book.add(key, group, now=0.0)
    first = book.take(10, now=0.0, lease=5.0)
    assert [x.key for x in first] == [1, 3, 4]  # 2 waits behind 1 in group a
    by_key = {x.key: x for x in first}
    assert book.settle(1, by_key[1].token, now=1.0) == 2  # group a moves on
    assert [x.key for x in book.take(10, now=1.0, lease=5.0)] == [2]
    assert len(book) == 3


def test_lease_book_nack_keeps_the_group_held_until_due() -> None:
    book: LeaseBook[int] = LeaseBook()
    book.add(1, "a", 0.0)
    book.add(2, "a", 0.0)
    (one,) = book.take(10, 0.0, 5.0)
    book.requeue(1, one.token, due=3.0, now=1.0)
    assert book.take(10, now=2.0, lease=5.0) == []  # 2 may not overtake the nacked 1
    assert [x.key for x in book.take(10, now=3.0, lease=5.0)] == [1]


def test_lease_book_expires_leases_and_refuses_stale_tokens() -> None:
    book: LeaseBook[int] = LeaseBook()
    book.add(1, None, 0.0)
    (old,) = book.take(1, 0.0, 5.0)
    assert book.holds(1, old.token, 5.0)
    assert book.take(1, 4.9, 5.0) == []
    (new,) = book.take(1, 5.1, 5.0)  # the lease ended: handed out again
    assert new.token != old.token
    with pytest.raises(LeaseExpired):
        book.settle(1, old.token, 5.2)
    book.extend(1, new.token, deadline=20.0, now=6.0)
    assert book.take(1, 15.0, 5.0) == [] and book.holds(1, new.token, 15.0)
    book.settle(1, new.token, 15.0)
    assert len(book) == 0


def test_tokens_are_unique_across_books() -> None:
    # a stale receipt from one receiver's book must never match another's lease
    a: LeaseBook[int] = LeaseBook()
    b: LeaseBook[int] = LeaseBook()
    a.add(1, None, 0.0)
    b.add(1, None, 0.0)
    (x,) = a.take(1, 0.0, 5.0)
    (y,) = b.take(1, 0.0, 5.0)
    assert x.token != y.token
    with pytest.raises(LeaseExpired):
        b.settle(1, x.token, 1.0)


def test_staged_items_have_no_deadline_until_extended() -> None:
    book: LeaseBook[str] = LeaseBook()
    book.add("k", None, 0.0)
    (staged,) = book.take(1, 0.0, math.inf)
    assert book.take(1, 1e9, 5.0) == [] and book.holds("k", staged.token, 1e9)
    book.extend("k", staged.token, deadline=10.0, now=1.0)
    assert [x.key for x in book.take(1, 10.5, 5.0)] == ["k"]


def test_brokerkit_exports_broker_refused() -> None:
    assert brokerkit.BrokerRefused is BrokerRefused
    assert BrokerRefused("no", code=406).code == 406


def test_blocking_retry_retries_transient_errors_then_answers() -> None:
    calls: list[int] = []

    def read() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _DriverDown("not leader yet")
        return "answer"

    out = retry_unavailable_blocking(
        read, what="X", hosts=[HostPort("h", 1)], is_transient=lambda e: isinstance(e, OSError)
    )
    assert out == "answer" and len(calls) == 3


def test_blocking_retry_gives_up_with_broker_unavailable_or_passes_a_refusal_through() -> None:
    def down() -> None:
        raise _DriverDown("nobody home")

    with pytest.raises(BrokerUnavailable, match="X at h:1 did not answer after 2 attempts") as info:
        retry_unavailable_blocking(
            down, what="X", hosts=[HostPort("h", 1)], is_transient=lambda e: True, attempts=2
        )
    assert isinstance(info.value.__cause__, _DriverDown)

    def refused() -> None:
        raise _DriverSaidNo("denied")

    with pytest.raises(_DriverSaidNo):
        retry_unavailable_blocking(
            refused, what="X", hosts=[], is_transient=lambda e: isinstance(e, OSError)
        )
