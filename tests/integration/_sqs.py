"""A raw boto3 SQS client for a brokerkit ``sqs://`` URL, for tests that look at SQS
directly (beside the backend, or as the caller's own client)."""

from __future__ import annotations

import os
from typing import Any

import brokerkit


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
