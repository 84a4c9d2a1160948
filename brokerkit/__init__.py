"""brokerkit: one producer/consumer API with the same semantics on every broker.

::

    async with brokerkit.connect("redis://localhost:6379/0") as broker:
        await broker.publish("orders", b"...", fifo_group="customer-7", dedup_id="order-1")
        async with broker.consumer("orders", group="billing") as consumer:
            async for msg in consumer:
                await msg.ack()

The behaviour is the contract in CONTRACT.md, proven per backend by
``brokerkit check URL``. Importing brokerkit imports no broker client library.
"""

from brokerkit._app import App
from brokerkit._broker import Broker, connect, from_backend
from brokerkit._codec import Codec, JsonCodec
from brokerkit._consumer import Consumer, Message
from brokerkit._errors import (
    AlreadySettled,
    BrokerkitError,
    BrokerRefused,
    BrokerUnavailable,
    ConfigError,
    InvalidArgument,
    InvalidMessage,
    InvalidName,
    LeaseExpired,
    MessageTooLarge,
    ResourceClosed,
    UnsupportedFeature,
)
from brokerkit._message import (
    BrowsedMessage,
    DeadLetterInfo,
    Outgoing,
    PublishResult,
    QueueStats,
)
from brokerkit._middleware import Middleware, Outcome, Route
from brokerkit._policy import Reject, RetryPolicy
from brokerkit._sync import SyncBroker
from brokerkit._url import BrokerURL
from brokerkit.backends.base import Capabilities

__version__ = "0.1.0"

__all__ = [
    "AlreadySettled",
    "App",
    "Broker",
    "BrokerRefused",
    "BrokerURL",
    "BrokerUnavailable",
    "BrokerkitError",
    "BrowsedMessage",
    "Capabilities",
    "Codec",
    "ConfigError",
    "Consumer",
    "DeadLetterInfo",
    "InvalidArgument",
    "InvalidMessage",
    "InvalidName",
    "JsonCodec",
    "LeaseExpired",
    "Message",
    "MessageTooLarge",
    "Middleware",
    "Outcome",
    "Outgoing",
    "PublishResult",
    "QueueStats",
    "Reject",
    "ResourceClosed",
    "RetryPolicy",
    "Route",
    "SyncBroker",
    "UnsupportedFeature",
    "__version__",
    "connect",
    "from_backend",
]
