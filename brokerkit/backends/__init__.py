"""The backend toolkit: everything a backend author needs, public and stable.

::

    from brokerkit.backends import Backend, Receiver, Delivery, QueueRef, Capabilities

The seam (``Backend``, ``Receiver`` and the values they exchange) is documented in
``brokerkit.backends.base``; README's "Writing a backend" walks through one. The shared
mechanisms are written once here, so no backend writes its own:

* ``Options`` / ``parse_options``: typed URL query options (or a mapping), unknown keys
  are ConfigErrors that never echo a value;
* ``retry_unavailable`` (``_blocking`` on a driver's thread): the bounded connect retry
  before ``BrokerUnavailable``;
* ``ErrorMap``: a backend's one table of driver exception -> brokerkit error;
* ``GroupGate``: per-fifo_group exclusivity; ``LeaseBook``: ready / due-later / leased
  items with tokens, for backends that hold leases themselves; ``DedupWindow``: an
  expiring dedup-id memory whose clock is a parameter;
* the wire names every backend uses for what its broker has no field for
  (``FIFO_GROUP_HEADER``, ``DEDUP_ID_HEADER``, ``HEADER_PREFIX``).

Importing this package imports no driver; each backend lives in its own subpackage,
imported only when its scheme is used.
"""

from brokerkit._dedup import DedupWindow
from brokerkit._errmap import ErrorMap
from brokerkit._errors import (
    BrokerRefused,
    BrokerUnavailable,
    ConfigError,
    LeaseExpired,
    MessageTooLarge,
    ResourceClosed,
    UnsupportedFeature,
)
from brokerkit._fifo import GroupGate
from brokerkit._foreign import header_defect, json_headers, str_headers, valid_token
from brokerkit._leases import LeaseBook, Leased
from brokerkit._message import Outgoing, PublishResult, QueueStats, publish_results
from brokerkit._options import Options, parse_options
from brokerkit._retry import retry_unavailable, retry_unavailable_blocking
from brokerkit._url import BrokerURL, HostPort
from brokerkit._wire import DEDUP_ID_HEADER, FIFO_GROUP_HEADER, HEADER_PREFIX
from brokerkit.backends.base import (
    NO_EXTRAS,
    NO_HEADERS,
    Backend,
    Capabilities,
    Delivery,
    PublishCopy,
    QueueRef,
    Receiver,
    ReceiverSettings,
)

__all__ = [
    "DEDUP_ID_HEADER",
    "FIFO_GROUP_HEADER",
    "HEADER_PREFIX",
    "NO_EXTRAS",
    "NO_HEADERS",
    "Backend",
    "BrokerRefused",
    "BrokerURL",
    "BrokerUnavailable",
    "Capabilities",
    "ConfigError",
    "DedupWindow",
    "Delivery",
    "ErrorMap",
    "GroupGate",
    "HostPort",
    "LeaseBook",
    "LeaseExpired",
    "Leased",
    "MessageTooLarge",
    "Options",
    "Outgoing",
    "PublishCopy",
    "PublishResult",
    "QueueRef",
    "QueueStats",
    "Receiver",
    "ReceiverSettings",
    "ResourceClosed",
    "UnsupportedFeature",
    "header_defect",
    "json_headers",
    "parse_options",
    "publish_results",
    "retry_unavailable",
    "retry_unavailable_blocking",
    "str_headers",
    "valid_token",
]
