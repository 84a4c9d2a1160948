"""The core's LeaseBook and DedupWindow: what Kafka's hand-out schedule relies on."""

from __future__ import annotations

import math

import pytest

from brokerkit.backends import DedupWindow, LeaseBook, LeaseExpired


def test_a_take_leases_in_order_and_an_expired_lease_makes_the_rest_due_again() -> None:
    book: LeaseBook[int] = LeaseBook()
    for key in range(5):
        book.add(key, None, 0.0)
    leases = book.take(10, 0.0, 5.0)
    assert [lease.key for lease in leases] == [0, 1, 2, 3, 4]
    tokens = [lease.token for lease in leases]
    assert tokens == list(range(tokens[0], tokens[0] + 5))  # one run: one heap entry
    book.settle(0, leases[0].token, 1.0)
    book.extend(1, leases[1].token, 20.0, 1.0)
    assert sorted(book.reclaim(6.0)) == [2, 3, 4]
    assert book.holds(1, leases[1].token, 6.0) and not book.leased(2)
    with pytest.raises(LeaseExpired):
        book.settle(2, leases[2].token, 6.0)
    again = book.take(10, 6.0, 5.0)
    assert [lease.key for lease in again] == [2, 3, 4]
    assert 0 not in book


def test_two_books_never_hand_out_the_same_token() -> None:
    a: LeaseBook[str] = LeaseBook()
    b: LeaseBook[str] = LeaseBook()
    a.add("x", None, 0.0)
    b.add("x", None, 0.0)
    (la,) = a.take(1, 0.0, 5.0)
    (lb,) = b.take(1, 0.0, 5.0)
    assert la.token != lb.token
    with pytest.raises(LeaseExpired):
        a.settle("x", lb.token, 0.0)


def test_staged_items_have_no_deadline_until_extend_many_starts_their_lease() -> None:
    book: LeaseBook[int] = LeaseBook()
    for key in range(4):
        book.add(key, None, 0.0)
    staged = book.take(4, 0.0, math.inf)
    assert book.reclaim(1e9) == []  # never expire while staged
    book.requeue(2, staged[2].token, 0.0, 1.0)  # given back meanwhile
    started = book.extend_many([lease.token for lease in staged], 11.0, 1.0)
    assert [book.key_of(token) for token in started] == [0, 1, 3]
    assert sorted(book.reclaim(12.0)) == [0, 1, 3]


def test_a_group_holds_its_order_through_nack_delays_and_a_due_time_at_add() -> None:
    book: LeaseBook[int] = LeaseBook()
    book.add(1, "g", 0.0)
    book.add(2, "g", 0.0)
    book.add(3, None, 0.0, due=10.0)  # e.g. a nack delay restored after a restart
    (first,) = book.take(10, 0.0, 5.0)
    assert first.key == 1
    book.requeue(1, first.token, 3.0, 1.0)
    assert book.take(10, 2.0, 5.0) == []  # 2 waits behind 1, 3 is not due
    assert book.next_wake() == 3.0
    assert [lease.key for lease in book.take(10, 3.0, 5.0)] == [1]
    leases = book.take(10, 10.0, 5.0)  # 1's lease (till 8) ended: due again before 2
    assert [lease.key for lease in leases] == [1, 3]
    assert book.settle(1, leases[0].token, 10.0) == 2
    assert [lease.key for lease in book.take(10, 10.0, 5.0)] == [2]


def test_dedup_window_judges_by_the_clock_it_is_given() -> None:
    now = [1_000]
    window = DedupWindow(2_000, clock=lambda: now[0])
    assert window.claim("a", "0") is None
    now[0] = 2_999
    assert window.claim("a", "1") == "0"
    assert window.claim("b", "1") is None
    now[0] = 3_000  # a's window is over: claimed anew
    assert window.claim("a", "2") is None
    now[0] = 4_000
    assert window.claim("a", "3") == "2"


def test_dedup_window_forgets_an_expired_entry_behind_a_younger_one() -> None:
    now = [10_000]
    window = DedupWindow(2_000, clock=lambda: now[0])
    window.claim("young", "0")
    now[0] = 5_000  # a clock that went back (another producer's timestamps)
    window.claim("old", "1")
    now[0] = 9_000  # "old" expired at 7000 though "young" (till 12000) is ahead of it
    assert window.claim("old", "2") is None
    assert window.get("young") == "0"


def test_an_item_added_at_a_later_now_than_a_takes_is_not_lost() -> None:
    # a caller reading its clock once per loop may add at t=5.001 and take at t=5.0
    book: LeaseBook[int] = LeaseBook()
    book.add(1, None, 5.001)
    book.add_many([(2, None)], 5.002)
    assert [lease.key for lease in book.take(10, 5.0, 5.0)] == [1, 2]


def test_a_backend_whose_receipt_is_the_token_settles_by_it_alone() -> None:
    book: LeaseBook[str] = LeaseBook()
    for key in "abc":
        book.add(key, "g" if key != "c" else None, 0.0)
    keys, first = book.take_keys(10, 0.0, 5.0)
    assert (keys, book.key_of(first), book.key_of(first + 1)) == (["a", "c"], "a", "c")
    assert book.extend_token(first + 1, 20.0, 1.0) == "c"
    assert book.requeue_token(first, 0.0, 1.0) == "a"
    assert not book.holds_token(first, 1.0)
    with pytest.raises(LeaseExpired):
        book.settle_token(first, 1.0)
    keys, again = book.take_keys(10, 1.0, 5.0)
    assert keys == ["a"]
    assert book.settle_token(again, 2.0) == "a"
    assert book.take_keys(10, 2.0, 5.0)[0] == ["b"]  # the group moved on
    assert book.settle_token(first + 1, 10.0) == "c"  # extended to 20
