"""A/B of two brokerkit trees' Kafka consume paths, interleaved with the raw client.

    python benchmarks/ab_kafka_recv.py --a OLD_TREE --b NEW_TREE [--c TREE] [-n 20000]
        [--rounds 5]

(A tree is a checkout of brokerkit, e.g. ``git worktree add ../old HEAD~3``.)

One queue (6 partitions) is filled once with ``n`` 100-byte messages through brokerkit's
``publish_many``; each round then reads all of it with a new group per contender, in a
fresh process per measurement (``PYTHONPATH`` = the tree), the order rotated per round:

* raw con / raw con/store: as ``bench_kafka.py`` (``consume(500)``, one synchronous
  commit per batch; con/store adds ``value()`` + ``store_offsets`` per message);
* recv A / recv B: the backend's receiver alone, ``receive(500)`` + ``await ack(d)``;
* con A / con B: the facade, ``async for msg`` + ``await msg.ack()`` (prefetch 500).

``--profile recv|con --tree PATH`` instead runs one measurement under cProfile in this
process and prints the top functions (tottime).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import uuid

URL = "kafka://127.0.0.1:9092"
BATCH = 500


def child(kind: str, queue: str, n: int) -> float:
    import brokerkit
    from brokerkit._bench import drain_rate

    async def recv() -> float:
        from bench_kafka import bk_receive  # this directory: a sibling script

        return await bk_receive(URL, queue, n, group=f"r{uuid.uuid4().hex[:8]}")

    async def con() -> float:
        async with brokerkit.connect(URL) as broker:
            group = f"c{uuid.uuid4().hex[:8]}"
            async with broker.consumer(queue, group, prefetch=BATCH) as consumer:
                return await drain_rate(consumer, n)

    return asyncio.run(recv() if kind == "recv" else con())


def raw(topic: str, n: int, store: bool) -> float:
    """bench_kafka.py's raw con (``store``: raw con/store), the same loop."""
    from bench_kafka import raw_consume  # this directory: a sibling script

    return raw_consume("127.0.0.1:9092", topic, n, store_each=store)


def run(tree: str, *args: str) -> float:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        env=env,
        cwd=tree,
        check=True,
        capture_output=True,
        text=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


async def fill(queue: str, n: int) -> None:
    import brokerkit
    from brokerkit._bench import publish_rate

    async with brokerkit.connect(URL) as broker:
        await publish_rate(broker, queue, n, b"x" * 100)


async def delete(queue: str) -> None:
    import brokerkit

    async with brokerkit.connect(URL) as broker:
        await broker.delete_queue(queue)


def profile(kind: str, n: int) -> None:
    import cProfile
    import pstats

    queue = f"ab-{uuid.uuid4().hex[:8]}"
    asyncio.run(fill(queue, n))
    try:
        child(kind, queue, n)  # warm
        prof = cProfile.Profile()
        prof.enable()
        rate = child(kind, queue, n)
        prof.disable()
        print(f"{kind}: {rate:,.0f} msgs/s under the profiler")
        pstats.Stats(prof).sort_stats("tottime").print_stats(35)
    finally:
        asyncio.run(delete(queue))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", nargs=3)
    parser.add_argument("--a", help="a brokerkit checkout (A; required)")
    parser.add_argument("--b", default=".", help="a brokerkit checkout (B; default: this one)")
    parser.add_argument("-n", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--c", help="a third tree (C), optional")
    parser.add_argument("--profile")
    args = parser.parse_args()
    if args.child:
        kind, queue, n = args.child
        if kind.startswith("raw"):
            rate = raw(f"brokerkit.{queue}", int(n), kind == "raw-store")
        else:
            rate = child(kind, queue, int(n))
        print(json.dumps(rate))
        return
    if args.profile:
        profile(args.profile, args.n)
        return
    if not args.a:
        parser.error("--a (the brokerkit checkout to compare against) is required")
    args.a, args.b = os.path.abspath(args.a), os.path.abspath(args.b)
    queue = f"ab-{uuid.uuid4().hex[:8]}"
    asyncio.run(fill(queue, args.n))
    n = str(args.n)
    contenders = {
        "raw con": (args.b, "raw", queue, n),
        "raw con/store": (args.b, "raw-store", queue, n),
        "recv A": (args.a, "recv", queue, n),
        "recv B": (args.b, "recv", queue, n),
        "con A": (args.a, "con", queue, n),
        "con B": (args.b, "con", queue, n),
    }
    if args.c:
        contenders["recv C"] = (args.c, "recv", queue, n)
        contenders["con C"] = (args.c, "con", queue, n)
    rates: dict[str, list[float]] = {k: [] for k in contenders}
    names = list(contenders)
    try:
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                rates[name].append(run(*contenders[name]))
            line = ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items())
            print(f"round {r + 1}: {line}", flush=True)
    finally:
        asyncio.run(delete(queue))
    med = {k: statistics.median(v) for k, v in rates.items()}
    trees = f"A = {args.a}, B = {args.b}" + (f", C = {args.c}" if args.c else "")
    print(f"{trees}; {args.rounds} rounds of {args.n}")
    for k, v in rates.items():
        print(f"  {k:<14} median {med[k]:>9,.0f}  range {min(v):,.0f}-{max(v):,.0f}")
    for k in [name for name in rates if not name.startswith("raw")]:
        print(
            f"  {k:<8} / raw con/store {med[k] / med['raw con/store']:.3f}"
            f"   / raw con {med[k] / med['raw con']:.3f}"
        )
    for kind in ("recv", "con"):
        for other in ("B", "C") if args.c else ("B",):
            paired = [
                b / a for a, b in zip(rates[f"{kind} A"], rates[f"{kind} {other}"], strict=True)
            ]
            gm = statistics.geometric_mean(paired)
            print(
                f"  {kind} {other}/A paired: geometric mean {gm:.3f},"
                f" range {min(paired):.3f}-{max(paired):.3f}"
            )


if __name__ == "__main__":
    main()
