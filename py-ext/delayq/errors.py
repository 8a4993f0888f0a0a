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
    memory to spare."""
