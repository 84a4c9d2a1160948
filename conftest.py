"""Test-run plumbing of this repository (not shipped: ``brokerkit check`` never loads it).

With pytest-xdist (``scripts/test-all`` runs the main suite with ``-n 2 --dist loadgroup``)
every test that talks to one of the shared brokers goes to the same worker as the other
tests of that broker, so each broker sees one test at a time, as in a serial run: the
contract's timing-sensitive behaviours (leases, redelivery slack, the crash behaviour) are
never measured against a broker that another test is loading at the same moment. Tests of
pure logic and of memory:// carry no group and are spread freely.
"""

from __future__ import annotations

import asyncio
import faulthandler
import gc
import os
import re
import sys
import threading
from pathlib import Path

import pytest

# tests/integration/test_<broker>_*.py talk to that broker (or to a throwaway node of it)
_FILE_PREFIXES = {
    "test_kafka_": "kafka",
    "test_nats_": "nats",
    "test_rabbitmq_": "amqp",
    "test_redis_": "redis",
    "test_sqs_": "sqs",
}
_SAME_BROKER = {"rediss": "redis", "amqps": "amqp", "tls": "nats"}


def broker_group(item: pytest.Item) -> str | None:
    """The broker a test uses, as a scheme (``amqp``, ``kafka``…), or None for no broker."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    for name in ("broker_url", "url"):  # the contract's fixture; tests/integration's param
        scheme = str(params.get(name, "")).partition("://")[0]
        if scheme and scheme != "memory":
            return _SAME_BROKER.get(scheme, scheme)
    name = item.path.name
    for prefix, group in _FILE_PREFIXES.items():
        if name.startswith(prefix):
            return group
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        group = broker_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker under ``--dist loadgroup``: every grouped test must carry its
    group in its node id (``…@redis``), which is how xdist's scheduler sees the group.
    pytest 9.2 silently broke that with xdist 3.8 (pytest-dev/pytest-xdist#1386): tests
    of one broker then ran on both workers at once. Refuse to run so, loudly."""
    # a worker has ``workerinput``; a subprocess a test starts inherits only its environment
    if not hasattr(session.config, "workerinput"):
        return
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid
    ]
    if lost:
        text = (
            f"--dist loadgroup is not grouping: {len(lost)} tests marked xdist_group have no "
            f"group in their node id (e.g. {lost[0]}); pytest {pytest.__version__} with this "
            "pytest-xdist drops the groups (pytest-dev/pytest-xdist#1386): install pytest<9.2"
        )
        # xdist turns a worker's error here into an opaque INTERNALERROR: say it first
        print(f"!! {text}", file=sys.__stderr__, flush=True)
        raise pytest.UsageError(text)


# A test that hangs must fail with a report, not stall CI until its hard limit:
# scripts/test-all and scripts/fault-check run pytest with pytest-timeout's ``--timeout``
# (method ``thread``: on expiry the worker ends, and pytest-xdist reports that test as
# failed). What the timeout prints is lost with the worker's captured output, and thread
# stacks show only the event loop waiting in select(); so a little before the timeout the
# test's pending asyncio tasks (the coroutine each is stuck in names the hang) and every
# thread's stack are written to a file in $BROKERKIT_HANG_REPORTS, which scripts/test-all
# prints at the end.
_TASK_REPORT_LEAD_S = 15.0
_task_report_timers: dict[str, threading.Timer] = {}


def _write_hang_report(nodeid: str, directory: Path) -> None:
    tasks = [o for o in gc.get_objects() if isinstance(o, asyncio.Task) and not o.done()]
    directory.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid)[-150:]
    with open(directory / f"{os.getpid()}-{name}.txt", "w") as out:
        print(f"{nodeid}: near its timeout; {len(tasks)} pending asyncio tasks", file=out)
        for task in tasks:
            print(f"--- {task!r}", file=out)
            task.print_stack(limit=12, file=out)
        print("--- every thread", file=out)
        out.flush()
        faulthandler.dump_traceback(out, all_threads=True)


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: object) -> None:
    timeout = float(getattr(settings, "timeout", 0) or 0)
    directory = os.environ.get("BROKERKIT_HANG_REPORTS")
    if not directory or timeout <= _TASK_REPORT_LEAD_S:
        return
    timer = threading.Timer(
        timeout - _TASK_REPORT_LEAD_S, _write_hang_report, (item.nodeid, Path(directory))
    )
    timer.daemon = True
    timer.start()
    _task_report_timers[item.nodeid] = timer


@pytest.hookimpl(optionalhook=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> None:
    timer = _task_report_timers.pop(item.nodeid, None)
    if timer is not None:
        timer.cancel()
