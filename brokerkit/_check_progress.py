"""``brokerkit check``'s progress on stderr: which behaviour is running, how many tests are done.

A pytest plugin object. It replaces pytest's progress letters (the dots) with:

* on a terminal, a ``rich`` progress bar (when rich is installed: the ``check`` extra)
  naming the behaviour and test running, cleared when the run ends;
* otherwise (a CI log, a pipe, rich missing) one plain line each time the run moves
  on to another behaviour: ``[ 12/87] nack``.

A test that must wait out a window the broker fixes (the suite shortens it where the
broker lets it: ``?dedup_window=``) says so when it starts, on the bar and in a plain
line of its own: ``[ 40/87] dedup window: test_... waits out the broker's fixed 300 s
dedup window``, so a long silence reads as what it is.

Every write happens between tests (``pytest_runtest_logstart``/``logfinish``), never
from a thread, so pytest's output capture, active only inside a test's phases, never
swallows it. Test ids are redacted before they are shown. Failure reports, the end
summary and the table on stdout are unchanged.
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Iterable
from typing import IO, Any

import pytest

from brokerkit._broker import connect
from brokerkit._errors import BrokerkitError
from brokerkit._redact import redact

__all__ = ["Progress", "fixed_wait"]

FIXED_WINDOWS = {
    # behaviour: (the window's capability, the capability that lets the suite shorten it)
    "dedup window": ("dedup_window", "dedup_window_configurable"),
}
"""Behaviours whose tests wait a whole window out, and the capabilities that size it."""


def fixed_wait(behaviour: str, url: object) -> str | None:
    """What a test of ``behaviour`` on ``url`` waits for, when it waits out a fixed window."""
    spec = FIXED_WINDOWS.get(behaviour)
    if spec is None or not isinstance(url, str):
        return None
    try:
        capabilities = connect(url).capabilities  # no I/O: fixed when the backend is built
    except BrokerkitError:
        return None
    window, configurable = spec
    if getattr(capabilities, configurable):
        return None
    seconds = getattr(capabilities, window)
    return f"waits out the broker's fixed {seconds:g} s {behaviour}"


class Progress:
    """The progress plugin: give it to ``pytest.main(plugins=[...])``."""

    def __init__(
        self,
        stream: IO[str] | None = None,
        *,
        secrets: Iterable[str] = (),
        fancy: bool | None = None,
    ) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._secrets = tuple(secrets)
        if fancy is None:
            fancy = self._stream.isatty()
        self._bar: Any = _rich_bar(self._stream) if fancy else None
        self._task: Any = None
        self._behaviour_of: dict[str, str] = {}
        self._total = 0
        self._done = 0
        self._current: str | None = None
        self._passive = False
        self._waits: dict[str, str] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(
        self, report: Any
    ) -> Generator[None, tuple[str, str, Any], tuple[str, str, Any]]:
        """Keep each report's category (the summary counts it) but print no letter for it."""
        status = yield
        return status if self._passive else (status[0], "", "")

    def pytest_configure(self, config: Any) -> None:
        """Verbose (``-v``, also from PYTEST_ADDOPTS): pytest's own per-test lines instead."""
        self._passive = config.option.verbose > 0
        if self._passive:
            self.stop()

    def pytest_collection_finish(self, session: Any) -> None:
        for item in session.items:
            marker = item.get_closest_marker("behaviour")
            # a test of no behaviour (e.g. delete_queue) is shown by its own name
            name = marker.args[0] if marker else getattr(item, "originalname", item.name)
            self._behaviour_of[item.nodeid] = name
            callspec = getattr(item, "callspec", None)
            url = callspec.params.get("broker_url") if callspec is not None else None
            wait = fixed_wait(name, url)
            if wait is not None:
                self._waits[item.nodeid] = wait
        self._total = len(session.items)
        if self._bar is not None and not self._passive:
            self._bar.start()
            self._task = self._bar.add_task("check", total=self._total)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        if self._passive:
            return
        behaviour = self._behaviour_of.get(nodeid, nodeid)
        wait = self._waits.get(nodeid)
        test = redact(nodeid.rpartition("::")[2], self._secrets)
        if self._bar is not None:
            note = f" ({wait})" if wait else ""
            self._bar.update(self._task, description=f"{behaviour}: {test}{note}")
            self._bar.refresh()
        elif behaviour != self._current or wait:
            width = len(str(self._total))
            line = f"{behaviour}: {test} {wait}" if wait else behaviour
            self._stream.write(f"[{self._done:>{width}}/{self._total}] {line}\n")
            self._stream.flush()
        self._current = behaviour

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        if self._passive:
            return
        self._done += 1
        if self._bar is not None:
            self._bar.update(self._task, completed=self._done)
            self._bar.refresh()

    def pytest_sessionfinish(self) -> None:
        self.stop()

    def stop(self) -> None:
        """Clear the bar (idempotent): the run ended or was interrupted."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _rich_bar(stream: IO[str]) -> Any:
    """A transient rich progress bar on ``stream``, refreshed only when told; None without rich."""
    try:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress
    except ModuleNotFoundError:
        return None
    return RichProgress(
        TextColumn("[bold]check[/bold]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}", markup=False),  # test ids hold [brackets]
        console=Console(file=stream, stderr=True),
        auto_refresh=False,  # no thread: a write during a test would land in its capture
        transient=True,
        redirect_stdout=False,
        redirect_stderr=False,
    )
