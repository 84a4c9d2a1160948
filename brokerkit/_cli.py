"""The ``brokerkit`` command: demo, check, bench.

Everything a command prints is credential-free (CONTRACT.md section 1): URLs only
redacted, errors with their whole cause chain through :func:`describe_error`, log
lines (``--log-level``) through a redacting formatter.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from click.utils import PacifyFlushWrapper

from brokerkit import __version__
from brokerkit._guard import guarded as _guarded
from brokerkit._guard import shown as _shown
from brokerkit._redact import RedactingFormatter
from brokerkit._url import BrokerURL

DEFAULT_URL = "memory://"
LOG_LEVELS = ("debug", "info", "warning", "error")
CLOSED_PIPE_STATUS = 141
"""A closed stdout ends a command as SIGPIPE ends a shell tool: 128 + 13, nothing said."""

T = TypeVar("T")


def closed_stdout() -> click.exceptions.Exit:
    """Point stdout at /dev/null (so no later flush fails) and give the exit to raise."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor (a test runner's stream): nothing to do
        pass
    return click.exceptions.Exit(CLOSED_PIPE_STATUS)


def _flush_stdout() -> None:
    """Flush stdout now: a block-buffered stdout meets a closed pipe only when flushed."""
    sys.stdout.flush()


class _Commands(click.Group):
    """The command group: a reader that closed stdout (``| head``) ends any command quietly."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            try:
                return super().invoke(ctx)
            finally:
                _flush_stdout()
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            raise closed_stdout() from None

    def main(self, *args: Any, **kwargs: Any) -> Any:  # --help and --version print here
        try:
            try:
                return super().main(*args, **kwargs)
            finally:
                _flush_stdout()
        except SystemExit as exc:  # click's own answer to a closed pipe is status 1
            if exc.code == 1 and isinstance(sys.stdout, PacifyFlushWrapper):
                sys.exit(closed_stdout().exit_code)
            raise
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            sys.exit(closed_stdout().exit_code)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="brokerkit")
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
    from brokerkit._demo import StdoutClosed, run_demo

    def go() -> bool | None:
        try:
            return asyncio.run(run_demo(url))
        except StdoutClosed:  # the demo stopped and cleaned up: end as a closed pipe does
            return None

    ok = _guarded(url, go)
    if ok is None:
        raise closed_stdout()
    sys.exit(0 if ok else 1)


def _fault_options(command: Callable[..., None]) -> Callable[..., None]:
    """The hooks of the fault behaviours, as options of ``check``."""
    options = [
        click.option(
            "--restart-cmd",
            default=None,
            metavar="CMD",
            help="Command that kills the broker (SIGKILL) and starts it on the same data, "
            "returning when it is ready (e.g. 'scripts/services restart redis'): runs "
            "'broker restart'. Split like a shell would, run without one; its output is "
            "shown only on failure, the URL's password masked.",
        ),
        click.option(
            "--restart-timeout",
            type=click.FloatRange(min=1),
            default=None,
            help="Seconds the restart command may take (default 300).",
        ),
        click.option(
            "--proxy",
            is_flag=True,
            help="Connect through a TCP proxy the suite runs and cut it: runs 'network cut'.",
        ),
        click.option(
            "--proxy-port",
            type=click.IntRange(1, 65535),
            default=None,
            help="The proxy's listen port (a broker that advertises it, e.g. Kafka).",
        ),
        click.option(
            "--cut-seconds",
            type=click.FloatRange(min=0.5),
            default=None,
            help="How long the network stays cut (default 20: longer than client timeouts).",
        ),
        click.option("--soak-long", is_flag=True, help="Run the long soak (50 000 messages)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _echo_fault_figures(faults: dict[str, Any]) -> None:
    for behaviour, detail in faults.items():
        for figures in detail.get("figures", []):
            shown = {k: v for k, v in figures.items() if k not in ("behaviour", "test")}
            click.echo(f"    {behaviour} [{figures.get('test', '')}]: {json.dumps(shown)}")


@main.command()
@click.argument("url", default=DEFAULT_URL)
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (CONTRACT.md §9).")
@click.option("-k", "select", default=None, help="Only tests matching this pytest expression.")
@_fault_options
def check(
    url: str, pytest_args: tuple[str, ...], as_json: bool, select: str | None, **hooks: Any
) -> None:
    """Run the contract suite against URL and report each behaviour.

    Exit status 0 only when every selected test passed (or skipped for an optional
    feature that capabilities declares absent) and no fault behaviour that ran
    failed. A behaviour passes only when all its tests ran and passed; one with a
    test deselected by -k is "not run". Slow tests (the dedup window of a broker
    that fixes it) run too.

    After the 17 behaviours comes the project's own broker-side input ("unsupported"
    for a backend the suite has no raw writer for), then the optional ones (browse,
    stats, delete queue), judged the same way: any selected test that fails, or that
    names no behaviour, fails the run.
    Then come the fault behaviours (CONTRACT.md section 9,
    v1.1): crash, broker restart, network cut, soak. Each is "pass", "fail" or
    "not run": a fault whose hook was not given (--restart-cmd for broker
    restart, --proxy for network cut) or that cannot apply (memory:// is
    in-process, so crash cannot run there) is "not run", with the reason and the
    flag that would run it; never a pass. --json adds "faults": {behaviour:
    {"result", "reason" (when not run), "figures"}} beside "results".
    More pytest options go after ``--``: ``brokerkit check URL -- -v --tb=long``.
    """
    from brokerkit._check import run_check
    from brokerkit._check_faults import fault_pytest_args

    try:
        hook_args = fault_pytest_args(**hooks)
    except ValueError as exc:
        raise click.BadParameter(f"--restart-cmd: {exc}") from None
    args = [*(["-k", select] if select else []), *hook_args, *pytest_args]
    summary, failures = _guarded(url, lambda: run_check(url, pytest_args=args or None))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(f"\nbrokerkit check {summary['url']}  ({summary['backend']})")
        for behaviour, result in summary["results"].items():
            lacking = summary["unsupported"].get(behaviour)
            note = f"  (unsupported: {', '.join(lacking)})" if lacking else ""
            reason = summary.get("faults", {}).get(behaviour, {}).get("reason")
            note += f" ({reason})" if reason else ""
            click.echo(f"  {behaviour:<20} {result}{note}")
        _echo_fault_figures(summary.get("faults", {}))
        click.echo(
            f"{summary['passed']} passed, {summary['failed']} failed, {summary['not_run']} not run"
        )
        for nodeid in failures:
            click.echo(f"  failed: {nodeid}", err=True)
    if "error" in summary:  # the connect pre-flight failed: nothing ran
        click.echo(f"cannot run the suite against {summary['url']}: {summary['error']}", err=True)
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
@click.option(
    "--raw",
    is_flag=True,
    help="Also measure the raw client library, interleaved, from the backend's script in "
    "the repository's benchmarks/ (a checkout), and print it beside brokerkit's.",
)
def bench(
    url: str, messages: int, size: int, rounds: int, prefetch: int, concurrency: int, raw: bool
) -> None:
    """Measure brokerkit publish and consume+ack throughput on URL (msgs/s; median, min, max).

    With --raw the raw client library's figures, measured in the same run (one raw round
    before each of brokerkit's), are printed beside them, with the ratio of the medians.
    """
    from brokerkit._bench import run_bench
    from brokerkit._bench_raw import raw_round

    raw_bench = _guarded(url, lambda: raw_round(BrokerURL.parse(url).scheme)) if raw else None

    result = _guarded(
        url,
        lambda: asyncio.run(
            run_bench(
                url,
                messages=messages,
                size=size,
                rounds=rounds,
                prefetch=prefetch,
                concurrency=concurrency,
                raw=raw_bench,
            )
        ),
    )
    click.echo(f"brokerkit bench {_shown(url)}: {messages} x {size} B, {rounds} rounds (msgs/s)")
    series = {"publish": result.publish, "consume+ack": result.consume}
    if result.concurrent:
        series[f"publish x{concurrency}"] = result.concurrent
    for name, values in series.items():
        click.echo(f"  {name:<20} {_spread(values)}")
        raw_values = result.raw.get(name)
        if raw_values:
            ratio = statistics.median(values) / statistics.median(raw_values)
            click.echo(f"  {name + ' (raw)':<20} {_spread(raw_values)}  brokerkit/raw {ratio:.2f}")
    if result.concurrent:
        ratio = statistics.median(result.concurrent) / result.publish_median
        click.echo(f"  ratio publish x{concurrency} / publish_many  {ratio:.2f}")


def _spread(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):>10,.0f}"
        f"  min {min(values):>10,.0f}  max {max(values):>10,.0f}"
    )


def _add_operator_commands() -> None:
    from brokerkit._ops_cli import COMMANDS
    from brokerkit._run_cli import run

    for command in (*COMMANDS, run):
        main.add_command(command)


_add_operator_commands()
