"""The suite's TCP proxy (``contract_tests/_proxy.py``) closes every socket it accepted.

A network-cut run on Kafka passed its tests and still failed: pytest turned a
ResourceWarning for an unclosed socket on the proxy's port into an error at exit.
librdkafka reconnects all the time, so connections arrive while the proxy closes; one
accepted just before ``Server.close`` got its transport after it, and asyncio 3.11
never closes such a socket. Here clients connect and the proxy closes at once, ten
times over: no socket of the proxy may be left for the garbage collector.
"""

from __future__ import annotations

import gc
import socket
import warnings

from contract_tests._proxy import Proxy


def test_close_while_connections_arrive_leaves_no_socket_open() -> None:
    upstream = socket.create_server(("127.0.0.1", 0))
    host, port = upstream.getsockname()
    leaks: list[str] = []
    try:
        for _ in range(10):
            proxy = Proxy(host, port)
            listen = proxy.start()
            clients = [socket.create_connection(("127.0.0.1", listen)) for _ in range(20)]
            try:
                with warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    proxy.close()
                    gc.collect()
                leaks += [str(w.message) for w in seen if w.category is ResourceWarning]
            finally:
                for client in clients:
                    client.close()
    finally:
        upstream.close()
    assert not leaks, leaks[:3]
