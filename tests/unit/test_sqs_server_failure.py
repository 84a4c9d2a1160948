"""SQS: an endpoint that answers every request with HTTP 503 gives BrokerUnavailable.

ElasticMQ under load (a benchmark's queues holding ~180 000 messages) answered
GetQueueUrl with ``503`` and a plain-text body ("The server was not able to produce a
timely response to your request.") after botocore's retries, and brokerkit raised
BrokerRefused: the error a caller treats as final, and one a consumer does not ride out.
The server here gives exactly that answer to every request, so botocore's real retry and
parsing run over real HTTP; no broker can be made to answer 503 on demand.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import brokerkit

pytest.importorskip("boto3")

_BODY = (
    b"The server was not able to produce a timely response to your request.\r\n"
    b"Please try again in a short while!"
)


class _Overloaded(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(503)
        self.send_header("Content-Type", "text/plain; charset=UTF-8")
        self.send_header("Content-Length", str(len(_BODY)))
        self.end_headers()
        self.wfile.write(_BODY)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Overloaded)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_an_endpoint_answering_503_is_unavailable_and_named(endpoint: int) -> None:
    url = f"sqs://?endpoint=http://127.0.0.1:{endpoint}&region=us-east-1&max_attempts=2"

    async def publish() -> None:
        async with brokerkit.connect(url) as broker:
            await broker.publish("q", b"x")

    started = time.monotonic()
    with pytest.raises(brokerkit.BrokerUnavailable) as caught:
        asyncio.run(asyncio.wait_for(publish(), 60))
    assert (caught.value.host, caught.value.port) == ("127.0.0.1", endpoint)
    assert "timely response" in str(caught.value)
    assert time.monotonic() - started < 60
