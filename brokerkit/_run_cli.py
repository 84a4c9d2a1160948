"""``brokerkit run module:app``: run an App's handlers until SIGTERM/SIGINT."""

from __future__ import annotations

import importlib
import logging
import os
import sys

import click

from brokerkit._app import App
from brokerkit._guard import guarded
from brokerkit._redact import RedactingFormatter

__all__ = ["load_app", "run"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def load_app(target: str) -> App:
    """The App named by ``package.module:attribute`` (``attribute`` defaults to ``app``)."""
    module_name, _, attribute = target.partition(":")
    if not module_name:
        raise click.BadParameter("use module:attribute, e.g. examples.email_worker:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the project's own modules
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise click.BadParameter(f"no module named {module_name!r}") from None
        raise
    app = getattr(module, attribute or "app", None)
    if not isinstance(app, App):
        found = type(app).__name__ if app is not None else "nothing"
        raise click.BadParameter(f"{target!r} is {found}, not a brokerkit.App")
    return app


@click.command()
@click.argument("target")
@click.option("--url", envvar="BROKERKIT_URL", help="Broker URL (env BROKERKIT_URL).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), help="Serve /metrics here.")
@click.option("--drain-timeout", type=click.FloatRange(0), default=30.0, show_default=True,
              help="Seconds in-flight handlers get to finish after SIGTERM/SIGINT.")  # fmt: skip
def run(target: str, url: str | None, metrics_port: int | None, drain_timeout: float) -> None:
    """Run the App TARGET (module:attribute) until SIGTERM or SIGINT, then drain.

    The URL: --url, else BROKERKIT_URL, else the App's own. Logs at INFO to stderr,
    redacted (``brokerkit --log-level LEVEL run ...`` for another level). Exit status: 0
    stopped and drained, 1 failed (e.g. broker unavailable), 3 stopped with messages
    given back unfinished (redelivered later, never acked).
    """
    app = load_app(target)
    root = logging.getLogger()
    if not root.handlers:  # else `brokerkit --log-level ...` (or the user) configured it
        handler = logging.StreamHandler()
        handler.setFormatter(RedactingFormatter(_FORMAT))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
    shown = url or (app.url if isinstance(app.url, str) else "") or ""
    sys.exit(
        guarded(shown, lambda: app.run(url, metrics_port=metrics_port, drain_timeout=drain_timeout))
    )
