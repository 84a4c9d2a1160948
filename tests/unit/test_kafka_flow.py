"""Fetch flow control (``FlowControl``): hold a busy consumer, pause only a stuck partition.

The decisions alone, against a stand-in that records ``pause``/``resume`` calls (what the
real Consumer does with them is measured in benchmarks/bench_kafka.py ``--backlog``).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("confluent_kafka")

from brokerkit.backends.kafka._flow import HOLD, FlowControl
from brokerkit.backends.kafka._partition import PAUSE_BYTES, PAUSE_SPAN, RESUME_SPAN, Key

A: Key = ("t", 0)
B: Key = ("t", 1)


class _Consumer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[Key]]] = []

    def pause(self, tps: list[Any]) -> None:
        self.calls.append(("pause", [(tp.topic, tp.partition) for tp in tps]))

    def resume(self, tps: list[Any]) -> None:
        self.calls.append(("resume", [(tp.topic, tp.partition) for tp in tps]))


def test_a_full_partition_holds_consume_until_its_backlog_is_under_the_resume_mark() -> None:
    flow, consumer = FlowControl(), _Consumer()
    flow.backlog[A] = (PAUSE_SPAN - 1, 0)
    assert not flow.hold(consumer, {A}, 0.0)
    flow.backlog[A] = (PAUSE_SPAN, 0)
    assert flow.hold(consumer, {A}, 1.0)
    flow.backlog[A] = (RESUME_SPAN, 0)  # below the pause mark, not yet under the resume mark
    assert flow.hold(consumer, {A}, 1.0 + HOLD / 2)
    flow.backlog[A] = (RESUME_SPAN - 1, 0)
    assert not flow.hold(consumer, {A}, 1.0 + HOLD * 0.9)
    assert consumer.calls == []  # a busy consumer is never paused


def test_bytes_count_like_offsets() -> None:
    flow, consumer = FlowControl(), _Consumer()
    flow.backlog[A] = (1, PAUSE_BYTES)
    assert flow.hold(consumer, {A}, 0.0)


def test_a_partition_full_for_the_hold_time_is_paused_and_the_others_flow_again() -> None:
    flow, consumer = FlowControl(), _Consumer()
    flow.backlog[A] = (PAUSE_SPAN, 0)
    flow.backlog[B] = (10, 0)
    assert flow.hold(consumer, {A, B}, 0.0)
    assert flow.hold(consumer, {A, B}, HOLD / 2)
    assert not flow.hold(consumer, {A, B}, HOLD)  # paused: consume serves B (and rebalances)
    assert consumer.calls == [("pause", [A])]
    assert not flow.hold(consumer, {A, B}, HOLD * 3)
    assert consumer.calls == [("pause", [A])]  # paused once
    flow.backlog[A] = (RESUME_SPAN - 1, 0)
    assert not flow.hold(consumer, {A, B}, HOLD * 4)
    assert consumer.calls == [("pause", [A]), ("resume", [A])]
    assert flow.paused == set()


def test_a_partition_given_up_is_forgotten() -> None:
    flow, consumer = FlowControl(), _Consumer()
    flow.backlog[A] = (PAUSE_SPAN, 0)
    assert flow.hold(consumer, {A}, 0.0)
    assert not flow.hold(consumer, {A}, HOLD)
    assert flow.paused == {A}
    assert not flow.hold(consumer, {B}, HOLD * 2)  # A revoked while paused
    assert flow.paused == set()
    flow.backlog[A] = (PAUSE_SPAN, 0)
    assert flow.hold(consumer, {A}, HOLD * 3)  # assigned again: a fresh hold first
