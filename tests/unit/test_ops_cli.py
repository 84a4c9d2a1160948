"""The operator commands, end to end on memory:// (one process, so one in-process broker).

Here the process outlives each command (CliRunner), so one memory:// broker serves them
all: the fixture says so to the commands, which otherwise refuse memory:// where their
effect would vanish (tests/unit/test_cli_memory.py runs them as a user does).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

import brokerkit
from brokerkit import _ops_cli
from brokerkit._cli import main

URL = "memory://ops-cli"


@pytest.fixture(autouse=True)
def _memory_outlives_each_command(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(_ops_cli, "MEMORY_OUTLIVES_COMMAND", True)
    yield


def cli(*args: str, env: dict[str, str] | None = None) -> str:
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


async def _dead_letter_one(queue: str) -> None:
    async with brokerkit.connect(URL) as broker, broker.consumer(queue) as consumer:
        msg = await consumer.__anext__()
        await msg.dead_letter("bad address")


def test_publish_peek_dlq_redrive_stats() -> None:
    queue = "cli-q"
    assert "published" in cli("publish", URL, queue, "hello", "--fifo-group", "g", "-H", "k=v")
    first = cli("peek", URL, queue, "--json")
    assert first == cli("peek", URL, queue, "--json")  # non-destructive: the same twice
    [shown] = json.loads(first)
    assert shown["body"] == {"text": "hello"} and shown["headers"] == {"k": "v"}
    asyncio.run(_dead_letter_one(queue))
    dead = json.loads(cli("dlq", URL, queue, "--json"))
    assert [d["dead_letter"]["reason"] for d in dead] == ["bad address"]
    twice = [cli("peek", URL, queue, "--dlq", "--json") for _ in range(2)]
    assert twice[0] == twice[1] and json.loads(twice[0])[0]["dead_letter"]["attempts"] == 1
    stats = json.loads(cli("stats", URL, queue, "--json"))[queue]
    assert (stats["ready"], stats["dead"]) == (0, 1)
    assert "moved 1 message(s)" in cli("redrive", URL, queue, "--yes")
    stats = json.loads(cli("stats", URL, queue, "--json"))[queue]
    assert (stats["ready"], stats["dead"]) == (1, 0)
    assert "hello" in cli("peek", URL, queue)


def test_the_url_comes_from_the_environment_when_not_given() -> None:
    env = {"BROKERKIT_URL": URL}
    cli("publish", "env-q", "from env", env=env)
    assert "from env" in cli("peek", "env-q", env=env)
    assert "declared 'env-q2' with group 'g'" in cli("declare", "env-q2", "--group", "g", env=env)


def test_bodies_are_shown_safely() -> None:
    cli("publish", URL, "safe-q", "line1\nline2\x1b[31m")
    out = cli("peek", URL, "safe-q")
    assert "\x1b" not in out and "line1\\nline2\\x1b[31m" in out


def test_bad_input_is_a_clear_error() -> None:
    result = CliRunner().invoke(main, ["publish", URL, "bad.name", "x"])
    assert result.exit_code != 0 and "InvalidName" in result.output
    result = CliRunner().invoke(main, ["peek", "q"], env={"BROKERKIT_URL": ""})
    assert result.exit_code == 2 and "BROKERKIT_URL" in result.output


def test_bench_refuses_numbers_that_cannot_measure_anything() -> None:
    for args in (["--messages", "0"], ["--messages", "1"], ["--rounds", "0"], ["--size", "-1"]):
        result = CliRunner().invoke(main, ["bench", URL, *args])
        assert result.exit_code == 2 and "Invalid value" in result.output, args


def test_bench_reports_spread() -> None:
    out = cli("bench", URL, "--messages", "200", "--rounds", "2", "--concurrency", "10")
    assert "min" in out and "max" in out and "publish x10" in out


def test_redrive_of_an_empty_dlq_announces_nothing_to_move_and_asks_nothing() -> None:
    for extra in ([], ["--limit", "5"]):
        result = CliRunner().invoke(main, ["redrive", URL, "empty-dlq-q", *extra], input="n\n")
        assert result.exit_code == 0, result.output
        assert "no dead letters" in result.output and "5 dead letter" not in result.output
        assert "[y/N]" not in result.output


def test_redrive_announces_the_count_it_will_move() -> None:
    queue = "count-dlq-q"
    for n in range(3):
        cli("publish", URL, queue, f"m{n}")
        asyncio.run(_dead_letter_one(queue))
    result = CliRunner().invoke(main, ["redrive", URL, queue, "--limit", "5"], input="n\n")
    assert "move 3 dead letter(s)" in result.output and result.exit_code == 1
    result = CliRunner().invoke(main, ["redrive", URL, queue, "--limit", "2"], input="y\n")
    assert "move 2 dead letter(s)" in result.output, result.output
    assert "moved 2 message(s)" in result.output


def test_bench_raw_without_a_raw_benchmark_is_a_clear_error_before_measuring() -> None:
    result = CliRunner().invoke(main, ["bench", URL, "--messages", "200", "--raw"])
    assert result.exit_code == 1 and "--raw: no raw-client benchmark for memory://" in result.output
    assert "Traceback" not in result.output and "publish" not in result.output


def test_every_raw_benchmark_script_named_exists() -> None:
    from brokerkit._bench_raw import BENCHMARKS, SCRIPTS

    assert all((BENCHMARKS / f"{name}.py").is_file() for name in SCRIPTS.values())


def test_bench_refuses_a_zero_prefetch_and_negative_concurrency() -> None:
    for args in (["--prefetch", "0"], ["--concurrency", "-1"]):
        result = CliRunner().invoke(main, ["bench", URL, *args])
        assert result.exit_code == 2 and "Invalid value" in result.output, args
