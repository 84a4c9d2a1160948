"""A delivery marked corrupt (``Delivery.defect``, or a body over max_message_bytes) is
dead-lettered by the facade, never handed out; its neighbours are untouched.

Facade logic, on ``memory://`` and its test-only injection point (the contract suite's
test_broker_side_input proves the rule on every broker with raw entries of its own).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import brokerkit
from brokerkit.backends import (
    Delivery,
    MessageTooLarge,
    Outgoing,
    PublishCopy,
    QueueRef,
    ReceiverSettings,
    json_headers,
)
from brokerkit.backends.memory import MemoryBackend, inject_raw


def _name() -> str:
    return f"corrupt{uuid.uuid4().hex[:12]}"


async def _drain(broker: brokerkit.Broker, queue: str, want: int) -> list[brokerkit.Message]:
    got: list[brokerkit.Message] = []
    async with broker.consumer(queue) as consumer:
        async with asyncio.timeout(5.0):
            async for msg in consumer:
                got.append(msg)
                await msg.ack()
                if len(got) == want:
                    break
    return got


async def _dead(broker: brokerkit.Broker, queue: str) -> list[brokerkit.Message]:
    got: list[brokerkit.Message] = []
    async with broker.dead_letters(queue) as consumer:
        async with asyncio.timeout(5.0):
            async for msg in consumer:
                got.append(msg)
                await msg.ack()
                break
    return got


async def test_a_corrupt_delivery_is_dead_lettered_with_its_defect_and_the_rest_delivered() -> None:
    name = _name()
    async with brokerkit.connect(f"memory://{name}") as broker:
        await broker.publish("q", b"before")
        inject_raw(name, "q", b"raw", {"ok": "kept", "n": 7})  # a header of the wrong type
        await broker.publish("q", b"after")
        assert [m.body async for m in broker.browse("q")] == [b"before", b"raw", b"after"]
        good = await _drain(broker, "q", 2)
        assert [(m.body, m.attempt) for m in good] == [(b"before", 1), (b"after", 1)]
        (dead,) = await _dead(broker, "q")
        assert dead.body == b"raw" and dict(dead.headers) == {"ok": "kept"}
        info = dead.dead_letter_info
        assert info is not None and info.reason == "corrupt: header 'n' is int, not a string"


async def test_an_oversize_body_goes_to_the_dlq_without_it_and_the_reason_says_so() -> None:
    name = _name()
    async with brokerkit.connect(f"memory://{name}?max_message_bytes=262144") as broker:
        await broker.publish("q", b"before")
        inject_raw(name, "q", b"x" * 262145, {"k": "v"})
        await broker.publish("q", b"after")
        good = await _drain(broker, "q", 2)
        assert [m.body for m in good] == [b"before", b"after"]
        (dead,) = await _dead(broker, "q")
        assert dead.body == b"" and dict(dead.headers) == {"k": "v"}
        assert dead.dead_letter_info is not None
        reason = dead.dead_letter_info.reason
        assert reason.startswith("corrupt: body of 262145 bytes over max_message_bytes")
        assert "DLQ copy without its body of 262145 bytes" in reason


async def test_a_foreign_message_is_delivered_as_it_is() -> None:
    name = _name()
    async with brokerkit.connect(f"memory://{name}") as broker:
        await broker.declare("q")
        inject_raw(name, "q", b"foreign", {"origin": "elsewhere"})
        (msg,) = await _drain(broker, "q", 1)
        assert (msg.body, dict(msg.headers), msg.attempt) == (
            b"foreign",
            {"origin": "elsewhere"},
            1,
        )


def test_a_delivery_is_sound_unless_marked() -> None:
    assert Delivery("1", b"", {}, None, None, 1, None).defect is None


def test_json_headers_names_each_defect_and_keeps_what_decodes() -> None:
    assert json_headers(b'{"a":"1"}') == ({"a": "1"}, None)
    assert json_headers(b"{not json") == ({}, "headers field is not JSON")
    assert json_headers(b'{"a":"\xff"}') == ({}, "headers field is not JSON")
    assert json_headers(b"[1,2]") == ({}, "headers field is not a JSON object (an array)")
    assert json_headers(b"null") == ({}, "headers field is not a JSON object (null)")
    assert json_headers(b'{"a":"1","b":null}') == (
        {"a": "1"},
        "header 'b' is NoneType, not a string",
    )


class _PickyBackend(MemoryBackend):
    """memory://, but its DLQ refuses any copy with a body (as a DLQ with a smaller size
    limit than its queue would, Kafka's per-topic max.message.bytes say)."""

    async def subscribe(self, queue: QueueRef, group: str, settings: ReceiverSettings) -> Any:
        receiver = await super().subscribe(queue, group, settings)
        plain = receiver.dead_letter

        async def dead_letter(delivery: Any, copy: Outgoing, publish: PublishCopy) -> None:
            if copy.body:
                raise MessageTooLarge("the DLQ takes no body this large")
            await plain(delivery, copy, publish)

        receiver.dead_letter = dead_letter  # type: ignore[method-assign]
        return receiver


async def test_a_copy_the_dlq_refuses_goes_as_the_envelope_alone_never_redelivered() -> None:
    name = _name()
    backend = _PickyBackend.from_url(brokerkit.BrokerURL.parse(f"memory://{name}"))
    async with brokerkit.from_backend(backend) as broker:
        await broker.declare("q")
        inject_raw(name, "q", b"raw", {"k": "v", "n": 1})
        await broker.publish("q", b"after")
        (good,) = await _drain(broker, "q", 1)
        assert (good.body, good.attempt) == (b"after", 1)
        (dead,) = await _dead(broker, "q")
        assert (dead.body, dict(dead.headers)) == (b"", {})
        info = dead.dead_letter_info
        assert info is not None and info.reason == (
            "corrupt: header 'n' is int, not a string"
            " (DLQ copy without body and headers: the DLQ refused it, MessageTooLarge)"
        )


def test_a_third_party_backend_has_no_raw_writer_so_the_behaviour_is_unsupported() -> None:
    from contract_tests._raw import raw_writer

    assert raw_writer("thirdparty://host") is None  # the test then skips "unsupported: ..."
    assert raw_writer("memory://x") is not None
