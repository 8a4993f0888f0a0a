"""delayq: a reliable delay queue on Redis.

    q = delayq.DelayQueue("redis://127.0.0.1:6379", "orders")
    q.push({"order_id": 10086, "action": "close"}, delay=1800)

    with delayq.Worker(q, max_attempts=5) as worker:
        worker.run(lambda payload, msg: close_order(payload["order_id"]))

PHP's DelayQueue and this module address the same queue given the same URL, queue
name and prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Iterator, Sequence
from types import TracebackType
from typing import Any, Callable, NoReturn, Optional, Union

from . import errors, records
from ._delayq import (
    _CANCEL_GRACE,
    _COROUTINE_GRACE,
    _URGENT_AFTER,
    _cancel_error,
    DEFAULT_MAX_PAYLOAD_BYTES,
    QUEUE_OPTIONS,
    WORKER_OPTIONS,
    DelayQueue,
    Message,
    _Slot,
    _StopSignals,
    _Worker,
    __version__,
)
from .aio import AsyncDelayQueue
from .records import Summary
from .errors import (
    AuthError,
    ConnectionError,
    DelayQueueError,
    InvalidArgumentError,
    LeaseLostError,
    OutOfMemoryError,
    PartialPushError,
    PayloadError,
    TimeoutError,
)

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


# _URGENT_AFTER (the core's): a stop signal this long after the first stops at once;
# closer ones are the same stop arriving twice (a terminal's Ctrl+C reaches every
# process of its group, and a supervisor passes it on as SIGTERM).


def _urgent_signal(signum: int) -> BaseException:
    """What a second stop signal raises in the main thread: whatever runs there (the
    handler, its finally blocks) is cut short, and the pool gives every message it
    holds back to the queue at once."""
    logging.getLogger("delayq.worker").warning(
        "delayq: %s again: stopping now; the running and prefetched messages go back to the queue",
        signal.Signals(signum).name)
    cut = KeyboardInterrupt() if signum == signal.SIGINT else SystemExit(128 + signum)
    # Not a handler's own sys.exit(): its message is released, not failed.
    cut._delayq_urgent = True  # type: ignore[attr-defined]
    return cut


@contextlib.contextmanager
def _graceful_signals(worker: _Worker) -> Iterator[None]:
    """SIGINT and SIGTERM stop the worker gracefully while it runs, and a second one at
    once (main thread only: Python accepts signal handlers nowhere else)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = _StopSignals()

    def stop(signum: int, frame: object) -> None:
        if signals.received():
            raise _urgent_signal(signum)
        worker.stop("signal")

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# Handlers that ignored their cancellation: referenced until they end, as asyncio asks.
_abandoned: set[asyncio.Future[None]] = set()


# How often the event loop of a supervised asyncio process ticks for its watch, and how
# long without a tick means that a handler blocks it.
_TICK = 0.1
_BLOCKED_AFTER = 0.5


class _LoopWatch:
    """The watch on a supervised asyncio process's event loop. Coroutines share the loop's
    thread, so one that blocks it stops all the others, and the supervisor kills the
    process past the timeout. Read from this thread as the loop's current task, the
    blocking handler is named in the slot when it has run past the timeout itself (else
    the oldest running one, which the supervisor times, is): its delivery fails and the
    others' go back uncounted. Once the loop runs again, the oldest is named again, its
    clock going on. A handler blocking in a task of its own (``create_task``, ``gather``)
    is not seen as its handler: then the oldest is named, as without the watch."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, slot: _Slot, timeout: float, oldest: Callable[[], Any]
    ) -> None:
        self._loop = loop
        self._slot = slot
        self._timeout = timeout
        self._oldest = oldest
        # The task of each running handler: its delivery and when it started.
        self.handlers: dict[asyncio.Future[None], tuple[Any, float]] = {}
        self._ticked = time.monotonic()
        self._blamed: Any = None
        self._closed = threading.Event()
        self._timer = loop.call_later(_TICK, self._tick)
        self._thread = threading.Thread(target=self._watch, name="delayq-loop-watch", daemon=True)
        self._thread.start()

    def _tick(self) -> None:
        self._ticked = time.monotonic()
        if self._blamed is not None:
            self._blamed = None
            self._slot.unblocked(self._oldest())
        self._timer = self._loop.call_later(_TICK, self._tick)

    def _watch(self) -> None:
        while not self._closed.wait(_TICK):
            now = time.monotonic()
            if now - self._ticked < _BLOCKED_AFTER:
                continue
            task = asyncio.current_task(self._loop)
            running = None if task is None else self.handlers.get(task)
            # Blocked outside any handler (a hook, the loop's own work): nobody to name.
            if running is None:
                continue
            delivery, since = running
            if now - since <= self._timeout:
                delivery = self._oldest()
            if delivery is not None and delivery is not self._blamed:
                self._blamed = delivery
                self._slot.blocked_on(delivery)

    def close(self) -> None:
        self._closed.set()
        self._timer.cancel()
        self._thread.join()


def _oldest_running(started: dict[int, Any]) -> Any:
    """The delivery of the oldest running handler, None when none runs; read from the
    loop watch's thread while the loop is blocked."""
    try:
        return next(iter(started.values()), None)
    except RuntimeError:  # changed meanwhile: the loop runs again
        return None


class _HandlerTimedOut(TimeoutError):
    """A coroutine handler cancelled at its timeout (``on_failure`` gets it as the
    ``TimeoutError`` it is). Its message keeps the text alone (``_delayq_error``)."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self._delayq_error = error


class _NotStarted(Exception):
    """An asyncio handler's delivery whose lease ended before the handler started: given
    back unstarted by the core."""


class _HandlerCancelled(Exception):
    """A coroutine handler's task cancelled because its message was cancelled while it
    ran (``DelayQueue.cancel`` from any process): the message is deleted, as cancelled.
    Its message keeps the text alone (``_delayq_error``)."""

    def __init__(self, message_id: str) -> None:
        error = f"message {message_id} was cancelled while it ran"
        super().__init__(error)
        self._delayq_error = error


# How often a running coroutine handler's message is looked at for a cancel (its pool
# learns of one at a heartbeat, a third of the lease).
_CANCEL_POLL = 0.05


async def _cancel_when_marked(task: "asyncio.Future[Any]", message: Message, marked: list[bool]) -> None:
    """Cancel ``task`` once ``message`` is cancelled (see ``Message.cancelled``)."""
    while not task.done():
        if message.cancelled:
            marked.append(True)
            task.cancel()
            return
        await asyncio.sleep(_CANCEL_POLL)


def _two_arguments(handler: Any) -> Any:
    """The handler called with (payload, message): one that takes the payload alone is
    called with it alone; one that needs more than the two is refused here, at start,
    not at its first message."""
    if not callable(handler):
        raise TypeError(f"the handler must be callable, got {type(handler).__name__}")
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):
        return handler  # no signature to read (some builtins): called as documented
    name = getattr(handler, "__qualname__", None) or type(handler).__name__
    keyword = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if keyword:
        raise TypeError(
            f"handler {name} needs the keyword argument(s) {', '.join(keyword)}; "
            "a worker calls it with (payload, message)"
        )
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    needed = sum(1 for p in positional if p.default is p.empty)
    if needed > 2:
        raise TypeError(f"handler {name} needs {needed} arguments; a worker calls it with (payload, message)")
    if any(p.kind is p.VAR_POSITIONAL for p in params) or len(positional) >= 2:
        return handler
    if not positional:
        raise TypeError(f"handler {name} takes no arguments; a worker calls it with (payload, message)")
    one = handler
    if _is_async(handler):

        async def payload_only_async(payload: Any, message: Message) -> Any:
            return await one(payload)

        return payload_only_async

    def payload_only(payload: Any, message: Message) -> Any:
        return one(payload)

    return payload_only


def _end_forked_child(raised: Optional[BaseException]) -> NoReturn:
    """A process that a handler forked (``os.fork()``) came back into the worker, by
    returning or raising: it ends here, before it could run, wait on or write through
    the pool it inherited (whose threads stayed in the parent, with the locks they held
    at the fork), with the status Python gives that ending: ``sys.exit()``'s, 1 after
    an uncaught exception (its traceback goes to stderr), else 0. stdout and stderr are
    flushed; atexit hooks and finalizers, which belong to the parent's objects, do not
    run."""
    status = 0
    if isinstance(raised, SystemExit):
        if isinstance(raised.code, int):
            status = raised.code
        elif raised.code is not None:
            print(raised.code, file=sys.stderr)
            status = 1
    elif raised is not None:
        print("delayq: a process forked by a handler ended with an uncaught exception:", file=sys.stderr)
        traceback.print_exception(type(raised), raised, raised.__traceback__)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _leave_if_forked(pool_pid: int, raised: Optional[BaseException]) -> None:
    """End this process if it is not the pool's but a child a handler forked."""
    if os.getpid() != pool_pid:
        _end_forked_child(raised)


def _is_async(handler: Any) -> bool:
    """A coroutine function, an object with an ``async def __call__``, or a partial of one."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)
    )


def _awaited(handler: Callable[[Any, Message], Any]) -> Callable[[Any, Message], Any]:
    """On the sync path: an awaitable a handler returns (a lambda around an async
    function, say) is run to its end on a loop of its own, so that nothing is
    acknowledged whose body did not run."""

    def run(payload: Any, message: Message) -> Any:
        result = handler(payload, message)
        if inspect.isawaitable(result):

            async def wait() -> Any:
                return await result

            return asyncio.run(wait())
        return result

    return run


# Defaults of the worker options, from the core's one table (as PHP's).
_DEFAULT: dict[str, Any] = {o["name"]: o["default"] for o in WORKER_OPTIONS}


def _check_count(name: str, value: Optional[int]) -> None:
    """A count option of the Python side within the table's bounds (``None``: not set)."""
    if value is None:
        return
    row = next(o for o in WORKER_OPTIONS if o["name"] == name)
    low, high = int(row["min"]), min(int(row["max"]), 2**63 - 1)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgumentError(f"invalid {name}: must be a whole number between {low} and {high}, got {value!r}")


class Worker:
    """A pool of consumers that calls ``handler(payload, message)`` for each due message.

    Returning acknowledges the message; raising retries it with exponential backoff and
    jitter, and after ``max_attempts`` moves it to the dead-letter set with the
    exception as its last error. Redis I/O runs on ``threads`` native threads; the
    handler runs on the calling thread (the GIL is released while waiting). A coroutine
    function handler runs on an asyncio loop, ``concurrency`` at a time; past
    ``timeout`` it is cancelled and its delivery fails at once. With
    ``stop_when_empty``, ``run`` returns once no message is due and none runs.

    An exception of a class in ``no_retry`` (or a subclass) sends its message to the
    dead-letter set at once, without retries: for failures that no retry can mend (a
    validation error, an order that no longer exists).

    A failure's traceback (chained causes included) is kept beside its error, as the
    message's ``error_trace`` in ``get()`` and the dead letters, up to
    ``max_trace_bytes`` (its start and end when longer; 0 keeps none).

    A message whose payload is larger than ``max_payload_bytes`` (the queue option of
    the same name bounds what a push writes; one written around it, or by another
    tool, may be larger) goes to the dead-letter set at once, unrun, with the reason;
    the worker reads each message's size first and never loads one past the bound.

    ``lower_queues`` are consumed too, in that order, each only when the queues before
    it have nothing due (strict priority, as Laravel's ``--queue=high,default``);
    ``message.queue`` names the queue a message came from.

    ``max_jobs``, ``max_time`` (seconds) and ``max_memory_mb`` (resident memory) end a
    run gracefully after that many messages, that long, or once the process holds that
    much (``stopped_by`` says which): for a process manager, or ``delayq worker
    --processes``, to start a fresh process in place of a leaky one.
    """

    def __init__(
        self,
        queue: DelayQueue,
        *,
        threads: int = _DEFAULT["threads"],
        batch: int = _DEFAULT["batch"],
        prefetch: int = _DEFAULT["prefetch"],
        lease: float = _DEFAULT["lease"],
        max_attempts: int = _DEFAULT["max_attempts"],
        backoff_base: float = _DEFAULT["backoff_base"],
        backoff_max: float = _DEFAULT["backoff_max"],
        timeout: Optional[float] = None,
        idle_check: float = _DEFAULT["idle_check"],
        stop_when_empty: bool = False,
        max_trace_bytes: int = _DEFAULT["max_trace_bytes"],
        max_payload_bytes: int = _DEFAULT["max_payload_bytes"],
        no_retry: Sequence[type[BaseException]] = (),
        concurrency: int = _DEFAULT["concurrency"],
        on_dead: Optional[Callable[[Any, Message, str], Any]] = None,
        on_failure: Optional[Callable[[Any, Message, BaseException], Any]] = None,
        lower_queues: Sequence[DelayQueue] = (),
        max_jobs: Optional[int] = None,
        max_time: Optional[float] = None,
        max_memory_mb: Optional[int] = None,
    ) -> None:
        no_retry = tuple(no_retry)
        for cls in no_retry:
            if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                raise TypeError(f"no_retry must hold exception classes, got {cls!r}")
        _check_count("concurrency", concurrency)
        self._worker = _Worker(
            queue,
            threads=threads,
            batch=batch,
            prefetch=prefetch,
            lease=lease,
            max_attempts=max_attempts,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            timeout=timeout,
            idle_check=idle_check,
            stop_when_empty=stop_when_empty,
            lower_queues=list(lower_queues),
            max_trace_bytes=max_trace_bytes,
            max_payload_bytes=max_payload_bytes,
            no_retry=no_retry,
            max_jobs=max_jobs,
            max_time=max_time,
            max_memory_mb=max_memory_mb,
        )
        self._no_retry = no_retry
        self._concurrency = concurrency
        self._on_dead = on_dead
        self._on_failure = on_failure
        self._timeout = timeout
        # Set by `delayq worker --processes`: the process's slot, told when handlers start
        # and end and which message they hold.
        self._slot: Optional[_Slot] = None
        # The counts of the latest run, also of one that a second stop signal cut short
        # (it raised instead of returning them): `delayq worker` reports them.
        self._last_summary: Optional[Summary] = None

    def run(self, handler: Handler) -> Summary:
        """Consume until ``stop()``, SIGTERM, SIGINT or ``DelayQueue.restart_workers()``;
        return the run's counts once every acknowledgement is written, with
        ``stopped_by`` saying why (``"stop"``, ``"signal"``, ``"restart"``, ``"empty"``,
        ``"max_jobs"``, ``"max_time"``, ``"max_memory"``, ``"exit"``)."""
        handler = _two_arguments(handler)
        with _graceful_signals(self._worker):
            if _is_async(handler):
                return asyncio.run(self._run_async(handler))
            try:
                self._last_summary = self._worker.run(
                    _awaited(handler), self._on_dead, self._on_failure, self._slot
                )
            except (KeyboardInterrupt, SystemExit) as cut:
                self._last_summary = getattr(cut, "_delayq_summary", None)
                raise
            return self._last_summary

    async def run_async(self, handler: Callable[[Any, Message], Awaitable[None]]) -> Summary:
        """Consume on the running event loop with up to ``concurrency`` handlers at once."""
        handler = _two_arguments(handler)
        return await self._run_async(handler)

    async def _run_async(self, handler: Callable[[Any, Message], Awaitable[None]]) -> Summary:
        consumer = self._worker.start(self._concurrency, self._slot)
        pool_pid = os.getpid()
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self._concurrency)
        running: set[asyncio.Task[None]] = set()
        # The running handlers' deliveries, oldest first.
        started: dict[int, Any] = {}
        # Received and not yet acknowledged, failed or released: a run cut short (a
        # second stop signal) cancels tasks that never started and a receive under way,
        # and those deliveries must go back too.
        unsettled: dict[int, Any] = {}
        receiving = threading.Lock()

        def receive() -> Any:
            with receiving:
                delivery = consumer.recv(0.1)
                if delivery is not None:
                    unsettled[id(delivery)] = delivery
                return delivery

        def received() -> None:
            with receiving:
                pass

        def settled(task: asyncio.Task[None]) -> None:
            running.discard(task)
            if not task.cancelled():
                # All it can raise is a second stop signal's exception, which ends the
                # run itself: retrieved here so that asyncio does not log it as lost.
                task.exception()

        # The delivery the slot names (its key), None while idle.
        announced: list[Optional[int]] = [None]

        def tell_supervisor() -> None:
            if self._slot is None:
                return
            # The oldest running handler is the one the supervisor times. A coroutine past
            # its timeout is cancelled and ends within the grace, so only a blocked event
            # loop keeps it longer: that is what the supervisor's timeout should see as a
            # hung process, not a slow handler. The watch names the blocking one.
            oldest = next(iter(started), None)
            if oldest == announced[0]:
                return
            announced[0] = oldest
            if oldest is None:
                self._slot.finished()
            else:
                # A cancel with kill would end every coroutine of the loop with its
                # own: for them it is a plain cancel (their tasks are cancelled).
                self._slot.started(started[oldest], _COROUTINE_GRACE, killable=False)

        async def handle(delivery: Any) -> None:
            key = id(delivery)
            started[key] = delivery
            if len(started) == 1:
                tell_supervisor()
            try:
                await settle(delivery)
            finally:
                del started[key]
                unsettled.pop(key, None)
                tell_supervisor()

        async def begin(delivery: Any) -> None:
            # The lease is read in the step that runs the handler's first code, with no
            # await between: a freeze since the delivery was received, or since a step
            # before this one (with a timeout, this runs in a task of its own), is seen.
            payload, message = delivery.payload, delivery.message
            if not consumer.begin(delivery):
                # Given back unstarted: another worker may run it now.
                raise _NotStarted
            await handler(payload, message)

        async def settle(delivery: Any) -> None:
            raised: Optional[BaseException] = None
            try:
                try:
                    await self._bounded(begin(delivery), watch, delivery)
                except _NotStarted:
                    return
                except BaseException as exc:
                    _leave_if_forked(pool_pid, exc)
                    raised = exc
                else:
                    _leave_if_forked(pool_pid, None)
                # The core's run policy and what follows it, in its order, as on the sync
                # path (see _Consumer.settle).
                ends_run, on_failure, dead = consumer.settle(delivery, raised)
            finally:
                slots.release()
            if ends_run is not None:
                # SystemExit, a stop signal's exception, a cancellation: no hook runs.
                raise ends_run
            if on_failure and self._on_failure is not None:
                await self._alert(self._on_failure, "on_failure", delivery, raised)
            if dead is not None and self._on_dead is not None:
                await self._alert(self._on_dead, "on_dead", delivery, dead)
            consumer.after_job()

        watch = None
        if self._slot is not None and self._timeout is not None:
            watch = _LoopWatch(loop, self._slot, self._timeout, functools.partial(_oldest_running, started))
        try:
            while True:
                await slots.acquire()
                delivery = await loop.run_in_executor(None, receive)
                if delivery is None:
                    slots.release()
                    if consumer.stopped:
                        break
                    continue
                task = loop.create_task(handle(delivery))
                running.add(task)
                task.add_done_callback(settled)
            # Running handlers finish and are acknowledged.
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        finally:
            if watch is not None:
                watch.close()
            consumer.stop()
            await loop.run_in_executor(None, received)
            for delivery in list(unsettled.values()):
                with contextlib.suppress(InvalidArgumentError):  # its task settled it meanwhile
                    consumer.release(delivery)
            summary = await loop.run_in_executor(None, consumer.finish, self._worker.take_stop_reason())
            self._last_summary = summary
        return summary

    async def _bounded(self, call: Awaitable[None], watch: Optional[_LoopWatch] = None, delivery: Any = None) -> None:
        """Await a coroutine handler; past ``timeout`` it is cancelled (a coroutine, unlike
        a thread, can be), and the delivery fails at once instead of waiting out its lease.
        ``watch``: the loop's watch, told which task runs ``delivery``'s handler. A
        message cancelled while it runs has its handler's task cancelled."""
        marked: list[bool] = []
        # Without a timeout the handler runs in this task (SystemExit and the like reach
        # the run as they are raised), which a cancel cancels; with one, in its own.
        task = asyncio.current_task() if self._timeout is None else asyncio.ensure_future(call)
        watcher = None if delivery is None or task is None else asyncio.ensure_future(
            _cancel_when_marked(task, delivery.message, marked))
        if watch is not None and self._timeout is not None:
            watch.handlers[task] = (delivery, time.monotonic())
        try:
            if self._timeout is None:
                await call
            else:
                await self._await_bounded(task, self._timeout)
        except asyncio.CancelledError:
            if marked:
                uncancel = getattr(asyncio.current_task(), "uncancel", None)
                if uncancel is not None and self._timeout is None:
                    uncancel()  # the cancel was the watcher's, and is answered here
                raise _HandlerCancelled(delivery.message.id) from None
            raise
        finally:
            if watcher is not None:
                watcher.cancel()
            if watch is not None:
                watch.handlers.pop(task, None)

    async def _await_bounded(self, task: asyncio.Future[None], timeout: float) -> None:
        try:
            done, _ = await asyncio.wait({task}, timeout=timeout)
        except asyncio.CancelledError:  # the run itself is being cancelled
            task.cancel()
            raise
        if not done:
            task.cancel()
            # A handler may clean up after its cancellation, but one that swallows it
            # must not hold its message (its lease renewed) for ever: past the grace the
            # delivery fails all the same and the task is left to run on, unawaited.
            finished, _ = await asyncio.wait({task}, timeout=_CANCEL_GRACE)
            if not finished:
                _abandoned.add(task)
                task.add_done_callback(_abandoned.discard)
                logging.getLogger("delayq.worker").error(
                    "delayq: a coroutine handler ignored its cancellation at the %g s timeout and still runs; "
                    "its message fails now and runs again after its backoff", timeout)
            elif not task.cancelled():
                with contextlib.suppress(BaseException):
                    task.result()  # what it raised while cancelled is the timeout's doing
            raise _HandlerTimedOut(_cancel_error(timeout))
        task.result()

    async def _alert(self, hook: Callable[[Any, Message, Any], Any], name: str, delivery: Any, what: Any) -> None:
        # An alert (on_dead, on_failure), not part of the message's handling: what it
        # raises is logged.
        try:
            result = hook(delivery.payload, delivery.message, what)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            logging.getLogger("delayq.worker").warning(
                "delayq[%s]: %s raised %s: %s", delivery.message.queue, name, type(exc).__name__, exc)

    def stop(self) -> None:
        """Stop gracefully: running handlers finish and are acknowledged, prefetched
        messages go back to the queue at once, then ``run`` returns. Safe from another
        thread or a signal handler."""
        self._worker.stop("stop")

    def __enter__(self) -> Worker:
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.stop()
