"""A signup-email worker: ``brokerkit run examples.email_worker:app --metrics-port 9108``.

Typed payloads, retries with jittered backoff, poison to the DLQ, Prometheus metrics
(``--metrics-port``) and a SIGTERM that lets in-flight sends finish (``--drain-timeout``).
"""

import asyncio
import os

import pydantic

import brokerkit

QUEUE = os.environ.get("EMAIL_QUEUE", "emails")


class SignupEmail(pydantic.BaseModel):
    to: str = pydantic.Field(pattern=r"^[^@\s]+@[^@\s]+$")
    name: str


class MailServerBusy(Exception):
    """The mail server said: try again later."""


app = brokerkit.App(os.environ.get("BROKERKIT_URL", "memory://"))
retry = brokerkit.RetryPolicy(max_attempts=5, initial=0.5, maximum=60.0, retry_on=(MailServerBusy,))


@app.handler(QUEUE, group="mailer", model=SignupEmail, concurrency=16, retry=retry)
async def send_signup_email(email: SignupEmail) -> None:
    if email.to.endswith("@blocked.example"):
        raise brokerkit.Reject("recipient blocked")  # poison: to the DLQ now
    await asyncio.sleep(0.05)  # stands in for the SMTP call; raise MailServerBusy to retry
    await app.publish(f"{QUEUE}-sent", {"to": email.to})  # the outbox: what was sent
