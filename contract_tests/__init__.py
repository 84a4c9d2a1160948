"""The brokerkit contract suite: one test per behaviour of CONTRACT.md, public API only.

Run it against any URL: ``pytest contract_tests --broker-url URL`` (repeatable),
or ``BROKERKIT_URLS=url1,url2``, or ``brokerkit check URL``. Default: ``memory://``.
"""

BEHAVIOURS = (
    "connect",
    "publish",
    "ack",
    "nack",
    "nack delay",
    "lease expiry",
    "attempt durability",
    "DLQ",
    "redrive",
    "dedup",
    "dedup window",
    "dedup race",
    "FIFO order",
    "FIFO exclusivity",
    "FIFO parallelism",
    "limits",
    "errors",
    "broker-side input",
)
"""The behaviours of CONTRACT.md section 9, in the order ``brokerkit check`` prints them,
then the project's own: ``broker-side input`` (docs/contract.md: a foreign or corrupt
message in a queue is delivered as it is or dead-lettered, never stops the queue)."""

UNSUPPORTED = "unsupported: "
"""How a test says it cannot run because ``capabilities`` declares an optional feature absent.

A test skips with this prefix (``_helpers.unsupported``) and nothing else: ``brokerkit
check`` counts any other skip as a failure, since no mandatory behaviour may be skipped.
"""

OPTIONAL_BEHAVIOURS = ("browse", "stats", "delete queue")
"""Operations beside the mandatory behaviours (CONTRACT.md section 10 and the tooling the
suite cleans up with), printed after BEHAVIOURS. They are judged like the others (a
failure fails ``brokerkit check``); where ``capabilities`` declares one absent its test
checks the refusal instead.
"""

FAULT_BEHAVIOURS = ("crash", "broker restart", "network cut", "soak")
"""The fault behaviours of CONTRACT.md section 9 (v1.1), printed after BEHAVIOURS.

One whose hook was not given (``--restart-cmd``, ``--proxy``) or that cannot apply
(memory:// is in-process) is reported "not run", with the reason, never as a pass.
"""
