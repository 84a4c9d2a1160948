"""A consumer in its own process, for the ``crash`` behaviour: the parent SIGKILLs it.

Run as ``python -m contract_tests._crash_child SETTINGS_JSON`` with the broker URL in the
environment variable ``BROKERKIT_CHILD_URL`` (never on the command line). It consumes
one queue for one group and writes one JSON object per line to stdout:

* ``{"ev": "ready"}`` once the consumer is open;
* ``{"ev": "got", "body": ..., "id": ..., "attempt": n, "t": monotonic}`` for every
  message the iterator hands out, before it is handled (a failure then shows who got
  what, and in which order);
* ``{"ev": "ack", "body": ..., "id": ..., "attempt": n, "t": monotonic}`` after an
  ``ack()`` returned (``"ack_error"`` with the error's type if it raised);
* ``{"ev": "hold", ...}`` when it received a message whose body is in ``poison``: it then
  holds it, never settling, until it is killed (mid-handler);
* ``{"ev": "error", "type": ...}`` if iterating raised (the error type only: its text
  could carry a broker address).

It exits by itself when its stdin closes (the parent is gone) or after ``lifetime``
seconds, so a killed test run leaves no consumer behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from typing import Any

import brokerkit


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"ev": event, **fields}) + "\n")
    sys.stdout.flush()


async def consume(settings: dict[str, Any], stop: asyncio.Event) -> None:
    poison = {p.encode() for p in settings["poison"]}
    async with (
        brokerkit.connect(os.environ["BROKERKIT_CHILD_URL"]) as broker,
        broker.consumer(
            settings["queue"],
            settings["group"],
            max_attempts=settings["max_attempts"],
            ack_timeout=settings["ack_timeout"],
            prefetch=settings["prefetch"],
            close_timeout=0,
        ) as consumer,
    ):
        emit("ready")
        async for msg in consumer:
            fields = {"body": msg.body.decode(), "id": msg.id, "attempt": msg.attempt}
            emit("got", t=time.monotonic(), **fields)
            if msg.body in poison:
                emit("hold", t=time.monotonic(), **fields)
                await stop.wait()  # the handler "works" on it until the parent kills us
                return
            try:
                await msg.ack()
            except brokerkit.BrokerkitError as exc:
                emit("ack_error", type=type(exc).__name__, **fields)
            else:
                emit("ack", t=time.monotonic(), **fields)
            if stop.is_set():
                return


async def main() -> None:
    settings = json.loads(sys.argv[1])
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def watch_stdin() -> None:
        sys.stdin.read()  # returns at EOF: the parent closed the pipe or died
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=watch_stdin, daemon=True).start()
    task = asyncio.ensure_future(consume(settings, stop))
    stopper = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait(
        {task, stopper}, timeout=settings["lifetime"], return_when=asyncio.FIRST_COMPLETED
    )
    if task in done:
        stopper.cancel()
        if task.exception() is not None:
            emit("error", type=type(task.exception()).__name__)
        return
    stop.set()
    try:
        await asyncio.wait_for(task, 15)
    except BaseException as exc:  # reported by type only, then exit
        emit("error", type=type(exc).__name__)


if __name__ == "__main__":
    asyncio.run(main())
