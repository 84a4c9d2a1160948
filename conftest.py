"""Test-run plumbing of this repository (not shipped: ``brokerkit check`` never loads it).

With pytest-xdist (``scripts/test-all`` runs the main suite with ``-n 2 --dist loadgroup``)
every test that talks to one of the shared brokers goes to the same worker as the other
tests of that broker, so each broker sees one test at a time, as in a serial run: the
contract's timing-sensitive behaviours (leases, redelivery slack, the crash behaviour) are
never measured against a broker that another test is loading at the same moment. Tests of
pure logic and of memory:// carry no group and are spread freely.
"""

from __future__ import annotations

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
