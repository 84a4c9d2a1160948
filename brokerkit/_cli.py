"""The ``brokerkit`` command: demo, check, bench."""

from __future__ import annotations

import asyncio
import json
import statistics
import sys

import click

from brokerkit._errors import BrokerkitError

DEFAULT_URL = "memory://"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="brokerkit")
def main() -> None:
    """brokerkit: one producer/consumer API on Redis, SQS, Kafka, RabbitMQ and NATS."""


@main.command()
@click.argument("url", default=DEFAULT_URL)
def demo(url: str) -> None:
    """Run the signup-email worker scenario against URL (default memory://)."""
    from brokerkit._demo import run_demo

    try:
        ok = asyncio.run(run_demo(url))
    except BrokerkitError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    sys.exit(0 if ok else 1)


@main.command()
@click.argument("url", default=DEFAULT_URL)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (CONTRACT.md §9).")
@click.option("-k", "select", default=None, help="Only tests matching this pytest expression.")
def check(url: str, as_json: bool, select: str | None) -> None:
    """Run the contract suite against URL and report each behaviour.

    Exit status 0 only when every selected test passed (or skipped for an optional
    feature that capabilities declares absent). A behaviour passes only when all its
    tests ran and passed; one with a test deselected by -k is "not run". Slow tests
    (the dedup window of a broker that fixes it) run too.
    """
    from brokerkit._check import run_check

    try:
        summary, failures = run_check(url, pytest_args=["-k", select] if select else None)
    except BrokerkitError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"\nbrokerkit check {summary['url']}  ({summary['backend']})")
        for behaviour, result in summary["results"].items():
            lacking = summary["unsupported"].get(behaviour)
            note = f"  (unsupported: {', '.join(lacking)})" if lacking else ""
            click.echo(f"  {behaviour:<20} {result}{note}")
        click.echo(
            f"{summary['passed']} passed, {summary['failed']} failed, {summary['not_run']} not run"
        )
        for nodeid in failures:
            click.echo(f"  failed: {nodeid}", err=True)
    sys.exit(0 if summary["ok"] else 1)


@main.command()
@click.argument("url", default=DEFAULT_URL)
@click.option(
    "--messages",
    default=20_000,
    show_default=True,
    type=click.IntRange(min=2),
    help="Messages per round (consume is timed from the first, so at least 2).",
)
@click.option(
    "--size", default=100, show_default=True, type=click.IntRange(min=0), help="Body bytes."
)
@click.option(
    "--rounds",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="Rounds; min/median/max reported.",
)
@click.option(
    "--prefetch", default=500, show_default=True, type=click.IntRange(min=1), help="Prefetch."
)
@click.option(
    "--concurrency",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Also measure single publish() calls from this many tasks at once.",
)
def bench(url: str, messages: int, size: int, rounds: int, prefetch: int, concurrency: int) -> None:
    """Measure brokerkit publish and consume+ack throughput on URL (msgs/s, medians).

    The raw client library's numbers, measured in the same run, come from the
    per-backend scripts in the repository's benchmarks/ folder.
    """
    from brokerkit._bench import run_bench

    try:
        result = asyncio.run(
            run_bench(
                url,
                messages=messages,
                size=size,
                rounds=rounds,
                prefetch=prefetch,
                concurrency=concurrency,
            )
        )
    except BrokerkitError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from None
    click.echo(f"brokerkit bench {url}: {messages} x {size} B, {rounds} rounds (msgs/s)")
    series = {"publish": result.publish, "consume+ack": result.consume}
    if result.concurrent:
        series[f"publish x{concurrency}"] = result.concurrent
    for name, values in series.items():
        click.echo(
            f"  {name:<14} median {statistics.median(values):>10,.0f}"
            f"  min {min(values):>10,.0f}  max {max(values):>10,.0f}"
        )
    if result.concurrent:
        ratio = statistics.median(result.concurrent) / result.publish_median
        click.echo(f"  ratio publish x{concurrency} / publish_many  {ratio:.2f}")


def _add_operator_commands() -> None:
    from brokerkit._ops_cli import COMMANDS

    for command in COMMANDS:
        main.add_command(command)


_add_operator_commands()
