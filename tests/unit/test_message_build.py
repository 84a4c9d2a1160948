"""``outgoing`` and ``publish_results``, the hot-path builders of the frozen message
classes, make ordinary instances: equal to the constructor's, of exactly that class, as
frozen, and as picklable (they are built through a slot-compatible class, then switched)."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest

from brokerkit import Outgoing, PublishResult
from brokerkit._message import outgoing, publish_results


def test_outgoing_builds_what_the_constructor_builds() -> None:
    built = outgoing(b"body", "group-1", "dedup-1", {"k": "v"})
    assert type(built) is Outgoing
    assert built == Outgoing(b"body", "group-1", "dedup-1", {"k": "v"})
    assert repr(built) == repr(Outgoing(b"body", "group-1", "dedup-1", {"k": "v"}))
    assert dataclasses.replace(built, body=b"other").body == b"other"
    assert pickle.loads(pickle.dumps(built)) == built
    assert copy.copy(built) == built
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.body = b"changed"  # type: ignore[misc]


def test_publish_results_builds_what_the_constructor_builds() -> None:
    results = publish_results(["0-1", "0-2"])
    assert [type(r) for r in results] == [PublishResult, PublishResult]
    assert results == [PublishResult("0-1"), PublishResult("0-2")]
    assert results[0].duplicate is None
    assert hash(results[0]) == hash(PublishResult("0-1"))
    assert dataclasses.asdict(results[1]) == {"id": "0-2", "duplicate": None}
    assert pickle.loads(pickle.dumps(results)) == results
    with pytest.raises(dataclasses.FrozenInstanceError):
        results[0].id = "changed"  # type: ignore[misc]
    assert publish_results([]) == []
