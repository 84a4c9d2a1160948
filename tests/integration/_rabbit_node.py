"""A throwaway RabbitMQ node for the integration tests (never the shared one on 5672).

Its own node name, AMQP port, distribution port and data directory, registered with the
epmd already on 127.0.0.1:4369 (scripts/services starts it; without one, rabbitmq-server
starts an epmd of its own, which outlives the test). Optionally a TLS listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import aiormq

RABBIT_BIN = Path("/usr/lib/rabbitmq/bin")
READY_TIMEOUT = 120.0  # a cold RabbitMQ boot on a loaded 2-core machine
STOP_TIMEOUT = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RabbitNode:
    """One throwaway RabbitMQ node; ``stop``/``start`` keep its ports and data."""

    def __init__(self, workdir: Path, *, tls: tuple[Path, Path, Path] | None = None) -> None:
        """``tls``: (CA, certificate, key) files for an extra TLS listener on ``tls_port``."""
        self.workdir = workdir
        self.port = _free_port()
        self.dist_port = _free_port()
        self.tls_port = _free_port()
        self.node = f"bk-test-{uuid.uuid4().hex[:8]}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None
        for sub in ("home", "mnesia", "log"):
            (workdir / sub).mkdir(parents=True, exist_ok=True)
        conf = (
            f"listeners.tcp.default = 127.0.0.1:{self.port}\n"
            "loopback_users.guest = true\nlog.console = true\nlog.file = false\n"
        )
        if tls is not None:
            ca, cert, key = tls
            conf += (
                f"listeners.ssl.default = 127.0.0.1:{self.tls_port}\n"
                f"ssl_options.cacertfile = {ca}\nssl_options.certfile = {cert}\n"
                f"ssl_options.keyfile = {key}\nssl_options.verify = verify_none\n"
                "ssl_options.fail_if_no_peer_cert = false\n"
            )
        (workdir / "rabbitmq.conf").write_text(conf)
        (workdir / "rabbitmq-env.conf").write_text("# empty: keeps /etc/rabbitmq out\n")
        (workdir / "enabled_plugins").write_text("[].\n")

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/"

    def env(self) -> dict[str, str]:
        d = self.workdir
        loop = "-kernel inet_dist_use_interface {127,0,0,1}"
        return dict(
            os.environ,
            ERL_EPMD_ADDRESS="127.0.0.1",
            ERL_EPMD_PORT="4369",
            HOME=str(d / "home"),
            RABBITMQ_NODENAME=self.node,
            RABBITMQ_USE_LONGNAME="false",
            RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=loop,
            RABBITMQ_CTL_ERL_ARGS=loop,
            RABBITMQ_BASE=str(d),
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq.conf"),
            RABBITMQ_CONF_ENV_FILE=str(d / "rabbitmq-env.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
            RABBITMQ_LOG_BASE=str(d / "log"),
            RABBITMQ_LOGS="-",
            RABBITMQ_PID_FILE=str(d / "node.pid"),
        )

    def start(self) -> None:
        log = open(self.workdir / "node.log", "ab")
        self.proc = subprocess.Popen(
            [str(RABBIT_BIN / "rabbitmq-server")],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() signals the whole node
        )
        log.close()

    async def ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"RabbitMQ node exited early, see {self.workdir}/node.log")
            with contextlib.suppress(Exception):
                conn = await asyncio.wait_for(aiormq.connect(self.url), 5)
                await conn.close()
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"RabbitMQ node on {self.port} not ready in {READY_TIMEOUT}s")
            await asyncio.sleep(0.5)

    def stop(self) -> None:
        """SIGTERM to the node's process group (a graceful stop), SIGKILL if it hangs."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT)
        self._reap_group(proc.pid)

    @staticmethod
    def _reap_group(pgid: int) -> None:
        """Erlang helpers (erl_child_setup, inet_gethost) may outlive beam: end them too."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            time.sleep(0.1)
