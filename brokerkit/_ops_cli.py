"""Operator commands: publish, peek, dlq, redrive, stats, declare.

Each takes the broker URL as its first argument, or from ``BROKERKIT_URL`` when the
first argument is not a URL (a queue name never contains ``://``, so there is no
ambiguity). ``--json`` prints machine-readable output; bodies are shown as a printable
preview unless ``--raw`` writes their bytes.

``memory://`` is per-process: each command starts its own empty broker, and what it
holds is gone when the command exits. A command whose whole effect would go with it
(publish, redrive, declare) refuses it with a ``ConfigError``; a read command (peek,
dlq, stats) runs and says on stderr that it sees only its own, empty broker.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

import brokerkit
from brokerkit._guard import guarded
from brokerkit._redact import describe_error

T = TypeVar("T")

ENV_URL = "BROKERKIT_URL"
PREVIEW = 120

MEMORY_OUTLIVES_COMMAND = False
"""True only where the process outlives each command (a test's ``CliRunner``), so one
``memory://`` broker is seen by the next command too; never in the ``brokerkit`` command."""

_PER_PROCESS = (
    "memory:// is per-process: this command starts its own empty broker, and everything "
    "in it is gone when the command exits"
)


def per_process(url: str, command: str, *, lasting: bool) -> None:
    """Refuse (``lasting``: its effect would vanish unseen) or note a ``memory://`` URL."""
    if MEMORY_OUTLIVES_COMMAND:
        return
    try:
        in_process = brokerkit.BrokerURL.parse(url).scheme == "memory"
    except brokerkit.BrokerkitError:  # the command's own connect reports a bad URL
        return
    if not in_process:
        return
    if lasting:
        error = brokerkit.ConfigError(
            f"{_PER_PROCESS}, so no other command or process could ever see what "
            f"'brokerkit {command}' did there; give a real broker's URL (e.g. "
            "redis://127.0.0.1:6379/0), or use memory:// from Python within one process "
            "('brokerkit demo' does)"
        )
        raise click.ClickException(describe_error(error))
    click.echo(
        f"note: {_PER_PROCESS}: it sees nothing another command published (that was "
        "gone when that command exited)",
        err=True,
    )


def split_url(args: tuple[str, ...], needed: int) -> tuple[str, list[str]]:
    """``(url, rest)``: the URL from the first argument when it is one, else BROKERKIT_URL."""
    if args and "://" in args[0]:
        return args[0], list(args[1:])
    env = os.environ.get(ENV_URL)
    if not env:
        raise click.UsageError(f"give the broker URL as the first argument or set {ENV_URL}")
    if len(args) < needed:
        raise click.UsageError("missing the queue name")
    return env, list(args)


def run(work: Callable[[brokerkit.Broker], Awaitable[T]], url: str) -> T:
    """Connect, run ``work``, close; a brokerkit error becomes a one-line message."""

    async def go() -> T:
        async with brokerkit.connect(url) as broker:
            return await work(broker)

    return guarded(url, lambda: asyncio.run(go()))


def preview(body: bytes) -> str:
    """A printable, one-line, bounded view of a body (never raw control characters)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(body)} bytes, not UTF-8: {body[: PREVIEW // 2].hex()}...>"
    shown = text.encode("unicode_escape").decode("ascii")
    return shown if len(shown) <= PREVIEW else shown[:PREVIEW] + f"... ({len(body)} bytes)"


def as_json(msg: brokerkit.BrowsedMessage | brokerkit.Message) -> dict[str, Any]:
    try:
        body: dict[str, str] = {"text": msg.body.decode("utf-8")}
    except UnicodeDecodeError:
        body = {"base64": base64.b64encode(msg.body).decode("ascii")}
    out: dict[str, Any] = {
        "id": msg.id,
        "body": body,
        "headers": dict(msg.headers),
        "fifo_group": msg.fifo_group,
        "dedup_id": msg.dedup_id,
    }
    info = msg.dead_letter_info
    if info is not None:
        out["dead_letter"] = {
            "reason": info.reason,
            "attempts": info.attempts,
            "died_at": info.died_at.isoformat(),
            "original_id": info.original_id,
            "queue": info.queue,
        }
    return out


def show(messages: list[brokerkit.BrowsedMessage], *, json_out: bool, raw: bool) -> None:
    if json_out:
        click.echo(json.dumps([as_json(m) for m in messages], indent=2))
        return
    if raw:
        for m in messages:
            sys.stdout.buffer.write(m.body + b"\n")
        sys.stdout.buffer.flush()
        return
    for n, m in enumerate(messages, 1):
        group = f" fifo_group={m.fifo_group}" if m.fifo_group else ""
        line = f"{n:>4}  id={m.id}{group}"
        info = m.dead_letter_info
        if info is not None:
            line += f"  reason={info.reason!r} attempts={info.attempts} died={info.died_at:%F %T}"
        click.echo(line)
        click.echo(f"      {preview(m.body)}")
    click.echo(f"{len(messages)} message(s)")


async def browse(
    broker: brokerkit.Broker, queue: str, dead: bool, limit: int
) -> list[brokerkit.BrowsedMessage]:
    return [m async for m in broker.browse(queue, dead_letters=dead, limit=limit)]


@click.command()
@click.argument("args", nargs=-1, required=True)
@click.option("--file", "path", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Read the body from a file ('-' for standard input).")  # fmt: skip
@click.option("--fifo-group", default=None)
@click.option("--dedup-id", default=None)
@click.option("-H", "--header", "headers", multiple=True, help="A header, key=value (repeatable).")
@click.option("--json", "json_out", is_flag=True)
def publish(
    args: tuple[str, ...],
    path: str | None,
    fifo_group: str | None,
    dedup_id: str | None,
    headers: tuple[str, ...],
    json_out: bool,
) -> None:
    """Publish one message: publish [URL] QUEUE [BODY | --file F | -]."""
    url, rest = split_url(args, 1)
    if not rest or len(rest) > 2:
        raise click.UsageError("publish [URL] QUEUE [BODY | --file F | -]")
    per_process(url, "publish", lasting=True)
    queue = rest[0]
    if path is not None or (len(rest) == 2 and rest[1] == "-"):
        with click.open_file(path or "-", "rb") as f:
            body = f.read()
    elif len(rest) == 2:
        body = rest[1].encode("utf-8")
    else:
        raise click.UsageError("give a BODY, --file F, or - for standard input")
    parsed: dict[str, str] = {}
    for item in headers:
        key, sep, value = item.partition("=")
        if not sep:
            raise click.UsageError(f"header {key!r} needs key=value")
        parsed[key] = value

    async def work(broker: brokerkit.Broker) -> brokerkit.PublishResult:
        return await broker.publish(
            queue, body, fifo_group=fifo_group, dedup_id=dedup_id, headers=parsed
        )

    result = run(work, url)
    if json_out:
        click.echo(json.dumps({"id": result.id, "duplicate": result.duplicate}))
    else:
        dup = " (a duplicate: suppressed)" if result.duplicate else ""
        click.echo(f"published {result.id}{dup}")


def _list(args: tuple[str, ...], *, dead: bool, limit: int, json_out: bool, raw: bool) -> None:
    url, rest = split_url(args, 1)
    if len(rest) != 1:
        raise click.UsageError("[URL] QUEUE")
    per_process(url, "dlq" if dead else "peek", lasting=False)
    show(run(lambda b: browse(b, rest[0], dead, limit), url), json_out=json_out, raw=raw)


@click.command()
@click.argument("args", nargs=-1, required=True)
@click.option("--dlq", "dead", is_flag=True, help="Show its DLQ instead.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=0))
@click.option("--json", "json_out", is_flag=True)
@click.option("--raw", is_flag=True, help="Write the bodies' bytes, one per line.")
def peek(args: tuple[str, ...], dead: bool, limit: int, json_out: bool, raw: bool) -> None:
    """The oldest messages of QUEUE, without consuming them: peek [URL] QUEUE [--dlq].

    Nothing is leased, counted or moved: run it twice and see the same.
    """
    _list(args, dead=dead, limit=limit, json_out=json_out, raw=raw)


@click.command()
@click.argument("args", nargs=-1, required=True)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=0))
@click.option("--json", "json_out", is_flag=True)
@click.option("--raw", is_flag=True, help="Write the bodies' bytes, one per line.")
def dlq(args: tuple[str, ...], limit: int, json_out: bool, raw: bool) -> None:
    """QUEUE's dead letters with why they died (nothing is consumed): dlq [URL] QUEUE."""
    _list(args, dead=True, limit=limit, json_out=json_out, raw=raw)


@click.command()
@click.argument("args", nargs=-1, required=True)
@click.option("--limit", default=None, type=click.IntRange(min=0), help="Move at most this many.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def redrive(args: tuple[str, ...], limit: int | None, yes: bool) -> None:
    """Move QUEUE's dead letters back to QUEUE, oldest first: redrive [URL] QUEUE."""
    url, rest = split_url(args, 1)
    if len(rest) != 1:
        raise click.UsageError("redrive [URL] QUEUE")
    per_process(url, "redrive", lasting=True)
    queue = rest[0]
    dead = run(lambda b: b.stats(queue), url).dead
    if dead == 0:  # nothing to move: say so, ask nothing
        click.echo(f"no dead letters in {queue!r}: nothing to move")
        return
    total = dead if limit is None or dead is None else min(limit, dead)
    if total is not None:
        what = f"{total} dead letter(s)"
    else:  # the broker cannot count its DLQ
        what = "all dead letters" if limit is None else f"up to {limit} dead letter(s)"
    if not yes and not click.confirm(f"move {what} of {queue!r} back to the queue?"):
        raise click.Abort

    async def work(broker: brokerkit.Broker) -> int:
        moved = 0
        with click.progressbar(length=total or 0, label="redriving", file=sys.stderr) as bar:
            while limit is None or moved < limit:
                step = 100 if limit is None else min(100, limit - moved)
                n = await broker.redrive(queue, limit=step)
                moved += n
                bar.update(n)
                if n < step:
                    break
        return moved

    click.echo(f"moved {run(work, url)} message(s) back to {queue!r}")


@click.command()
@click.argument("args", nargs=-1)
@click.option("--group", default="default", show_default=True)
@click.option("--json", "json_out", is_flag=True)
@click.option("--watch", type=float, default=None, help="Repeat every N seconds.")
def stats(args: tuple[str, ...], group: str, json_out: bool, watch: float | None) -> None:
    """Depth, in flight, delayed and DLQ depth of each QUEUE: stats [URL] QUEUE..."""
    url, queues = split_url(args, 1)
    if not queues:
        raise click.UsageError("stats [URL] QUEUE...")
    per_process(url, "stats", lasting=False)

    async def work(broker: brokerkit.Broker) -> dict[str, brokerkit.QueueStats]:
        return {q: await broker.stats(q, group) for q in queues}

    while True:
        figures = run(work, url)
        if json_out:
            click.echo(json.dumps({q: _stats_dict(s) for q, s in figures.items()}))
        else:
            click.echo(f"{'queue':<24} {'ready':>8} {'in flight':>10} {'delayed':>8} "
                       f"{'dead':>8} {'oldest':>9}")  # fmt: skip
            for q, s in figures.items():
                age = "-" if s.oldest_age is None else f"{s.oldest_age:.1f}s"
                click.echo(f"{q:<24} {_n(s.ready):>8} {_n(s.in_flight):>10} "
                           f"{_n(s.delayed):>8} {_n(s.dead):>8} {age:>9}")  # fmt: skip
        if watch is None:
            return
        time.sleep(watch)


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


def _stats_dict(s: brokerkit.QueueStats) -> dict[str, Any]:
    return {
        "ready": s.ready,
        "in_flight": s.in_flight,
        "delayed": s.delayed,
        "dead": s.dead,
        "oldest_age": s.oldest_age,
    }


@click.command()
@click.argument("args", nargs=-1, required=True)
@click.option("--group", default=None, help="Also create this consumer group.")
def declare(args: tuple[str, ...], group: str | None) -> None:
    """Create QUEUE, its DLQ and (with --group) a consumer group now: declare [URL] QUEUE."""
    url, rest = split_url(args, 1)
    if len(rest) != 1:
        raise click.UsageError("declare [URL] QUEUE [--group G]")
    per_process(url, "declare", lasting=True)
    run(lambda b: b.declare(rest[0], group), url)
    click.echo(f"declared {rest[0]!r}" + (f" with group {group!r}" if group else ""))


COMMANDS = (publish, peek, dlq, redrive, stats, declare)
