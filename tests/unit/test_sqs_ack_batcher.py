"""SQS's AckBatcher as pure logic: a stand-in link records the DeleteMessageBatch calls.

The window is kept by a timer thread that sends the batch itself (no event loop needed),
a full batch goes to the connection's executor, and ``flush`` waits for every delete on
its way, wherever it was sent from.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

pytest.importorskip("boto3")

from brokerkit.backends.sqs._acks import AckBatcher


class _Link:
    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self.executor = executor
        self.calls: list[tuple[str, list[str]]] = []
        self._lock = threading.Lock()

    def run(self, op: str, **kwargs: Any) -> Any:
        with self._lock:
            self.calls.append((op, [e["ReceiptHandle"] for e in kwargs["Entries"]]))
        return {"Successful": [{"Id": e["Id"]} for e in kwargs["Entries"]], "Failed": []}


def _wait_for(condition: Any, limit: float = 2.0) -> None:
    deadline = time.monotonic() + limit
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)


async def test_the_window_ends_in_a_thread_and_a_full_batch_goes_at_once() -> None:
    with ThreadPoolExecutor(2) as pool:
        link = _Link(pool)
        acks = AckBatcher(link, "url", 0.05)  # type: ignore[arg-type]
        acks.add("h0")
        # the loop is held up (this blocks it): the timer thread sends the batch itself
        _wait_for(lambda: bool(link.calls))
        assert link.calls == [("delete_message_batch", ["h0"])]
        for i in range(10):
            acks.add(f"f{i}")
        await acks.flush()
        assert link.calls[1] == ("delete_message_batch", [f"f{i}" for i in range(10)])


async def test_flush_after_the_executor_is_shut_down_deletes_and_does_not_hang() -> None:
    pool = ThreadPoolExecutor(1)
    pool.shutdown()
    link = _Link(pool)
    acks = AckBatcher(link, "url", 30.0)  # type: ignore[arg-type]
    acks.add("a", urgent=True)
    assert acks.urgent
    await acks.flush()  # before: flush() raised (submit after shutdown), the ack unsent
    assert link.calls == [("delete_message_batch", ["a"])] and not acks.urgent
