"""The exceptions delayq raises: one root, and subclasses to catch one by one.

Each also derives from the builtin that code already catches for the same fault
(ValueError, ConnectionError, TimeoutError).
"""

import builtins

__all__ = [
    "DelayQueueError",
    "InvalidArgumentError",
    "PayloadError",
    "ConnectionError",
    "TimeoutError",
    "AuthError",
    "LeaseLostError",
    "OutOfMemoryError",
    "PartialPushError",
    "PartialConnectionError",
    "PartialTimeoutError",
    "PartialAuthError",
    "PartialOutOfMemoryError",
]


class DelayQueueError(Exception):
    """Every error that delayq raises."""


class InvalidArgumentError(DelayQueueError, ValueError):
    """An option, argument or URL was invalid; nothing was written."""


class PayloadError(DelayQueueError, ValueError):
    """The payload cannot be stored (too large, or not valid JSON)."""


class ConnectionError(DelayQueueError, builtins.ConnectionError):
    """Redis could not be reached, or the connection broke."""


class TimeoutError(ConnectionError, builtins.TimeoutError):
    """Redis did not answer in time."""


class AuthError(DelayQueueError):
    """Wrong password or user, or the ACL user lacks a needed command or key."""


class LeaseLostError(DelayQueueError):
    """A delivery no longer holds its lease."""


class OutOfMemoryError(DelayQueueError):
    """Redis is at its maxmemory and refused a push; nothing was written (workers still
    drain the queue, which frees memory). Not the builtin MemoryError: this process has
    memory to spare. A batch of several scripts refused after some were written raises
    ``PartialOutOfMemoryError``, a subclass that says what was."""


class PartialPushError(DelayQueueError):
    """A ``push_many`` of several scripts (over 1 000 messages of a partition, or
    several partitions) failed after some of them were written, or when whether they
    were is unknown. Each script is written whole or not at all; a batch of several is
    not. The exception raised is also the class its cause raises (``OutOfMemoryError``,
    ``ConnectionError``, ``TimeoutError``, ``AuthError``; other causes raise this class
    itself), so code that catches that still does.

    ``ids``: every id of the batch, in batch order (those given and those delayq made);
    ``written_ids``: those written, in batch order; ``written``: how many;
    ``unknown_ids``: those whose script was sent but whose reply never came (the
    connection failed), written or not. Push again only the messages not written, or
    the whole batch with each item given its id from ``ids``: a push under an id that
    exists does not push it twice (it leaves it as it is, or, with ``replace``,
    replaces it)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.ids: list[str] = []
        self.written_ids: list[str] = []
        self.unknown_ids: list[str] = []

    @property
    def written(self) -> int:
        """How many messages of the batch were written."""
        return len(self.written_ids)


class PartialConnectionError(PartialPushError, ConnectionError):
    """A batch written in part whose cause is a ``ConnectionError``."""


class PartialTimeoutError(PartialPushError, TimeoutError):
    """A batch written in part whose cause is a ``TimeoutError``."""


class PartialAuthError(PartialPushError, AuthError):
    """A batch written in part whose cause is an ``AuthError``."""


class PartialOutOfMemoryError(PartialPushError, OutOfMemoryError):
    """A batch written in part whose cause is an ``OutOfMemoryError``: the messages not
    written were refused by a full Redis."""
