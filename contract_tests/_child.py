"""A child process of the contract suite: a real consumer to SIGKILL, a real racing publisher.

Run by ``_helpers.Child`` with the parent's ``brokerkit`` first on ``sys.path`` and the
real broker URL, so the broker sees another process (its own connection, its own
client-library state) and a crash is a crash, not a clean close.

    _child.py hold URL QUEUE GROUP MAX_ATTEMPTS ACK_TIMEOUT
        receive one message, print ``got ID ATTEMPT``, then hang (the parent kills it)
    _child.py race URL QUEUE DEDUP_ID COUNT
        open, print ``ready``, wait for a ``go`` line, publish COUNT times with DEDUP_ID
        concurrently, print ``done N`` with N the publishes that said duplicate=False
"""

from __future__ import annotations

import asyncio
import sys

import brokerkit


async def _hold(url: str, queue: str, group: str, max_attempts: str, ack_timeout: str) -> None:
    async with brokerkit.connect(url) as broker:
        consumer = broker.consumer(
            queue, group, max_attempts=int(max_attempts), ack_timeout=float(ack_timeout)
        )
        await consumer.open()
        msg = await consumer.__anext__()
        print(f"got {msg.id} {msg.attempt}", flush=True)
        await asyncio.Event().wait()  # never settles; the parent SIGKILLs this process


async def _race(url: str, queue: str, dedup_id: str, count: str) -> None:
    async with brokerkit.connect(url) as broker:
        print("ready", flush=True)  # connected: the race starts on the parent's word
        line = await asyncio.to_thread(sys.stdin.readline)
        if line.strip() != "go":
            raise SystemExit(f"expected 'go', got {line!r}")
        results = await asyncio.gather(
            *(
                broker.publish(queue, b"raced", dedup_id=dedup_id, headers={"n": str(i)})
                for i in range(int(count))
            )
        )
        print(f"done {sum(1 for r in results if r.duplicate is False)}", flush=True)


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "hold":
        asyncio.run(_hold(*args))
    elif command == "race":
        asyncio.run(_race(*args))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
