"""botocore errors -> brokerkit errors: the backend's one ErrorMap, and credential scrubbing.

botocore's own messages can carry what must never be printed: a SignatureDoesNotMatch
reply quotes the string to sign (with the access key id), an endpoint URL may carry
user info. ``scrub`` rewrites an exception's text in place *before* it is mapped (the
mapped error keeps it as ``__cause__``, so a traceback prints it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ProfileNotFound,
    ReadTimeoutError,
)

from brokerkit.backends import (
    BrokerRefused,
    BrokerUnavailable,
    ConfigError,
    ErrorMap,
    HostPort,
    LeaseExpired,
    MessageTooLarge,
)

__all__ = [
    "DELETED_RECENTLY",
    "DENIED",
    "NOT_FOUND",
    "aws_code",
    "error_map",
    "is_transient",
    "scrub",
]

NOT_FOUND = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
DELETED_RECENTLY = frozenset(
    {"AWS.SimpleQueueService.QueueDeletedRecently", "QueueDeletedRecently"}
)
_EXISTS = frozenset({"QueueAlreadyExists", "QueueNameExists"})
_STALE = frozenset(
    {
        "ReceiptHandleIsInvalid",
        "InvalidReceiptHandle",
        "AWS.SimpleQueueService.MessageNotInflight",
        "MessageNotInflight",
    }
)
_CREDENTIALS = frozenset(
    {
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "UnrecognizedClientException",
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidSecurity",
        "IncompleteSignature",
        "MissingAuthenticationToken",
    }
)
DENIED = frozenset({"AccessDenied", "AccessDeniedException", "KmsAccessDenied"})
_THROTTLED = frozenset(
    {
        "RequestThrottled",
        "Throttling",
        "ThrottlingException",
        "AWS.SimpleQueueService.RequestThrottled",
        "KmsThrottled",
    }
)
_TOO_LONG = frozenset({"MessageTooLong", "BatchRequestTooLong"})
_SERVER_FAILED = frozenset(
    {"ServiceUnavailable", "InternalFailure", "InternalError", "RequestTimeout", "500", "503"}
)
"""The service could not serve the request just then (an HTTP 5xx; botocore already retried
it ``max_attempts`` times): unavailable, not a refusal. An emulator's own HTTP layer may
answer 503 in plain text (ElasticMQ under load: "The server was not able to produce a
timely response"), which botocore reports with the status as the code."""
_CONNECTION = (
    EndpointConnectionError,
    ConnectTimeoutError,
    ConnectionClosedError,
    ReadTimeoutError,
)

_PATTERNS = (
    re.compile(r"\b(?:AKIA|ASIA|AROA|AIDA)[A-Z0-9]{12,}\b"),
    re.compile(r"(Credential=)[^,\s&]+"),
    re.compile(r"(Signature=)[0-9a-fA-F]+"),
    re.compile(r"(X-Amz-Security-Token=)[^\s&]+"),
    re.compile(r"(//)[^/@\s]+@"),
)


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: (m.group(1) if m.groups() else "") + "***", text)
    return text


def scrub(exc: BaseException, secrets: Iterable[str]) -> None:
    """Remove credentials from ``exc``'s text and botocore's fields, in place."""
    keep = tuple(secrets)
    exc.args = tuple(redact(a, keep) if isinstance(a, str) else a for a in exc.args)
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        if isinstance(error.get("Message"), str):
            error["Message"] = redact(error["Message"], keep)
        meta = exc.response.pop("ResponseMetadata", None)
        status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
        if isinstance(status, int):  # the one field the mapping reads (``_http_status``)
            exc.response["ResponseMetadata"] = {"HTTPStatusCode": status}
    kwargs = getattr(exc, "kwargs", None)
    if isinstance(kwargs, dict):
        for key, value in list(kwargs.items()):
            if isinstance(value, str):
                kwargs[key] = redact(value, keep)


def aws_code(exc: BaseException) -> str:
    """The AWS error code of a ClientError ("" for anything else)."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def _http_status(exc: ClientError) -> int | None:
    """The HTTP status of the answer, if botocore recorded it (``scrub`` keeps it)."""
    code = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code if isinstance(code, int) else None


def _message(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Message", "")) or "(no message)"


def is_transient(exc: BaseException) -> bool:
    """Worth retrying at connect: nobody answered (botocore already retried throttling)."""
    return isinstance(exc, _CONNECTION)


def error_map(endpoint: HostPort, where: str) -> ErrorMap:
    """The ErrorMap of one connection; ``where`` names the endpoint or region in texts."""

    def client(exc: BaseException) -> Any:
        assert isinstance(exc, ClientError)
        code = aws_code(exc)
        op = exc.operation_name
        if code in NOT_FOUND:
            return BrokerRefused(f"SQS at {where}: the queue does not exist ({op})", code=code)
        if code in _STALE:
            return LeaseExpired(f"SQS at {where}: the receipt handle is no longer valid ({op})")
        if code in _TOO_LONG:
            return MessageTooLarge(f"SQS at {where} refused the message size: {_message(exc)}")
        if code in _CREDENTIALS:
            return ConfigError(f"SQS at {where} refused the AWS credentials ({code})")
        if code in DENIED:
            return BrokerRefused(
                f"SQS at {where}: access denied for {op} (see docs/backends/sqs.md for "
                "the IAM permissions brokerkit needs)",
                code=code,
            )
        answered = _http_status(exc)
        if code in _SERVER_FAILED or (answered is not None and answered >= 500):
            return BrokerUnavailable(
                f"SQS at {where} could not serve {op} after the retries "
                f"({code}: {_message(exc).splitlines()[0]})",
                host=endpoint.host,
                port=endpoint.port,
            )
        if code in _THROTTLED:
            return BrokerRefused(
                f"SQS at {where} kept throttling {op} after the retries ({code})", code=code
            )
        if code in _EXISTS:
            return BrokerRefused(
                f"SQS at {where}: a queue of that name exists with other attributes ({code}); "
                "brokerkit needs FifoQueue=true, ContentBasedDeduplication=false",
                code=code,
            )
        return BrokerRefused(f"SQS at {where} refused {op}: {code}: {_message(exc)}", code=code)

    def unavailable(exc: BaseException) -> Any:
        return BrokerUnavailable(
            f"SQS at {endpoint} did not answer ({type(exc).__name__})",
            host=endpoint.host,
            port=endpoint.port,
        )

    def credentials(exc: BaseException) -> Any:
        return ConfigError(
            f"no usable AWS credentials for SQS at {where} ({type(exc).__name__}): set them "
            "through the standard chain (environment, profile=, instance role)"
        )

    return ErrorMap(
        (ClientError, client),
        (_CONNECTION, unavailable),
        ((NoCredentialsError, PartialCredentialsError), credentials),
        (ProfileNotFound, lambda e: ConfigError("sqs:// profile= names no configured profile")),
        (NoRegionError, lambda e: ConfigError("sqs:// needs a region: ?region= or AWS_REGION")),
        (BotoCoreError, lambda e: BrokerRefused(f"SQS at {where}: {type(e).__name__}: {e}")),
    )
