"""delayq: a reliable delay queue on Redis (Rust core, shared with the PHP extension)."""

from collections.abc import Awaitable, Sequence
from types import TracebackType
from typing import Any, Callable, Optional, Union

from . import errors as errors
from . import records as records
from ._delayq import DEFAULT_MAX_PAYLOAD_BYTES as DEFAULT_MAX_PAYLOAD_BYTES
from ._delayq import QUEUE_OPTIONS as QUEUE_OPTIONS
from ._delayq import WORKER_OPTIONS as WORKER_OPTIONS
from ._delayq import DelayQueue as DelayQueue
from ._delayq import Message as Message
from ._delayq import _Slot, _StopSignals, _Worker
from ._delayq import __version__ as __version__
from .aio import AsyncDelayQueue as AsyncDelayQueue
from .records import Summary
from .errors import AuthError as AuthError
from .errors import ConnectionError as ConnectionError
from .errors import DelayQueueError as DelayQueueError
from .errors import InvalidArgumentError as InvalidArgumentError
from .errors import LeaseLostError as LeaseLostError
from .errors import OutOfMemoryError as OutOfMemoryError
from .errors import PartialPushError as PartialPushError
from .errors import PayloadError as PayloadError
from .errors import TimeoutError as TimeoutError

__all__ = [
    "AsyncDelayQueue",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "AuthError",
    "ConnectionError",
    "DelayQueue",
    "DelayQueueError",
    "InvalidArgumentError",
    "LeaseLostError",
    "OutOfMemoryError",
    "Message",
    "PartialPushError",
    "PayloadError",
    "QUEUE_OPTIONS",
    "TimeoutError",
    "WORKER_OPTIONS",
    "Worker",
    "__version__",
    "errors",
    "records",
]

Handler = Callable[[Any, Message], Union[None, Awaitable[None]]]

_DEFAULT: dict[str, Any]

def _two_arguments(handler: Any) -> Any: ...

# A second stop signal this many seconds after the first stops at once (see Worker.run).
_URGENT_AFTER: float

class Worker:
    """A pool of consumers that calls ``handler(payload, message)`` for each due message.

    Returning acknowledges the message; raising retries it with exponential backoff and
    jitter, and after ``max_attempts`` moves it to the dead-letter set with the
    exception as its last error. ``threads`` native threads do the Redis I/O; the
    handler runs on the calling thread. ``timeout`` (seconds) bounds one handler call:
    after it the lease is no longer renewed and another worker gets the message; a
    coroutine handler is cancelled at it instead, and its delivery fails at once (retried
    with backoff, as any failure; one that ignores its cancellation for 1 s is left to
    run, logged, and its delivery fails all the same). A coroutine function handler runs on an asyncio
    loop, ``concurrency`` at a time.
    With ``stop_when_empty``, ``run`` returns (``stopped_by`` ``"empty"``) once no
    message is due and none runs (messages due later stay): for cron-driven batches
    and for tests of handlers. A failure's traceback (chained causes included) is kept
    as the message's ``error_trace`` (``get()``, the dead letters), up to
    ``max_trace_bytes`` (its start and end when longer; 0 keeps none). An exception
    of a class in ``no_retry`` (or a subclass) sends its message to the dead-letter set
    at once, without retries: for failures no retry can mend (a validation error).
    A message whose payload is larger than ``max_payload_bytes`` goes to the
    dead-letter set at once, unrun, with the reason, never loaded.
    ``on_dead(payload, message, error)`` runs on the handler's
    thread (or loop) after a failure sent the message to the dead-letter set (its
    attempts used up, or ``message.dead_letter()``): a death handler for alerts; what it
    raises is logged and the pool goes on. ``on_failure(payload, message, exception)``
    runs there after each exception a handler raised (a coroutine cancelled at its
    timeout counts, as a ``TimeoutError``), once the message's retry or death is
    decided (it cannot change it): where to report to an error tracker
    (``sentry_sdk.capture_exception``); ``message.attempt`` and ``message.max_attempts``
    tell whether more tries come; a decision such as ``message.dead_letter()`` without
    an exception is no failure; what it raises is logged. ``lower_queues`` are consumed too, in that
    order, each only when the queues before it have nothing due (strict priority, as
    Laravel's ``--queue=high,default``); ``message.queue`` names a message's queue.
    ``max_jobs``, ``max_time`` (seconds) and ``max_memory_mb`` (resident memory) end a
    run gracefully after that many messages, that long, or once the process holds that
    much (``stopped_by`` ``"max_jobs"``, ``"max_time"``, ``"max_memory"``): for a
    process manager, or ``delayq worker --processes``, to start a fresh process.
    """

    # Set by `delayq worker`'s process: told when coroutine handlers start and end.
    _slot: Optional[_Slot]
    _worker: _Worker
    _last_summary: Optional[Summary]

    def __init__(
        self,
        queue: DelayQueue,
        *,
        threads: int = 2,
        batch: int = 50,
        prefetch: int = 0,
        lease: float = 30.0,
        max_attempts: int = 5,
        backoff_base: float = 1.0,
        backoff_max: float = 300.0,
        timeout: Optional[float] = None,
        idle_check: float = 5.0,
        stop_when_empty: bool = False,
        max_trace_bytes: int = 8192,
        max_payload_bytes: int = 1048576,
        no_retry: Sequence[type[BaseException]] = (),
        concurrency: int = 10,
        on_dead: Optional[Callable[[Any, Message, str], Any]] = None,
        on_failure: Optional[Callable[[Any, Message, BaseException], Any]] = None,
        lower_queues: Sequence[DelayQueue] = (),
        max_jobs: Optional[int] = None,
        max_time: Optional[float] = None,
        max_memory_mb: Optional[int] = None,
    ) -> None: ...
    def run(self, handler: Handler) -> Summary:
        """Consume until ``stop()``, SIGTERM or SIGINT (which stop it gracefully) or
        ``DelayQueue.restart_workers()``; return the counts (handled, acked, failed,
        retried, dead, lease_lost, gone, released, unwritten, cancelled, stopped_by: ``"stop"``,
        ``"signal"``, ``"restart"``, ``"empty"``, ``"max_jobs"``, ``"max_time"``,
        ``"max_memory"`` or ``"exit"``) once every acknowledgement is written. A handler's ``sys.exit()``
        ends the run by raising ``SystemExit``: its message is due again at once, counted
        as an attempt (a handler that always exits ends in the dead letters).

        ``handler(payload, message)``, or ``handler(payload)``: one that needs more
        arguments is refused here, with a ``TypeError`` naming it, before anything is
        claimed. A plain function handler may ``os.fork()`` for side work: the child
        may use a ``DelayQueue`` of its own, and when it returns from the handler or
        raises (``sys.exit()`` too) it ends there (``os._exit``, stdout and stderr
        flushed, no atexit hook run) with the status Python gives that ending (0,
        ``sys.exit()``'s, 1 after an uncaught exception, whose traceback it prints); it
        sends no acknowledgement, and the parent's delivery goes on as usual. (A
        coroutine handler should not fork: asyncio does not support it.)"""
    async def run_async(self, handler: Callable[[Any, Message], Awaitable[None]]) -> Summary:
        """Consume on the running event loop with up to ``concurrency`` handlers at once."""
    def stop(self) -> None:
        """Stop gracefully: running handlers finish and are acknowledged, prefetched
        messages go back to the queue at once, then ``run`` returns."""
    def __enter__(self) -> Worker: ...
    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None: ...
