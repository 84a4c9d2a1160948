"""A TCP proxy the suite controls, for the ``network cut`` behaviour (``--proxy``).

Runs its own event loop in a thread (so a client that blocks the test's loop cannot
stall it). ``cut()`` makes the path behave like a pulled cable: no byte moves in either
direction on any connection (nothing is closed, nothing is refused: the bytes wait,
as TCP retransmits would), and new connections are accepted but not connected through
until ``restore()``. Whatever a client does meanwhile (time out, close, reconnect)
is its own doing. Toxiproxy would do the same over HTTP; this one needs nothing
installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar
from urllib.parse import SplitResult, urlsplit, urlunsplit

import brokerkit

T = TypeVar("T")
HOST = "127.0.0.1"


class Proxy:
    """Forwards 127.0.0.1:``port`` to ``upstream``; ``cut``/``restore`` the path."""

    def __init__(self, upstream_host: str, upstream_port: int, listen_port: int = 0) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listen_port = listen_port
        self.port = 0
        self.connections = 0
        self.bytes = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._closing = False
        self._accepted = 0

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def start(self) -> int:
        self._thread.start()
        self.port = self._run(self._start())
        return self.port

    async def _start(self) -> int:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._handle, HOST, self._listen_port)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    def cut(self) -> None:
        self._run(self._set(False))

    def restore(self) -> None:
        self._run(self._set(True))

    async def _set(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    def close(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self._run(self._close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        if not self._loop.is_running():
            self._loop.close()

    async def _close(self) -> None:
        self._closing = True  # a handler that starts from now on aborts its connection
        loop = asyncio.get_running_loop()
        if self._server is not None:
            # Stop accepting first, then let what was accepted reach its handler, then
            # close the server: a socket accepted just before ``Server.close`` whose
            # transport is made after it is never closed (asyncio 3.11's ``_attach``
            # asserts in its accept task), and its ResourceWarning failed a run.
            for sock in self._server.sockets:
                loop.remove_reader(sock.fileno())
            deadline, last = loop.time() + 2.0, -1
            while self._accepted != last and loop.time() < deadline:
                last = self._accepted
                await asyncio.sleep(0.02)
            self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()  # close() would wait to flush what a peer never reads
        assert self._flowing is not None
        self._flowing.set()  # let held pumps see the closed sockets and end
        handlers = list(self._handlers)
        for task in handlers:  # ended here, not destroyed pending with the loop
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        # an aborted transport closes its socket in a call_soon callback: it runs before
        # this task resumes
        await asyncio.sleep(0)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        self._accepted += 1
        if self._closing:
            writer.transport.abort()
            return
        self.connections += 1
        self._writers.add(writer)
        me = asyncio.current_task()
        assert me is not None
        self._handlers.add(me)
        try:
            await self._connect_through(reader, writer)
        finally:
            self._handlers.discard(me)

    async def _connect_through(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        assert self._flowing is not None
        try:
            await self._flowing.wait()  # a new connection during a cut waits, like a SYN
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            self._writers.discard(writer)
            return
        if self._closing:  # connected while the proxy closed
            for w in (writer, up_writer):
                w.transport.abort()
                self._writers.discard(w)
            return
        self._writers.add(up_writer)
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer)),
            asyncio.ensure_future(self._pump(up_reader, writer)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (writer, up_writer):
                w.close()
                self._writers.discard(w)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                await self._flowing.wait()
                data = await src.read(65536)
                if not data:
                    return
                await self._flowing.wait()  # cut while reading: the bytes wait for restore
                dst.write(data)
                self.bytes += len(data)
                await dst.drain()


@dataclasses.dataclass
class Path:
    """The proxies of one URL (one per broker host), cut and restored together."""

    url: str
    """The URL rewritten to go through the proxies (real: password included)."""
    proxies: list[Proxy]

    def cut(self) -> None:
        for proxy in self.proxies:
            proxy.cut()

    def restore(self) -> None:
        for proxy in self.proxies:
            proxy.restore()

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()

    @property
    def connections(self) -> int:
        return sum(p.connections for p in self.proxies)


def through_proxy(url: str, listen_port: int = 0) -> Path:
    """Start proxies for ``url``'s hosts (or its ``endpoint`` parameter, e.g. SQS) and
    return the URL rewritten to them. ``listen_port`` fixes the port (one host only)."""
    parsed = brokerkit.BrokerURL.parse(url)
    proxies: list[Proxy] = []
    if parsed.hosts:
        if listen_port and len(parsed.hosts) > 1:
            raise ValueError("--proxy-port needs a URL with one host")
        hosts = []
        for hp in parsed.hosts:
            proxy = Proxy(hp.host, hp.port or _default_port(parsed.scheme), listen_port)
            proxies.append(proxy)
            hosts.append(type(hp)(HOST, proxy.start()))
        return Path(dataclasses.replace(parsed, hosts=tuple(hosts)).render(), proxies)
    found = _endpoint(parsed)
    if found is None:
        raise ValueError(f"{parsed.scheme}:// URL has no host (nor endpoint) to proxy")
    split, host, port = found
    proxy = Proxy(host, port, listen_port)
    proxies.append(proxy)
    new = urlunsplit(split._replace(netloc=f"{HOST}:{proxy.start()}"))
    query = tuple((k, new if k == "endpoint" else v) for k, v in parsed.query)
    return Path(dataclasses.replace(parsed, query=query).render(), proxies)


def first_address(url: str) -> tuple[str, int] | None:
    """The host and port ``url`` connects to first: its first host (the scheme's default
    port if it names none) or its ``endpoint`` parameter (e.g. SQS); None without either."""
    parsed = brokerkit.BrokerURL.parse(url)
    try:
        if parsed.hosts:
            first = parsed.hosts[0]
            return first.host, first.port or _default_port(parsed.scheme)
        found = _endpoint(parsed)
    except ValueError:
        return None
    return None if found is None else found[1:]


def _endpoint(parsed: brokerkit.BrokerURL) -> tuple[SplitResult, str, int] | None:
    """The ``endpoint`` parameter (split), its host and port; None if there is none."""
    endpoint = parsed.params.get("endpoint")
    if not endpoint:
        return None
    split = urlsplit(endpoint)
    if split.hostname is None:
        raise ValueError("the endpoint parameter has no host to proxy")
    return split, split.hostname, split.port or (443 if split.scheme == "https" else 80)


def _default_port(scheme: str) -> int:
    ports = {"redis": 6379, "rediss": 6379, "nats": 4222, "tls": 4222, "kafka": 9092}
    ports |= {"amqp": 5672, "amqps": 5671}
    if scheme not in ports:
        raise ValueError(f"no default port known for {scheme}://: give one in the URL")
    return ports[scheme]
