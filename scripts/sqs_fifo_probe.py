#!/usr/bin/env python3
"""Probe an SQS emulator for the FIFO behaviours brokerkit relies on.

    python3 scripts/sqs_fifo_probe.py              # scripts/services' endpoint (ElasticMQ)
    python3 scripts/sqs_fifo_probe.py --endpoint http://127.0.0.1:4566
    python3 scripts/sqs_fifo_probe.py --moto       # moto, in-process (pip install moto)

Each check prints PASS/FAIL/INFO and what was observed; the exit code is the
number of FAILs.  --window adds a 5-minute wait to check that a dedup id
is forgotten after the AWS interval.  Real AWS behaviour each check expects is cited in
docs/services.md.  Every wait is bounded; a run takes about 15 seconds (5.5 min with --window).
Loopback only: refuses endpoints that are not 127.0.0.1/localhost.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import urllib.parse
import uuid

import boto3
from botocore.config import Config

results: list[tuple[str, str, str]] = []


def report(status: str, name: str, detail: str) -> None:
    results.append((status, name, detail))
    print(f"{status:4} {name}: {detail}", flush=True)


def check(name: str, ok: bool, detail: str) -> None:
    report("PASS" if ok else "FAIL", name, detail)


def _count(m: dict) -> str | None:
    return m["Attributes"].get("ApproximateReceiveCount")


def receive(sqs, url: str, n: int = 1, wait: int = 0, vis: int | None = None) -> list[dict]:
    kw = dict(
        QueueUrl=url,
        MaxNumberOfMessages=n,
        WaitTimeSeconds=wait,
        AttributeNames=["All"],
        MessageAttributeNames=["All"],
    )
    if vis is not None:
        kw["VisibilityTimeout"] = vis
    return sqs.receive_message(**kw).get("Messages", [])


def receive_until(sqs, url: str, deadline_s: float) -> list[dict]:
    """Poll (short waits) until a message shows up or the deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = receive(sqs, url, wait=1)
        if got:
            return got
    return []


def fifo(sqs, name: str, **attrs) -> str:
    a = {"FifoQueue": "true", "VisibilityTimeout": "30"}
    a.update({k: str(v) for k, v in attrs.items()})
    return sqs.create_queue(QueueName=name + ".fifo", Attributes=a)["QueueUrl"]


def probe(sqs, window: bool = False) -> None:
    run = uuid.uuid4().hex[:8]

    # 1. ordering within a group, and an in-flight message blocks its group only
    q = fifo(sqs, f"probe-order-{run}")
    for body, grp in (("A1", "A"), ("A2", "A"), ("B1", "B")):
        sqs.send_message(
            QueueUrl=q, MessageBody=body, MessageGroupId=grp, MessageDeduplicationId=body
        )
    first = receive(sqs, q)
    second = receive(sqs, q)
    third = receive(sqs, q)
    bodies = [m[0]["Body"] if m else None for m in (first, second, third)]
    check(
        "group-order+in-flight-blocking",
        bodies == ["A1", "B1", None],
        f"receives with A1 then B1 in flight returned {bodies} (want ['A1', 'B1', None])",
    )
    if first:
        sqs.delete_message(QueueUrl=q, ReceiptHandle=first[0]["ReceiptHandle"])
    after = receive(sqs, q)
    check(
        "group-unblocks-after-delete",
        bool(after) and after[0]["Body"] == "A2",
        f"after deleting A1 got {[m['Body'] for m in after]} (want ['A2'])",
    )

    # 1b. one ReceiveMessage of 10 may return several messages of the same group (AWS does)
    q = fifo(sqs, f"probe-batch-{run}")
    for i in range(3):
        sqs.send_message(
            QueueUrl=q, MessageBody=f"G{i}", MessageGroupId="G", MessageDeduplicationId=f"G{i}"
        )
    got = receive(sqs, q, n=10)
    report(
        "INFO", "same-group-batch", f"ReceiveMessage(Max=10) returned {[m['Body'] for m in got]}"
    )

    # 2. dedup id remembered for 5 minutes, also after the first message was deleted
    q = fifo(sqs, f"probe-dedup-{run}")
    r1 = sqs.send_message(
        QueueUrl=q, MessageBody="one", MessageGroupId="g", MessageDeduplicationId="d1"
    )
    r2 = sqs.send_message(
        QueueUrl=q, MessageBody="one-again", MessageGroupId="g", MessageDeduplicationId="d1"
    )
    got = receive(sqs, q, n=10)
    check(
        "dedup-while-queued",
        [m["Body"] for m in got] == ["one"],
        f"two sends with one dedup id delivered {[m['Body'] for m in got]} (want ['one'])",
    )
    report(
        "INFO",
        "dedup-returns-same-MessageId",
        f"{r1['MessageId'] == r2['MessageId']} ({r1['MessageId']} / {r2['MessageId']})",
    )
    for m in got:
        sqs.delete_message(QueueUrl=q, ReceiptHandle=m["ReceiptHandle"])
    sqs.send_message(
        QueueUrl=q, MessageBody="after-delete", MessageGroupId="g", MessageDeduplicationId="d1"
    )
    got = receive_until(sqs, q, 3)
    check(
        "dedup-after-delete",
        not got,
        f"re-send of a deleted message's dedup id delivered {[m['Body'] for m in got]} (want [])",
    )
    for m in got:
        sqs.delete_message(QueueUrl=q, ReceiptHandle=m["ReceiptHandle"])

    # 2b. content-based deduplication (SHA-256 of the body)
    q = fifo(sqs, f"probe-cbd-{run}", ContentBasedDeduplication="true")
    sqs.send_message(QueueUrl=q, MessageBody="same", MessageGroupId="g")
    sqs.send_message(QueueUrl=q, MessageBody="same", MessageGroupId="g")
    got = receive(sqs, q, n=10)
    check(
        "content-based-dedup",
        len(got) == 1,
        f"two identical bodies delivered {len(got)} message(s) (want 1)",
    )

    # 3. ChangeMessageVisibility: 0 = release now (same message again, count 2); N = hide N seconds
    q = fifo(sqs, f"probe-vis-{run}")
    sqs.send_message(QueueUrl=q, MessageBody="v1", MessageGroupId="g", MessageDeduplicationId="v1")
    sqs.send_message(QueueUrl=q, MessageBody="v2", MessageGroupId="g", MessageDeduplicationId="v2")
    m = receive(sqs, q)
    sqs.change_message_visibility(
        QueueUrl=q, ReceiptHandle=m[0]["ReceiptHandle"], VisibilityTimeout=0
    )
    again = receive(sqs, q)
    ok = (
        bool(again)
        and again[0]["Body"] == "v1"
        and again[0]["Attributes"].get("ApproximateReceiveCount") == "2"
    )
    check(
        "change-visibility-0",
        ok,
        f"after release got {[(x['Body'], _count(x)) for x in again]} (want [('v1', '2')])",
    )
    if again:
        t0 = time.monotonic()
        sqs.change_message_visibility(
            QueueUrl=q, ReceiptHandle=again[0]["ReceiptHandle"], VisibilityTimeout=2
        )
        hidden = receive(sqs, q)
        back = receive_until(sqs, q, 6)
        took = time.monotonic() - t0
        ok = not hidden and bool(back) and back[0]["Body"] == "v1" and 1.5 <= took <= 5
        check(
            "change-visibility-delay-keeps-group-blocked",
            ok,
            f"during the delay got {[x['Body'] for x in hidden]} (want [], v2 must wait); "
            f"then {[x['Body'] for x in back]} after {took:.1f}s (want ['v1'] after ~2s)",
        )

    # 4. RedrivePolicy to a FIFO dead-letter queue after maxReceiveCount receives
    dlq = fifo(sqs, f"probe-dlq-{run}")
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    q = fifo(
        sqs,
        f"probe-src-{run}",
        RedrivePolicy=json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "2"}),
    )
    sqs.send_message(
        QueueUrl=q, MessageBody="poison", MessageGroupId="g", MessageDeduplicationId="p"
    )
    sqs.send_message(QueueUrl=q, MessageBody="next", MessageGroupId="g", MessageDeduplicationId="n")
    counts = []
    for _ in range(2):
        m = receive(sqs, q)
        if not m:
            break
        counts.append((m[0]["Body"], m[0]["Attributes"].get("ApproximateReceiveCount")))
        sqs.change_message_visibility(
            QueueUrl=q, ReceiptHandle=m[0]["ReceiptHandle"], VisibilityTimeout=0
        )
    third = receive(sqs, q)
    report(
        "INFO",
        "redrive-receive-that-moves",
        f"the receive that moved the message to the DLQ returned {[x['Body'] for x in third]}",
    )
    if not third:
        third = receive_until(sqs, q, 3)
    in_dlq = receive_until(sqs, dlq, 3)
    ok = (
        counts == [("poison", "1"), ("poison", "2")]
        and [x["Body"] for x in third] == ["next"]
        and [x["Body"] for x in in_dlq] == ["poison"]
    )
    check(
        "redrive-to-fifo-dlq",
        ok,
        f"receives {counts}, then source gave {[x['Body'] for x in third]} (want ['next']), "
        f"DLQ holds {[x['Body'] for x in in_dlq]} (want ['poison'])",
    )
    if in_dlq:
        a = in_dlq[0]["Attributes"]
        report(
            "INFO",
            "dlq-message-attributes",
            f"MessageGroupId={a.get('MessageGroupId')} "
            f"ApproximateReceiveCount={a.get('ApproximateReceiveCount')}",
        )

    if window:
        # 4b. the dedup id is forgotten after 5 minutes (AWS: fixed 5-minute interval)
        q = fifo(sqs, f"probe-window-{run}")
        sqs.send_message(
            QueueUrl=q, MessageBody="w1", MessageGroupId="g", MessageDeduplicationId="w"
        )
        m = receive(sqs, q)
        sqs.delete_message(QueueUrl=q, ReceiptHandle=m[0]["ReceiptHandle"])
        print("     (waiting 5 min 10 s for the dedup window to pass)", flush=True)
        time.sleep(310)
        sqs.send_message(
            QueueUrl=q, MessageBody="w2", MessageGroupId="g", MessageDeduplicationId="w"
        )
        got = receive_until(sqs, q, 3)
        check(
            "dedup-forgotten-after-5-min",
            [x["Body"] for x in got] == ["w2"],
            f"re-send after 5 min 10 s delivered {[x['Body'] for x in got]} (want ['w2'])",
        )

    # 5. DeduplicationScope=messageGroup (high-throughput FIFO): same dedup id in two groups
    try:
        q = fifo(
            sqs,
            f"probe-scope-{run}",
            DeduplicationScope="messageGroup",
            FifoThroughputLimit="perMessageGroupId",
        )
        sqs.send_message(
            QueueUrl=q, MessageBody="x", MessageGroupId="g1", MessageDeduplicationId="same"
        )
        sqs.send_message(
            QueueUrl=q, MessageBody="y", MessageGroupId="g2", MessageDeduplicationId="same"
        )
        got = receive(sqs, q, n=10)
        got += receive(sqs, q, n=10)
        report(
            "INFO",
            "dedup-scope-messageGroup",
            f"same dedup id in two groups delivered {sorted(x['Body'] for x in got)}"
            " (AWS: ['x', 'y'])",
        )
    except Exception as e:
        report("INFO", "dedup-scope-messageGroup", f"not supported: {e}")

    # 6. per-message DelaySeconds is rejected on FIFO queues (AWS: InvalidParameterValue)
    q = fifo(sqs, f"probe-delay-{run}")
    try:
        sqs.send_message(
            QueueUrl=q,
            MessageBody="d",
            MessageGroupId="g",
            MessageDeduplicationId="d",
            DelaySeconds=1,
        )
        report("INFO", "per-message-delay-on-fifo", "accepted (AWS rejects it)")
    except Exception as e:
        report("INFO", "per-message-delay-on-fifo", f"rejected like AWS: {type(e).__name__}")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--endpoint", default="http://127.0.0.1:4566")
    ap.add_argument(
        "--moto", action="store_true", help="probe moto in-process instead of an endpoint"
    )
    ap.add_argument(
        "--window", action="store_true", help="also check the 5-minute dedup expiry (+5 min)"
    )
    args = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    cfg = Config(retries={"max_attempts": 1}, connect_timeout=3, read_timeout=30)
    if args.moto:
        import moto

        print(f"# target: moto {moto.__version__} (in-process mock_aws)")
        ctx = moto.mock_aws()
        kw = {}
    else:
        host = urllib.parse.urlsplit(args.endpoint).hostname
        if host not in ("127.0.0.1", "localhost", "::1"):
            ap.error("loopback endpoints only")
        print(f"# target: {args.endpoint}")
        ctx = contextlib.nullcontext()
        kw = {"endpoint_url": args.endpoint}
    with ctx:
        sqs = boto3.client("sqs", region_name="us-east-1", config=cfg, **kw)
        probe(sqs, window=args.window)
    fails = sum(1 for s, _, _ in results if s == "FAIL")
    print(f"# {sum(1 for s, _, _ in results if s == 'PASS')} passed, {fails} failed")
    return fails


if __name__ == "__main__":
    sys.exit(main())
