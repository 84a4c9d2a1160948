"""A consumer held at its ``max_in_flight`` bound on ``memory://``: 1 000 messages held,
the iterator asked for the next one (it waits at the bound), then the oldest acked.

This is the path a service with ``concurrency`` below its backlog runs on; compare trees
by running it with ``PYTHONPATH=<other tree>`` in alternation.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import time
import uuid

import brokerkit

BOUND = 1000


async def at_bound(count: int) -> float:
    """Microseconds per message, each hand-out made while the iterator waits at the bound."""
    async with brokerkit.connect("memory://") as broker:
        queue = "bound-" + uuid.uuid4().hex[:8]
        await broker.publish_many(queue, [brokerkit.Outgoing(b"x") for _ in range(count + BOUND)])
        async with broker.consumer(
            queue,
            group="g",
            ack_timeout=600.0,
            prefetch=100,
            max_in_flight=BOUND,
            close_timeout=0.0,
        ) as consumer:
            messages = consumer.__aiter__()
            held = collections.deque([await messages.__anext__() for _ in range(BOUND)])
            start = time.perf_counter()
            for _ in range(count):
                following = asyncio.ensure_future(messages.__anext__())
                await asyncio.sleep(0)  # the iterator reaches the bound and waits
                await held.popleft().ack()
                held.append(await following)
            took = time.perf_counter() - start
            for message in held:
                await message.ack()
    return took / count * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--messages", type=int, default=20000)
    args = parser.parse_args()
    figures = [asyncio.run(at_bound(args.messages)) for _ in range(args.rounds)]
    print(
        f"{args.rounds} rounds, {args.messages} messages at max_in_flight={BOUND}: "
        f"median {statistics.median(figures):.2f} us per message "
        f"[{min(figures):.2f}-{max(figures):.2f}]"
    )


if __name__ == "__main__":
    main()
