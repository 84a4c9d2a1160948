"""The receipt of a NATS delivery: the message and its server lease's end at the hand-out."""

from __future__ import annotations

from dataclasses import dataclass

from nats.aio.msg import Msg

__all__ = ["Lease", "new_lease"]


@dataclass(frozen=True, slots=True, eq=False)
class Lease:
    """A delivery's receipt: the message and when the server's ack_wait runs out, as of the
    hand-out. Never changed: a renewal by ``extend`` is kept by the receiver (hashed by
    identity)."""

    msg: Msg
    deadline: float


_new = object.__new__
_set_msg = vars(Lease)["msg"].__set__
_set_deadline = vars(Lease)["deadline"].__set__


def new_lease(msg: Msg, deadline: float) -> Lease:
    """``Lease(msg, deadline)`` at half the cost, once per delivered message: a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``; the slots' own
    descriptors set them directly."""
    lease: Lease = _new(Lease)
    _set_msg(lease, msg)
    _set_deadline(lease, deadline)
    return lease
