"""The ``brokerkit`` command: demo, check, bench.

Everything a command prints is credential-free (CONTRACT.md section 1): URLs only
redacted, errors with their whole cause chain through :func:`describe_error`, log
lines (``--log-level``) through a redacting formatter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import traceback
from collections.abc import Callable
from typing import TypeVar

import click

from brokerkit._errors import BrokerkitError
from brokerkit._redact import RedactingFormatter, describe_error, redact
from brokerkit._url import BrokerURL

DEFAULT_URL = "memory://"
LOG_LEVELS = ("debug", "info", "warning", "error")

T = TypeVar("T")


def _secrets(url: str) -> tuple[str, ...]:
    try:
        return BrokerURL.parse(url).secrets()
    except BrokerkitError:  # unparsable: the structural redaction still applies
        return ()


def _shown(url: str) -> str:
    try:
        return BrokerURL.parse(url).redacted()
    except BrokerkitError:
        return redact(url)


def _guarded(url: str, action: Callable[[], T]) -> T:
    """Run a command's work; its errors become a redacted message and exit status 1."""
    secrets = _secrets(url)
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, RedactingFormatter):
            handler.formatter.secrets = secrets
    try:
        return action()
    except BrokerkitError as exc:
        raise click.ClickException(describe_error(exc, secrets)) from None
    except Exception as exc:  # a bug: a client library's error got through the API
        text = "".join(traceback.format_exception(exc))
        raise click.ClickException(
            "unexpected error (a brokerkit bug, please report it):\n" + redact(text, secrets)
        ) from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="brokerkit")
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS, case_sensitive=False),
    default=None,
    help="Log to stderr at this level (redacted), brokerkit's and its client libraries'.",
)
def main(log_level: str | None) -> None:
    """brokerkit: one producer/consumer API on Redis, SQS, Kafka, RabbitMQ and NATS."""
    if log_level is not None:
        handler = logging.StreamHandler()
        handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger()
        root.addHandler(handler)
        root.setLevel(log_level.upper())


@main.command()
@click.argument("url", default=DEFAULT_URL)
def demo(url: str) -> None:
    """Run the signup-email worker scenario against URL (default memory://)."""
    from brokerkit._demo import run_demo

    ok = _guarded(url, lambda: asyncio.run(run_demo(url)))
    sys.exit(0 if ok else 1)


@main.command()
@click.argument("url", default=DEFAULT_URL)
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (CONTRACT.md §9).")
@click.option("-k", "select", default=None, help="Only tests matching this pytest expression.")
def check(url: str, pytest_args: tuple[str, ...], as_json: bool, select: str | None) -> None:
    """Run the contract suite against URL and report each behaviour.

    Exit status 0 only when every mandatory behaviour passes. Slow tests (the
    dedup window of a broker that fixes it) run too. More pytest options go
    after ``--``: ``brokerkit check URL -- -v --tb=long``.
    """
    from brokerkit._check import run_check

    args = [*(["-k", select] if select else []), *pytest_args]
    summary, failures = _guarded(url, lambda: run_check(url, pytest_args=args or None))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"\nbrokerkit check {summary['url']}  ({summary['backend']})")
        for behaviour, result in summary["results"].items():
            click.echo(f"  {behaviour:<20} {result}")
        click.echo(f"{summary['passed']} passed, {summary['failed']} failed")
        for nodeid in failures:
            click.echo(f"  failed: {nodeid}", err=True)
    sys.exit(0 if summary["failed"] == 0 else 1)


@main.command()
@click.argument("url", default=DEFAULT_URL)
@click.option("--messages", default=20_000, show_default=True, help="Messages per round.")
@click.option("--size", default=100, show_default=True, help="Body size in bytes.")
@click.option("--rounds", default=3, show_default=True, help="Rounds; medians are reported.")
@click.option("--prefetch", default=500, show_default=True, help="Consumer prefetch.")
def bench(url: str, messages: int, size: int, rounds: int, prefetch: int) -> None:
    """Measure brokerkit publish and consume+ack throughput on URL (msgs/s, medians).

    The raw client library's numbers, measured in the same run, come from the
    per-backend scripts in the repository's benchmarks/ folder.
    """
    from brokerkit._bench import run_bench

    result = _guarded(
        url,
        lambda: asyncio.run(
            run_bench(url, messages=messages, size=size, rounds=rounds, prefetch=prefetch)
        ),
    )
    rounds_pub = ", ".join(f"{r:,.0f}" for r in result.publish)
    rounds_con = ", ".join(f"{r:,.0f}" for r in result.consume)
    click.echo(f"brokerkit bench {_shown(url)}: {messages} x {size} B, {rounds} rounds")
    click.echo(f"  publish      median {result.publish_median:>10,.0f} msgs/s  ({rounds_pub})")
    click.echo(f"  consume+ack  median {result.consume_median:>10,.0f} msgs/s  ({rounds_con})")
