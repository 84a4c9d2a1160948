"""Every ```python block of README.md and of every page under docs/ runs, as written.

How a block runs:

* Its code is compiled as it stands, with top-level ``await`` / ``async with`` / ``async for``
  allowed (as the asyncio REPL does), and awaited in the test's event loop, within
  ``DEADLINE`` seconds: a block that never ends fails. Line numbers are the page's, so a
  traceback names ``README.md``, line N.
* Nothing is added to it except the application's own names in ``USER_CODE`` below (a
  ``send()``, a ``TemporaryError``...), and only where the block says, in a comment holding
  ``your application's own``, that those names are the user's; a name used without such a
  comment is not supplied and fails the block.
* A broker URL in the block is used as written: every broker the docs name runs on
  127.0.0.1 here and in CI (``scripts/services``). The queues the block names (the first
  argument of ``publish``, ``consumer``, ``dead_letters``, ``handler``...) are deleted on
  that broker before and after it runs, so a leftover of an earlier run cannot change it.
* A marker, an HTML comment on the line right before the fence, changes how it runs:

  - ``<!-- snippet: continued -->``: the block continues the previous ```python block of
    the same page; the two run as one, in one namespace.
  - ``<!-- snippet: pytest -->``: the block is a pytest test module; it is written to a
    file and run by pytest in a subprocess with the configuration the page states
    (pytest-asyncio, ``asyncio_mode = auto``), and must pass at least one test. A block
    defining a ``test_*`` function without it fails (its test would never run).

A block that raises (or a pytest block that fails) fails its test, named ``PAGE:LINE``.
Finding no block at all fails too. A block that cannot run (a signature, a sketch) has no
place in a ```python fence: write it as text or as a runnable block.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import re
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import brokerkit

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
DEADLINE = 120.0
MARKER = re.compile(r"<!--\s*snippet:\s*([\w-]+)\s*-->")
MARKERS = ("continued", "pytest")
USER_MARK = "your application's own"
LOCAL = (
    "redis://127.0.0.1:6379/0,amqp://guest:guest@127.0.0.1:5672/,nats://127.0.0.1:4222,"
    "kafka://127.0.0.1:9092,sqs://?endpoint=http://127.0.0.1:4566&region=us-east-1"
)
"""``scripts/services urls``: the brokers the docs name, when BROKERKIT_URLS is not set."""
URL = re.compile(r"""["']((?:memory|redis|rediss|kafka|nats|tls|amqp|amqps|sqs)://[^"'\s]*)["']""")
BROKERS = {
    brokerkit.BrokerURL.parse(url).scheme: url
    for url in os.environ.get("BROKERKIT_URLS", LOCAL).split(",")
    if url.strip()
}
"""The brokers the blocks name, by scheme, for the test to clean queues on (CI's URLs)."""
_SAME_BROKER = {"rediss": "redis", "amqps": "amqp", "tls": "nats"}
QUEUE_CALLS = {
    "publish",
    "publish_many",
    "consumer",
    "dead_letters",
    "redrive",
    "delete_queue",
    "handler",
    "browse",
    "stats",
    "declare",
}


# -- the application's own names, for the blocks that say they use them ---------------------


class TemporaryError(Exception):
    """The application's: a failure worth retrying (the mail server said "later")."""


class BadInput(Exception):
    """The application's: a message that can never succeed."""


SENT: list[object] = []
TIMINGS: list[tuple[str, float]] = []


async def send(body: bytes) -> None:
    """The application's sender: a body without ``@`` is no address (BadInput)."""
    if b"@" not in body:
        raise BadInput(f"not an email address: {body!r}")
    SENT.append(body)


async def smtp_send(email: object) -> None:
    """The application's mail client."""
    SENT.append(email)


def record(queue: str, seconds: float) -> None:
    """The application's metrics sink."""
    TIMINGS.append((queue, seconds))


USER_CODE: dict[str, Callable[..., Any] | type[Exception]] = {
    "TemporaryError": TemporaryError,
    "BadInput": BadInput,
    "send": send,
    "smtp_send": smtp_send,
    "record": record,
}


# -- finding the blocks ---------------------------------------------------------------------


@dataclass
class Snippet:
    page: str  # relative to the repository
    parts: list[tuple[int, str]] = field(default_factory=list)  # (first code line, code)
    mode: str = "run"

    @property
    def where(self) -> str:
        return f"{self.page}:{self.parts[0][0]}"

    @property
    def code(self) -> str:
        return "\n".join(code for _, code in self.parts)

    @property
    def url(self) -> str:
        """The broker the block talks to: the local one of its first URL's scheme."""
        found = URL.findall(self.code)
        if not found:
            return "memory://"
        scheme = brokerkit.BrokerURL.parse(found[0]).scheme
        return BROKERS.get(_SAME_BROKER.get(scheme, scheme), found[0])


def find_snippets(page: Path) -> Iterator[Snippet]:
    lines = page.read_text(encoding="utf-8").splitlines()
    rel = page.relative_to(ROOT).as_posix()
    previous: Snippet | None = None
    n = 0
    while n < len(lines):
        if lines[n].strip() != "```python":
            n += 1
            continue
        start = n + 1
        end = start
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        code = "\n".join(lines[start:end])
        marked = MARKER.fullmatch(lines[n - 1].strip()) if n > 0 else None
        marker = marked[1] if marked else None
        if marker is not None and marker not in MARKERS:
            raise AssertionError(f"{rel}:{n}: unknown snippet marker {marker!r} ({MARKERS})")
        if marker == "continued":
            if previous is None:
                raise AssertionError(f"{rel}:{n}: 'continued', but no block before it")
            previous.parts.append((start + 1, code))
        else:
            if previous is not None:
                yield previous
            previous = Snippet(rel, [(start + 1, code)], "pytest" if marker else "run")
        n = end + 1
    if previous is not None:
        yield previous


SNIPPETS = [s for page in PAGES for s in find_snippets(page)]


def test_the_pages_hold_python_blocks() -> None:
    assert SNIPPETS, f"no ```python block found in {[p.name for p in PAGES]}"
    assert any(s.page == "README.md" for s in SNIPPETS), "README.md's blocks were not found"


# -- running them ---------------------------------------------------------------------------


def _names_used(code: str) -> set[str]:
    return {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name)}


def _queues(code: str) -> set[str]:
    """The queue names the block passes as a literal first argument of a queue method."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in QUEUE_CALLS
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.add(node.args[0].value)
    return found


def _user_names(snippet: Snippet) -> dict[str, Any]:
    """The USER_CODE names the block says are the application's own."""
    stated = " ".join(
        line for line in snippet.code.splitlines() if "#" in line and USER_MARK in line
    )
    used = _names_used(snippet.code)
    return {
        name: value
        for name, value in USER_CODE.items()
        if name in used and re.search(rf"\b{name}\b", stated)
    }


async def _delete_queues(url: str, queues: set[str]) -> None:
    if not queues:
        return
    async with brokerkit.connect(url) as broker:
        for queue in sorted(queues):
            with contextlib.suppress(brokerkit.UnsupportedFeature):
                await broker.delete_queue(queue)


def _failure(snippet: Snippet, exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == snippet.page]
    where = f"{snippet.page}:{frames[-1].lineno}" if frames else snippet.where
    text = "".join(traceback.format_exception(exc))
    return f"{where}: the block raised {type(exc).__name__}: {exc}\n{text}"


async def _run(snippet: Snippet) -> None:
    namespace: dict[str, Any] = {"__name__": "__snippet__", **_user_names(snippet)}
    for line, code in snippet.parts:
        compiled = compile(
            "\n" * (line - 1) + code,
            snippet.page,
            "exec",
            flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
            dont_inherit=True,
        )
        result = eval(compiled, namespace)
        if asyncio.iscoroutine(result):
            await result


def _run_pytest(snippet: Snippet, tmp_path: Path) -> None:
    (line, code), *more = snippet.parts
    assert not more, f"{snippet.where}: a pytest block is one block"
    module = tmp_path / "test_snippet.py"
    module.write_text("\n" * (line - 1) + code + "\n", encoding="utf-8")
    config = tmp_path / "pytest.ini"
    config.write_text("[pytest]\nasyncio_mode = auto\n", encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(config), str(module), "-q", "-rA"],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    ok = done.returncode == 0 and re.search(r"\b[1-9]\d* passed\b", summary) is not None
    assert ok and "skipped" not in summary, (
        f"{snippet.where}: the pytest block did not pass ({summary!r}):\n"
        + done.stdout[-3000:]
        + done.stderr[-2000:]
    )


@pytest.mark.parametrize(
    ("snippet", "url"), [(s, s.url) for s in SNIPPETS], ids=[s.where for s in SNIPPETS]
)
async def test_the_block_runs_as_written(snippet: Snippet, url: str, tmp_path: Path) -> None:
    if snippet.mode == "pytest":
        _run_pytest(snippet, tmp_path)
        return
    tests = [
        node.name
        for node in ast.parse(snippet.code).body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    ]
    assert not tests, f"{snippet.where}: {tests} would only be defined: mark it 'pytest'"
    queues = _queues(snippet.code)
    await _delete_queues(url, queues)
    try:
        await asyncio.wait_for(_run(snippet), DEADLINE)
    except TimeoutError:
        pytest.fail(f"{snippet.where}: the block did not end within {DEADLINE:g} s")
    except Exception as exc:
        pytest.fail(_failure(snippet, exc))
    finally:
        await _delete_queues(url, queues)
