"""What the read calls return, as TypedDicts for type checkers; at run time they are
plain dicts. The core defines each record once (``delayq._delayq.RECORD_SHAPES``: the
names and order of its fields, the same in PHP), and a test checks these against it.

``DelayQueue.get()`` and each item of ``waiting()``, ``inflight()``, ``completed()``,
``find()`` and ``find_field()`` are a :class:`MessageInfo`; ``stats()`` is a
:class:`Stats`; ``dead_letters()`` a list of :class:`DeadLetter`; ``workers()`` of
:class:`WorkerInfo`; ``repeats()`` of :class:`Repeat`; ``minutes()`` of
:class:`Minute`; ``registered_queues()`` of :class:`RegisteredQueue`;
``Worker.run()`` a :class:`Summary`. Times are Unix seconds on the Redis clock, spans
seconds.

The listings (all of the above but ``get()``) leave out a payload whose stored message
is larger than 64 KiB: ``payload`` is then None and ``payload_omitted_bytes`` its stored
size (None when the payload is there), and cut an error past 4096 bytes and a trace past
16 KiB to their start and end; ``get()`` shows them whole.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, TypedDict, Union

class MessageInfo(TypedDict):
    """A message wherever it is (see ``DelayQueue.get``)."""

    id: str
    state: Literal["scheduled", "ready", "inflight", "dead", "completed"]
    payload: Any
    payload_omitted_bytes: Optional[int]
    due_at: Optional[float]
    attempts: int
    max_attempts: Optional[int]
    last_error: Optional[str]
    error_trace: Optional[str]
    dead_at: Optional[float]
    created_at: Optional[float]
    lease_until: Optional[float]
    expires_at: Optional[float]
    completed_at: Optional[float]
    serial_key: Optional[str]
    group: Optional[str]
    held: Optional[str]
    cancelled: bool


class RateLimit(TypedDict):
    """At most ``max`` messages handed out in any window of ``per`` seconds."""

    max: int
    per: float


class Stats(TypedDict):
    """Depth by state, summed over the partitions, then the lifetime counters."""

    scheduled: int
    ready: int
    inflight: int
    dead: int
    completed: int
    held: int
    next_due_at: Optional[float]
    paused_at: Optional[float]
    rate_limit: Optional[RateLimit]
    partitions: int
    pushed: int
    delivered: int
    acked: int
    retried: int
    died: int
    expired: int
    released: int
    cancelled: int
    requeued: int
    discarded: int
    trimmed: int
    purged: int
    replaced: int
    moved: int


class WorkerInfo(TypedDict):
    """A consumer pool alive on the queue, from any host and language."""

    id: str
    host: str
    pid: int
    started_at: float
    last_seen: float
    threads: int
    handlers: int
    handled: int
    acked: int
    failed: int
    holding: int
    started_recently: int
    lateness_avg: Optional[float]
    lateness_max: Optional[float]
    handler_avg: Optional[float]


class DeadLetter(TypedDict):
    """A message in the dead-letter set."""

    id: str
    payload: Any
    payload_omitted_bytes: Optional[int]
    attempts: int
    last_error: str
    error_trace: Optional[str]
    dead_at: float


class Minute(TypedDict):
    """One minute of the queue's history; the backlog is ``None`` when no pool sampled it."""

    at: float
    handled: int
    failed: int
    lateness_p50: Optional[float]
    lateness_p99: Optional[float]
    scheduled: Optional[int]
    ready: Optional[int]
    inflight: Optional[int]


class RegisteredQueue(TypedDict):
    """A queue that a producer or pool registered under the prefix."""

    name: str
    layout: str
    zset_key: Optional[str]
    payload_key: Optional[str]
    partitions: int
    last_seen: float


class Repeat(TypedDict):
    """A repeating message: a cron pattern with its time zone, or an interval in seconds."""

    name: str
    schedule: Union[str, float]
    tz: Optional[str]
    payload: Any
    max_attempts: Optional[int]
    expire_after: Optional[float]
    next_due_at: Optional[float]


class Summary(TypedDict):
    """What a worker's run did, and why it stopped."""

    handled: int
    acked: int
    failed: int
    retried: int
    dead: int
    lease_lost: int
    gone: int
    released: int
    unwritten: int
    cancelled: int
    stopped_by: Optional[str]


__all__ = [
    "DeadLetter",
    "MessageInfo",
    "Minute",
    "RateLimit",
    "RegisteredQueue",
    "Repeat",
    "Stats",
    "Summary",
    "WorkerInfo",
]
