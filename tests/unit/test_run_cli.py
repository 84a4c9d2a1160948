"""``brokerkit run``: finding the App, the URL's precedence, and the exit status on failure."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import brokerkit
from brokerkit._cli import main
from brokerkit._run_cli import load_app
from brokerkit._runner import EXIT_FAILED, EXIT_OK, EXIT_UNDRAINED, run_service


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"svc_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            import brokerkit
            app = brokerkit.App("nope://nowhere")
            other = 42

            @app.handler("q")
            async def work(body: bytes) -> None:
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_load_app_finds_module_attribute_and_defaults_to_app(module: str) -> None:
    assert isinstance(load_app(f"{module}:app"), brokerkit.App)
    assert load_app(module) is load_app(f"{module}:app")
    with pytest.raises(click.BadParameter, match=r"not a brokerkit\.App"):
        load_app(f"{module}:other")
    with pytest.raises(click.BadParameter, match="no module named"):
        load_app("no_such_module_here:app")


def test_a_start_failure_exits_1_naming_the_cause(module: str) -> None:
    result = CliRunner().invoke(main, ["run", f"{module}:app"], catch_exceptions=False)
    assert result.exit_code == 1  # ConfigError: unknown scheme 'nope'


def test_url_option_and_env_override_the_apps_own(
    module: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str | None] = []

    def fake_run(self: brokerkit.App, url: str | None = None, **kw: object) -> int:
        seen.append(url)
        return 0

    monkeypatch.setattr(brokerkit.App, "run", fake_run)
    runner = CliRunner()
    assert runner.invoke(main, ["run", module, "--url", "memory://a"]).exit_code == 0
    assert runner.invoke(main, ["run", module], env={"BROKERKIT_URL": "memory://b"}).exit_code == 0
    assert runner.invoke(main, ["run", module], env={"BROKERKIT_URL": None}).exit_code == 0
    assert seen == ["memory://a", "memory://b", None]  # None: App(url) stays


class _Stub:
    def __init__(self, result: int | Exception) -> None:
        self.result = result
        self.stops = 0

    async def serve(self, *, drain_timeout: float) -> int:
        if isinstance(self.result, Exception):
            raise self.result
        return self.result

    def request_stop(self) -> None:
        self.stops += 1


def test_exit_status_says_drained_failed_or_given_back() -> None:
    assert run_service(_Stub(0), drain_timeout=1.0) == EXIT_OK == 0
    assert run_service(_Stub(2), drain_timeout=1.0) == EXIT_UNDRAINED == 3
    failed = _Stub(brokerkit.BrokerUnavailable("127.0.0.1:1 refused"))
    assert run_service(failed, drain_timeout=1.0) == EXIT_FAILED == 1


def test_a_failing_run_prints_no_credential(module: str, caplog: pytest.LogCaptureFixture) -> None:
    secret = "pw-run-7f3a9c"
    url = f"nope://user:{secret}@127.0.0.1:1"
    with caplog.at_level("DEBUG"):
        result = CliRunner().invoke(main, ["run", module, "--url", url])
    assert result.exit_code == 1
    assert "the service failed: ConfigError" in caplog.text  # it did fail on the URL
    assert secret not in result.output and secret not in caplog.text
