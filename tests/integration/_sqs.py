"""A raw boto3 SQS client for a brokerkit ``sqs://`` URL, for tests that look at SQS
directly (beside the backend, or as the caller's own client)."""

from __future__ import annotations

import os
from typing import Any

import pytest

import brokerkit

URL = os.environ.get("BROKERKIT_SQS_URL", "sqs://?endpoint=http://127.0.0.1:4566&region=us-east-1")
"""The SQS the integration tests use: ``BROKERKIT_SQS_URL`` or scripts/services' ElasticMQ."""

_SELECTED = {n.strip() for n in os.environ.get("BROKERKIT_SMOKE", "").split(",")}
SELECTED = pytest.mark.skipif(
    not ({"sqs", "all"} & _SELECTED), reason="SQS not selected (BROKERKIT_SMOKE=sqs)"
)
"""The ``pytestmark`` of every SQS integration module: it runs where SQS is selected."""


def raw_client(url: str) -> Any:
    """boto3's SQS client for ``url``'s endpoint and region (an emulator takes any key)."""
    import boto3

    params = brokerkit.BrokerURL.parse(url).params
    return boto3.client(
        "sqs",
        region_name=params.get("region", "us-east-1"),
        endpoint_url=params.get("endpoint"),
        aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "brokerkit"),
        aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "brokerkit"),
    )
