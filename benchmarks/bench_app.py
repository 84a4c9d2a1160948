"""What the App layer costs per message, against the bare consumer loop, on memory://.

    python benchmarks/bench_app.py [--rounds 9] [--messages 20000]

Per round, interleaved, each on a fresh memory:// broker holding the same backlog:

* consumer: ``async for msg in consumer: await msg.ack()`` (prefetch 500);
* app bytes: ``@app.handler(q, prefetch=500)`` taking the body as bytes (16 workers);
* app model: the same with ``model=`` a two-field pydantic model (JSON validation);
* app + metrics: the model handler with the PrometheusMetrics middleware (if installed).

Each time runs from the first message handed out to the last one settled. Prints the
median microseconds per message of each, and each App variant's cost over the consumer
(the median of the per-round differences).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Sequence

import pydantic

import brokerkit


class Payload(pydantic.BaseModel):
    to: str
    name: str


BODY = Payload(to="someone@example.com", name="someone").model_dump_json().encode()


async def _backlog(count: int) -> str:
    url = f"memory://bench{uuid.uuid4().hex[:12]}"
    async with brokerkit.connect(url) as broker:
        for start in range(0, count, 500):
            n = min(500, count - start)
            await broker.publish_many("q", [brokerkit.Outgoing(BODY)] * n)
    return url


async def consumer_loop(count: int) -> float:
    url = await _backlog(count)
    async with brokerkit.connect(url) as broker:
        async with broker.consumer("q", prefetch=500, close_timeout=0.0) as consumer:
            got = 0
            started = 0.0
            async for msg in consumer:
                if got == 0:
                    started = time.perf_counter()
                await msg.ack()
                got += 1
                if got == count:
                    break
            return (time.perf_counter() - started) / (count - 1) * 1e6


async def app_loop(count: int, *, model: bool, middleware: Sequence[brokerkit.Middleware]) -> float:
    url = await _backlog(count)
    app = brokerkit.App(url, middleware=middleware)
    done = asyncio.Event()
    got = 0
    started = 0.0

    async def handle(payload: object) -> None:
        nonlocal got, started
        if got == 0:
            started = time.perf_counter()
        got += 1
        if got == count:
            done.set()

    app.handler("q", model=Payload if model else None, prefetch=500)(handle)
    await app.start()
    await done.wait()
    elapsed = time.perf_counter() - started
    await app.stop(0.0)
    return elapsed / (count - 1) * 1e6


def _metrics() -> list[brokerkit.Middleware]:
    try:
        from brokerkit.metrics import PrometheusMetrics
    except brokerkit.ConfigError:
        return []
    return [PrometheusMetrics()]


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    n = args.messages
    series: dict[str, list[float]] = {"consumer": [], "app bytes": [], "app model": []}
    with_metrics = bool(_metrics())
    if with_metrics:
        series["app + metrics"] = []
    for _ in range(args.rounds):
        series["consumer"].append(await consumer_loop(n))
        series["app bytes"].append(await app_loop(n, model=False, middleware=()))
        series["app model"].append(await app_loop(n, model=True, middleware=()))
        if with_metrics:
            series["app + metrics"].append(await app_loop(n, model=True, middleware=_metrics()))
    print(f"{args.rounds} rounds, {n} messages, memory://, us per message")
    base = series["consumer"]
    for name, values in series.items():
        line = f"  {name:<14} median {statistics.median(values):6.2f}"
        line += f"  min {min(values):6.2f}  max {max(values):6.2f}"
        if name != "consumer":
            over = statistics.median(v - b for v, b in zip(values, base, strict=True))
            line += f"   over consumer {over:+6.2f}"
        print(line)


if __name__ == "__main__":
    asyncio.run(main())
