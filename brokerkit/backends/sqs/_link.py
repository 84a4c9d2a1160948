"""The connection both the backend and its receivers use: one boto3 client, its thread
pool, the error map, and the catalogue of SQS queues (names, URLs, creation, group claims).

boto3 is blocking; its low-level clients are thread-safe once made. Every call runs in a
thread pool of this connection's own (``threads=``, default 16), never the event loop's
default executor: a long poll holds a thread for its whole ``WaitTimeSeconds``, and a busy
default executor must not starve it (nor it the application's ``to_thread`` calls).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

from brokerkit.backends import ConfigError, ErrorMap, QueueRef, UnsupportedFeature
from brokerkit.backends.sqs._errors import DELETED_RECENTLY, DENIED, NOT_FOUND, aws_code, scrub

__all__ = ["BATCH", "FIFO_ATTRIBUTES", "Link", "batches", "sqs_name"]

_log = logging.getLogger(__name__)

FIFO_ATTRIBUTES = {"FifoQueue": "true", "ContentBasedDeduplication": "false"}
BATCH = 10
"""SQS's most entries per ``*Batch`` call (send, delete, change visibility)."""
T = TypeVar("T")


def batches(items: Sequence[T]) -> Iterator[Sequence[T]]:
    """``items`` in slices of at most ``BATCH``, in order."""
    for start in range(0, len(items), BATCH):
        yield items[start : start + BATCH]


"""What brokerkit needs of its queues (and all it sets: the rest stays as the owner made it)."""
_NAME_LIMIT = 80
_DLQ_MARK = "_dlq_"  # user names never start with "_", so no user queue can be named so
_GROUP_TAG = "brokerkit:group:"
_RECREATE_WAIT = 70.0  # AWS: "wait 60 seconds after deleting a queue before creating one
# with the same name"


def sqs_name(prefix: str, ref: QueueRef) -> str:
    """``<prefix><queue>.fifo``, or ``<prefix>_dlq_<queue>.fifo`` for its DLQ."""
    middle = _DLQ_MARK if ref.dead_letters else ""
    name = f"{prefix}{middle}{ref.name}.fifo"
    if len(name) > _NAME_LIMIT:
        raise ConfigError(
            f"SQS queue names have at most {_NAME_LIMIT} characters: prefix= plus the "
            f"queue name {ref.name!r} (and {_DLQ_MARK!r} for its DLQ) are too long"
        )
    return name


class Link:
    """One connection: a boto3 SQS client, its executor, and the queues it has seen."""

    def __init__(
        self,
        client: Any,
        executor: Executor,
        errors: ErrorMap,
        *,
        prefix: str,
        secrets: Iterable[str],
        where: str,
    ) -> None:
        self.client = client
        self.executor = executor
        self.errors = errors
        self.prefix = prefix
        self.where = where
        self._secrets = tuple(s for s in secrets if s)
        self._urls: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._claimed: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ calls
    def _run(self, method: Callable[..., Any], kwargs: dict[str, Any]) -> Any:
        try:
            return method(**kwargs)
        except Exception as exc:  # scrubbed in the thread, before anyone formats it
            scrub(exc, self._secrets)
            raise

    def run(self, op: str, **kwargs: Any) -> Any:
        """``client.<op>(**kwargs)`` on this thread (not the loop's): errors scrubbed,
        not mapped."""
        return self._run(getattr(self.client, op), kwargs)

    def start(self, op: str, **kwargs: Any) -> asyncio.Future[Any]:
        """Start ``client.<op>(**kwargs)`` in the pool; the raw (unmapped) future."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.executor, self._run, getattr(self.client, op), kwargs)

    async def call(self, op: str, **kwargs: Any) -> Any:
        """``client.<op>(**kwargs)`` in the pool, botocore errors mapped."""
        with self.errors:
            return await self.start(op, **kwargs)

    # ----------------------------------------------------------------- queues
    async def url(self, ref: QueueRef) -> str:
        """The queue's URL, creating it (FIFO) on first use; cached."""
        name = sqs_name(self.prefix, ref)
        url = self._urls.get(name)
        if url is not None:
            return url
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            url = self._urls.get(name)
            if url is None:
                url = self._urls[name] = await self._create(name)
        return url

    async def _create(self, name: str) -> str:
        deadline = time.monotonic() + _RECREATE_WAIT
        while True:
            try:
                reply = await self.start("create_queue", QueueName=name, Attributes=FIFO_ATTRIBUTES)
                return str(reply["QueueUrl"])
            except Exception as exc:
                code = aws_code(exc)
                if code in DELETED_RECENTLY and time.monotonic() < deadline:
                    _log.info("SQS queue %s was deleted less than 60 s ago; waiting", name)
                    await asyncio.sleep(5.0)
                    continue
                if code in DENIED:
                    # declared by an operator; this service may only look it up
                    reply = await self.call("get_queue_url", QueueName=name)
                    return str(reply["QueueUrl"])
                with self.errors:
                    raise

    def forget(self, name: str) -> None:
        self._urls.pop(name, None)
        self._claimed = {c for c in self._claimed if c[0] != name}

    async def existing_url(self, name: str) -> str | None:
        """The URL of an existing queue, or None (never creates)."""
        try:
            reply = await self.start("get_queue_url", QueueName=name)
        except Exception as exc:
            if aws_code(exc) in NOT_FOUND:
                return None
            with self.errors:
                raise
        return str(reply["QueueUrl"])

    async def claim_group(self, ref: QueueRef, url: str, group: str) -> None:
        """Record ``group`` as the queue's one consumer group (a queue tag); refuse a second.

        SQS has no consumer groups: two groups on one queue would silently share its
        messages. Each group tags the queue with its own key, then reads the tags back, so
        two groups racing to claim it both see each other (and both are refused).
        """
        name = sqs_name(self.prefix, ref)
        if (name, group) in self._claimed:
            return
        key = _GROUP_TAG + group
        await self.call("tag_queue", QueueUrl=url, Tags={key: "1"})
        tags = (await self.call("list_queue_tags", QueueUrl=url)).get("Tags") or {}
        others = sorted(k[len(_GROUP_TAG) :] for k in tags if k.startswith(_GROUP_TAG) and k != key)
        if others:
            await self.call("untag_queue", QueueUrl=url, TagKeys=[key])
            raise UnsupportedFeature(
                f"SQS has no consumer groups: queue {ref} is consumed by group "
                f"{others[0]!r}, so group {group!r} cannot have its own view "
                f"(capabilities.fan_out is False); remove the queue tag {_GROUP_TAG}"
                f"{others[0]} to hand the queue to another group"
            )
        self._claimed.add((name, group))
