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
import inspect
import logging
import signal
import threading
from collections.abc import Awaitable, Iterator, Sequence
from types import TracebackType
from typing import Any, Callable, Optional, Union

from . import errors
from ._delayq import DEFAULT_MAX_PAYLOAD_BYTES, DelayQueue, Message, _Worker, __version__
from .aio import AsyncDelayQueue
from .errors import (
    AuthError,
    ConnectionError,
    DelayQueueError,
    InvalidArgumentError,
    LeaseLostError,
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
    "Message",
    "PayloadError",
    "TimeoutError",
    "Worker",
    "__version__",
    "errors",
]

Handler = Callable[[Any, Message], Union[None, Awaitable[None]]]


@contextlib.contextmanager
def _graceful_signals(worker: _Worker) -> Iterator[None]:
    """SIGINT and SIGTERM stop the worker gracefully while it runs (main thread only:
    Python accepts signal handlers nowhere else)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        worker.stop("signal")

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class Worker:
    """A pool of consumers that calls ``handler(payload, message)`` for each due message.

    Returning acknowledges the message; raising retries it with exponential backoff and
    jitter, and after ``max_attempts`` moves it to the dead-letter set with the
    exception as its last error. Redis I/O runs on ``threads`` native threads; the
    handler runs on the calling thread (the GIL is released while waiting). A coroutine
    function handler runs on an asyncio loop, ``concurrency`` at a time. With
    ``stop_when_empty``, ``run`` returns once no message is due and none runs.

    ``lower_queues`` are consumed too, in that order, each only when the queues before
    it have nothing due (strict priority, as Laravel's ``--queue=high,default``);
    ``message.queue`` names the queue a message came from.
    """

    def __init__(
        self,
        queue: DelayQueue,
        *,
        threads: int = 4,
        batch: int = 50,
        prefetch: int = 0,
        lease: float = 30.0,
        max_attempts: int = 5,
        backoff_base: float = 1.0,
        backoff_max: float = 300.0,
        timeout: Optional[float] = None,
        idle_check: float = 1.0,
        stop_when_empty: bool = False,
        concurrency: int = 10,
        on_dead: Optional[Callable[[Any, Message, str], Any]] = None,
        lower_queues: Sequence[DelayQueue] = (),
    ) -> None:
        if concurrency < 1:
            raise InvalidArgumentError(f"invalid concurrency: must be at least 1, got {concurrency}")
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
        )
        self._concurrency = concurrency
        self._on_dead = on_dead

    def run(self, handler: Handler) -> dict[str, Any]:
        """Consume until ``stop()``, SIGTERM, SIGINT or ``DelayQueue.restart_workers()``;
        return the run's counts once every acknowledgement is written, with
        ``stopped_by`` saying why (``"stop"``, ``"signal"``, ``"restart"``)."""
        with _graceful_signals(self._worker):
            if inspect.iscoroutinefunction(handler):
                return asyncio.run(self.run_async(handler))
            return self._worker.run(handler, self._on_dead)

    async def run_async(self, handler: Callable[[Any, Message], Awaitable[None]]) -> dict[str, Any]:
        """Consume on the running event loop with up to ``concurrency`` handlers at once."""
        consumer = self._worker.start(self._concurrency)
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self._concurrency)
        running: set[asyncio.Task[None]] = set()

        async def handle(delivery: Any) -> None:
            try:
                await handler(delivery.payload, delivery.message)
            except (KeyboardInterrupt, SystemExit, asyncio.CancelledError):
                consumer.release(delivery)
                raise
            except Exception as exc:  # the handler's failure is the message's failure
                dead = consumer.fail(delivery, f"{type(exc).__name__}: {exc}")
            else:
                dead = consumer.ack(delivery)
            finally:
                slots.release()
            if dead is not None and self._on_dead is not None:
                await self._call_on_dead(delivery, dead)

        try:
            while True:
                await slots.acquire()
                delivery = await loop.run_in_executor(None, consumer.recv, 0.1)
                if delivery is None:
                    slots.release()
                    if consumer.stopped:
                        break
                    continue
                task = loop.create_task(handle(delivery))
                running.add(task)
                task.add_done_callback(running.discard)
            # Running handlers finish and are acknowledged.
            if running:
                await asyncio.gather(*running, return_exceptions=True)
        finally:
            consumer.stop()
            summary = await loop.run_in_executor(None, consumer.finish, self._worker.take_stop_reason())
        return summary

    async def _call_on_dead(self, delivery: Any, error: str) -> None:
        # An alert, not part of the message's handling: what it raises is logged.
        assert self._on_dead is not None
        try:
            result = self._on_dead(delivery.payload, delivery.message, error)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            logging.getLogger("delayq.worker").warning(
                "delayq[%s]: on_dead raised %s: %s", delivery.message.queue, type(exc).__name__, exc)

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
