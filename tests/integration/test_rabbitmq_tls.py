"""``amqps://`` end to end: a throwaway RabbitMQ node with a TLS listener (its own CA).

The CA and the server certificate (for IP 127.0.0.1) are made with the ``openssl`` CLI in
a temporary directory. Checked: publish and consume over TLS with ``?tls_ca=`` (server
certificate and host verified); the same URL without the CA fails to verify and is
refused at once with a ConfigError naming the TLS reason (no password in it);
``tls_verify=false`` connects.
Skipped when the rabbitmq-server scripts or openssl are not installed.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import brokerkit

pytest.importorskip("aiormq", reason="aio-pika is not installed (brokerkit-mq[rabbitmq])")

from _process import required
from _rabbit_node import RABBIT_BIN, RabbitNode


@pytest.fixture(autouse=True)
def _rabbitmq_server_and_openssl() -> None:
    """Mandatory: without rabbitmq-server (scripts/services) or openssl, fail (never skip)."""
    found = RABBIT_BIN / "rabbitmq-server"
    required(str(found) if found.exists() else None, f"no {found} (scripts/services up rabbitmq)")
    required(shutil.which("openssl"), "no openssl CLI (it makes the test's certificates)")


def _certificates(d: Path) -> tuple[Path, Path, Path]:
    ca_key, ca, key, csr, cert = (d / n for n in ("ca.key", "ca.pem", "s.key", "s.csr", "s.pem"))
    ext = d / "ext.cnf"
    ext.write_text("subjectAltName = IP:127.0.0.1\nbasicConstraints = CA:FALSE\n")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out",
        str(ca), "-days", "2", "-subj", "/CN=brokerkit test CA")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=127.0.0.1")  # fmt: skip
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))  # fmt: skip
    for path in (key, ca_key):
        path.chmod(0o644)  # the node runs as this user; readable is enough
    return ca, cert, key


@pytest_asyncio.fixture
async def node(tmp_path: Path) -> AsyncIterator[RabbitNode]:
    certs = tmp_path / "certs"
    certs.mkdir()
    n = RabbitNode(tmp_path / "node", tls=_certificates(certs))
    n.start()
    try:
        await n.ready()
        yield n
    finally:
        n.stop()


async def test_amqps_round_trip_and_verification(node: RabbitNode, tmp_path: Path) -> None:
    ca = tmp_path / "certs" / "ca.pem"
    base = f"amqps://guest:guest@127.0.0.1:{node.tls_port}/"
    queue = f"tls-{uuid.uuid4().hex[:8]}"
    async with brokerkit.connect(f"{base}?tls_ca={ca}") as broker:
        sent = await broker.publish(queue, b"over tls", fifo_group="g")
        async with broker.consumer(queue) as consumer:
            msg = await asyncio.wait_for(consumer.__anext__(), 20)
            assert (msg.id, msg.body) == (sent.id, b"over tls")
            await msg.ack()
        await broker.delete_queue(queue)

    unverified = brokerkit.connect(base.replace("guest@", "s3cret@") + "?connect_timeout=3")
    with pytest.raises(brokerkit.ConfigError, match="CERTIFICATE_VERIFY_FAILED") as info:
        await unverified.open()  # the test CA is not trusted: refused at once, not retried
    assert "s3cret" not in str(info.value) and "s3cret" not in repr(info.value)
    await unverified.aclose()

    async with brokerkit.connect(f"{base}?tls_verify=false") as broker:
        await broker.publish(queue, b"unverified but encrypted")
        await broker.delete_queue(queue)
