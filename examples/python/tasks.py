"""Handlers for `delayq worker`: how a Python service runs its workers from the shell,
with no worker script of its own (as `rq worker` or `celery worker`):

    cd examples/python && delayq --queue orders worker tasks:close_order \\
        --processes 2 --timeout 30 --on-start tasks:connect --on-dead tasks:alert \\
        --on-failure tasks:report

(`--url` or REDIS_URL names the Redis; SIGTERM or Ctrl-C stops the pool gracefully.)
"""

from __future__ import annotations

import logging
import os
from typing import Any

import delayq

log = logging.getLogger("tasks")

# Stands for a database connection: made in each worker process by `connect`, never
# at import (the supervisor imports nothing of this module; each worker process does).
_orders: dict[str, Any] = {}


def connect() -> None:
    """--on-start: runs in each worker process before it consumes."""
    _orders["pid"] = os.getpid()
    _orders["closed"] = 0


def close_order(order: dict[str, Any], msg: delayq.Message) -> None:
    """Close an unpaid order. Keep it idempotent: after a crash a message can run again.
    Return to acknowledge; raise to retry with backoff (then the dead-letter set)."""
    if "order_id" not in order:
        msg.dead_letter(f"not an order: {order!r}")  # retrying cannot help
        return
    _orders["closed"] = _orders.get("closed", 0) + 1
    log.info("closed order %s (attempt %d, pid %d)", order["order_id"], msg.attempt, os.getpid())


def alert(order: Any, msg: delayq.Message, error: str) -> None:
    """--on-dead: a message gave up; tell a person."""
    log.error("order message %s is dead: %s; payload %r", msg.id, error, order)


def report(order: Any, msg: delayq.Message, exc: BaseException) -> None:
    """--on-failure: a handler raised; report it (sentry_sdk.capture_exception(exc))."""
    log.warning("order message %s failed on attempt %d of %d: %r", msg.id, msg.attempt, msg.max_attempts, exc)
