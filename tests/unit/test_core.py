"""Pure logic of the core: registry, options, validation, envelope, shared mechanisms."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from pydantic import Field

import brokerkit
from brokerkit._dedup import DedupWindow
from brokerkit._dlq import build_envelope, split_envelope
from brokerkit._fifo import GroupGate
from brokerkit._options import Options, parse_options
from brokerkit._registry import backend_class, known_schemes
from brokerkit._validate import check_headers, check_name, check_seconds, check_token
from brokerkit.backends.base import Backend
from brokerkit.backends.memory import MemoryBackend


def test_public_api_is_pinned() -> None:
    assert brokerkit.__all__ == sorted(brokerkit.__all__, key=str)
    assert set(brokerkit.__all__) == {
        "AlreadySettled", "App", "Broker", "BrokerRefused", "BrokerURL", "BrokerUnavailable",
        "BrokerkitError", "BrowsedMessage", "Capabilities", "Codec", "ConfigError", "Consumer",
        "DeadLetterInfo", "InvalidArgument", "InvalidMessage", "InvalidName", "JsonCodec",
        "LeaseExpired", "Message", "MessageTooLarge", "Middleware", "Outcome", "Outgoing",
        "PublishResult", "QueueStats", "Reject", "ResourceClosed", "RetryPolicy", "Route",
        "SyncBroker", "UnsupportedFeature", "__version__",
        "connect", "from_backend",
    }  # fmt: skip


def test_import_brokerkit_imports_no_driver() -> None:
    code = (
        "import sys, brokerkit; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('redis', 'nats', 'confluent_kafka', 'aio_pika', 'aiormq', 'boto3', 'botocore', "
        "'prometheus_client', 'opentelemetry')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_error_tree() -> None:
    for name in (
        "ConfigError", "InvalidName", "InvalidArgument", "MessageTooLarge", "UnsupportedFeature",
        "BrokerUnavailable", "BrokerRefused", "LeaseExpired", "AlreadySettled", "ResourceClosed",
    ):  # fmt: skip
        assert issubclass(getattr(brokerkit, name), brokerkit.BrokerkitError)
    assert issubclass(brokerkit.InvalidMessage, brokerkit.InvalidArgument)
    assert issubclass(brokerkit.InvalidArgument, ValueError)


def test_builtins_are_found_through_entry_points_like_third_party_ones() -> None:
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="brokerkit.backends")}
    assert "memory" in names
    assert backend_class("memory") is MemoryBackend
    assert "memory" in known_schemes()


def test_unknown_scheme_lists_known_ones() -> None:
    with pytest.raises(brokerkit.ConfigError, match=r"unknown broker scheme 'nope'.*memory"):
        brokerkit.connect("nope://x")


class _Opts(Options):
    window: float = Field(300.0, gt=0)
    sasl_password: str = ""


def test_options_typed_and_unknown_rejected_without_echoing_values() -> None:
    url = brokerkit.BrokerURL.parse("x://h?window=2.5")
    assert parse_options(url, _Opts).window == 2.5
    with pytest.raises(brokerkit.ConfigError, match="unknown parameter 'nope'"):
        parse_options(brokerkit.BrokerURL.parse("x://h?nope=1"), _Opts)
    with pytest.raises(brokerkit.ConfigError, match="'window'") as info:
        parse_options(brokerkit.BrokerURL.parse("x://h?window=-hunter2"), _Opts)
    assert "hunter2" not in str(info.value)


def test_memory_capabilities_are_pinned() -> None:
    caps = brokerkit.connect("memory://pin").capabilities
    assert (caps.max_message_bytes, caps.dedup_window, caps.dedup_window_configurable) == (
        4 * 1024 * 1024, 300.0, True,
    )  # fmt: skip
    assert caps.fan_out and caps.ack_flush_interval == 0
    assert brokerkit.connect("memory://pin?dedup_window=2").capabilities.dedup_window == 2


@pytest.mark.parametrize("bad", ["", "a" * 65, "a.b", "a b", "żółw", "-a", None, 3])
def test_bad_names(bad: object) -> None:
    with pytest.raises(brokerkit.InvalidName):
        check_name("queue", bad)


def test_good_names_and_tokens() -> None:
    assert check_name("queue", "A-z_0" + "x" * 59) == "A-z_0" + "x" * 59
    assert check_token("fifo_group", "a.b*>/:!~") == "a.b*>/:!~"
    assert check_token("dedup_id", None) is None
    for bad in ("", "x" * 129, "a b", "ä"):
        with pytest.raises(brokerkit.InvalidName):
            check_token("dedup_id", bad)


def test_headers_rules() -> None:
    assert check_headers(None, max_headers=32, max_bytes=8192) == {}
    for bad in ({"a": 1}, {"x-brokerkit-dlq-id": "1"}, {"": "v"}, {f"k{i}": "" for i in range(33)}):
        with pytest.raises(brokerkit.InvalidMessage):
            check_headers(bad, max_headers=32, max_bytes=8192)
    with pytest.raises(brokerkit.InvalidMessage):
        check_headers({"k": "ü" * 4096}, max_headers=32, max_bytes=8192)  # 8193 bytes


def test_seconds_rules() -> None:
    assert check_seconds("delay", None, allow_none=True) is None
    assert check_seconds("delay", 0) == 0.0
    for bad in (-1, float("inf"), float("nan"), True, "1"):
        with pytest.raises(brokerkit.InvalidArgument):
            check_seconds("delay", bad)
    with pytest.raises(brokerkit.InvalidArgument):
        check_seconds("ack_timeout", 0, positive=True)


def test_envelope_round_trip_keeps_user_headers_exact() -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    env = build_envelope(
        queue="orders", original_id="42", reason="bad input:\nline 2 ✓", attempts=3,
        fifo_group="g.1", dedup_id=None, died_at=when,
    )  # fmt: skip
    assert all(v.isascii() and "\n" not in v for v in env.values())
    user = {"a": "1", "ü": "ö\n"}
    headers, info = split_envelope({**user, **env})
    assert headers == user
    assert info is not None
    assert (info.queue, info.original_id, info.reason, info.attempts) == (
        "orders", "42", "bad input:\nline 2 ✓", 3,
    )  # fmt: skip
    assert (info.died_at, info.fifo_group, info.dedup_id) == (when, "g.1", None)
    assert split_envelope(user) == (user, None)


def test_dedup_window_expires_in_order() -> None:
    now = [0.0]
    window = DedupWindow(10.0, clock=lambda: now[0])
    assert window.claim("a", "1") is None
    assert window.claim("a", "2") == "1"
    now[0] = 5.0
    assert window.claim("b", "3") is None
    now[0] = 10.5
    assert window.get("a") is None and window.get("b") == "3"
    assert window.claim("a", "4") is None and len(window) == 2


def test_group_gate_one_out_at_a_time_in_order() -> None:
    gate: GroupGate[int] = GroupGate()
    assert gate.push("g", 1) is True
    assert gate.push("g", 2) is False
    assert gate.take("g") == 1
    with pytest.raises(RuntimeError):
        gate.take("g")
    assert gate.give_back("g") == 1  # nack: the head again
    assert gate.take("g") == 1
    assert gate.done("g") == 2
    assert gate.take("g") == 2 and gate.done("g") is None and len(gate) == 0


def test_publish_results_fast_path_makes_ordinary_frozen_results() -> None:
    import dataclasses

    from brokerkit._message import PublishResult, publish_results

    fast = publish_results(["0-1", "2-7"])
    assert fast == [PublishResult("0-1"), PublishResult("2-7")]
    assert all(type(r) is PublishResult and r.duplicate is None for r in fast)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast[0].id = "x"  # type: ignore[misc]


class _NoDeleteBackend(MemoryBackend):
    """A backend that keeps the base class's ``delete_queue``, as third-party ones may."""

    delete_queue = Backend.delete_queue


async def test_delete_queue_without_backend_support_is_unsupported_and_keeps_messages() -> None:
    backend = _NoDeleteBackend.from_url(brokerkit.BrokerURL.parse("memory://no-delete"))
    async with brokerkit.from_backend(backend) as broker:
        await broker.publish("kept", b"still here")
        with pytest.raises(brokerkit.UnsupportedFeature, match="cannot delete"):
            await broker.delete_queue("kept")
        async with broker.consumer("kept", "g") as consumer:
            msg = await asyncio.wait_for(consumer.__anext__(), 5.0)
            assert msg.body == b"still here"
            await msg.ack()
