"""Each backend's capabilities, pinned: weakening one is a reviewed change, never a quiet skip.

Built from URLs only (``from_url`` does no I/O); a backend whose driver is not
installed is skipped with the pip extra that brings it.
"""

from __future__ import annotations

import pytest

import brokerkit

PINNED = {
    # max_message_bytes, dedup_window, configurable, fan_out, ack_flush_interval,
    # redelivery_slack (the contract suite measures every due time against it), browse
    "memory://": (4 * 1024 * 1024, 300.0, True, True, 0.0, 0.05, True),
    "redis://127.0.0.1:6379/0": (1024 * 1024, 300.0, True, True, 0.05, 0.5, True),
    "kafka://127.0.0.1:9092": (900 * 1024, 300.0, True, True, 0.1, 7.0, True),
    "nats://127.0.0.1:4222": (960 * 1024, 300.0, True, True, 0.1, 2.0, True),
    # RabbitMQ: no side-effect-free read of a quorum queue, so no browse
    "amqp://guest:guest@127.0.0.1:5672/": (16 * 1024 * 1024, 300.0, True, False, 0.01, 1.0, False),
}


def _connect(url: str) -> brokerkit.Broker:
    try:
        return brokerkit.connect(url)
    except brokerkit.ConfigError as exc:
        if "pip install" not in str(exc):
            raise
        pytest.skip(str(exc))  # the driver is an optional extra


@pytest.mark.parametrize("url", sorted(PINNED))
def test_capabilities_are_pinned(url: str) -> None:
    caps = _connect(url).capabilities
    got = (
        caps.max_message_bytes,
        caps.dedup_window,
        caps.dedup_window_configurable,
        caps.fan_out,
        caps.ack_flush_interval,
        caps.redelivery_slack,
        caps.browse,
    )
    assert got == PINNED[url]
    # what the contract demands of every backend
    assert caps.max_message_bytes >= 256 * 1024
    assert caps.max_headers >= 32 and caps.max_header_bytes >= 8192
    assert caps.ack_flush_interval <= 0.1
    assert caps.redelivery_slack > 0


@pytest.mark.parametrize("url", sorted(PINNED))
def test_dedup_window_option_is_honoured(url: str) -> None:
    sep = "&" if "?" in url else "?"
    caps = _connect(f"{url}{sep}dedup_window=2").capabilities
    assert caps.dedup_window == 2.0
