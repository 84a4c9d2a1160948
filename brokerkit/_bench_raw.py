"""``brokerkit bench --raw``: the raw client library's figures, measured in the same run.

They come from the per-backend scripts in the repository's ``benchmarks/`` folder (not
installed with the package: a checkout is needed). A script offers them by defining

    async def raw_round(url: str, messages: int, size: int, batch: int) -> dict[str, float]

(one round on fresh names, cleaned up after; msgs/s keyed ``"publish"`` and
``"consume+ack"``, the keys of ``brokerkit bench``'s own series). A backend whose script
has none gets a clear error naming the script, never a made-up figure.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

from brokerkit._errors import ConfigError, UnsupportedFeature

__all__ = ["SCRIPTS", "RawRound", "raw_round"]

RawRound = Callable[[str, int, int, int], Awaitable[dict[str, float]]]

SCRIPTS = {
    "redis": "bench_redis",
    "rediss": "bench_redis",
    "nats": "bench_nats",
    "tls": "bench_nats",
    "kafka": "bench_kafka",
    "amqp": "bench_rabbitmq",
    "amqps": "bench_rabbitmq",
    "sqs": "bench_sqs",
}
"""URL scheme -> its raw-client benchmark script in ``benchmarks/``."""

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def raw_round(scheme: str) -> RawRound:
    """The ``raw_round`` of ``scheme``'s benchmark script; UnsupportedFeature when it has none."""
    name = SCRIPTS.get(scheme)
    if name is None:
        raise UnsupportedFeature(f"--raw: no raw-client benchmark for {scheme}:// URLs")
    path = BENCHMARKS / f"{name}.py"
    if not path.is_file():
        raise ConfigError(
            f"--raw needs the repository's benchmarks/{name}.py (run from a checkout of brokerkit)"
        )
    module_name = f"_brokerkit_benchmarks_{name}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"--raw: cannot load benchmarks/{name}.py")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"--raw: benchmarks/{name}.py needs {exc.name!r} (the backend's extra)"
            ) from None
        sys.modules[module_name] = module
    found = getattr(module, "raw_round", None)
    if found is None:
        raise UnsupportedFeature(
            f"--raw: benchmarks/{name}.py has no raw-client round for brokerkit bench yet "
            f"(run it directly: python benchmarks/{name}.py)"
        )
    return cast(RawRound, found)
