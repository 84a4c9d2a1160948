"""Running a service until SIGTERM or SIGINT: ``app.run()`` and ``brokerkit run module:app``.

On the first signal, intake stops and in-flight handlers get ``drain_timeout`` seconds
to finish; a second signal cuts the drain short. What has not finished by then is
interrupted and given back unsettled (redelivered later, never acked). Exit status:

* 0 (``EXIT_OK``): stopped by a signal (or ``request_stop``), every handler finished;
* 1 (``EXIT_FAILED``): could not start or run (broker unavailable, bad configuration);
* 3 (``EXIT_UNDRAINED``): stopped, but some messages were given back unfinished.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from typing import Protocol

from brokerkit._errors import BrokerkitError

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_UNDRAINED = 0, 1, 3

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_UNDRAINED", "Service", "run_service"]


class Service(Protocol):
    """What the runner needs of an App."""

    async def serve(self, *, drain_timeout: float) -> int:
        """Run until stopped; return how many messages were given back unfinished."""
        ...

    def request_stop(self) -> None:
        """Stop intake and drain; a second call cuts the drain short."""
        ...


def run_service(service: Service, *, drain_timeout: float) -> int:
    """Run ``service`` in a new event loop until a signal stops it; the exit status."""
    return asyncio.run(_main(service, drain_timeout))


async def _main(service: Service, drain_timeout: float) -> int:
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:
        for sig in signals:
            loop.add_signal_handler(sig, _on_signal, service, sig)
    try:
        unfinished = await service.serve(drain_timeout=drain_timeout)
    except BrokerkitError as exc:
        log.error("the service failed: %s: %s", type(exc).__name__, exc)
        return EXIT_FAILED
    finally:
        if in_main_thread:
            for sig in signals:
                loop.remove_signal_handler(sig)
    if unfinished:
        log.warning("stopped; %d unfinished message(s) given back", unfinished)
        return EXIT_UNDRAINED
    log.info("stopped; every in-flight handler finished")
    return EXIT_OK


def _on_signal(service: Service, sig: signal.Signals) -> None:
    log.info("%s: stopping intake, draining in-flight handlers", sig.name)
    service.request_stop()
