"""``delayq worker``'s helpers: the handler and hooks named on the command line, the
``Worker`` its options make, and one worker process's run.

The supervision of ``--processes N`` (and ``--timeout``) is the core's
(``delayq::host::supervise``, through ``_delayq._Supervisor``): it starts each worker
process as a fresh interpreter (``python -m delayq ... worker``), never by ``fork()``,
replaces a process that dies, kills one whose handler runs past ``--timeout`` and fails
its message at once, balances the pool with ``--min-processes``, and sums the counts.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, Callable, Optional, Sequence

from . import DelayQueue, Message, Worker
from ._delayq import _Slot
from .records import Summary


class HandlerNotFound(Exception):
    """The handler named on the command line cannot be imported or called."""


def load_handler(target: str) -> Callable[..., Any]:
    """The callable named ``module:attribute`` (``attribute`` may be dotted), imported
    with the current directory first on ``sys.path``, as ``rq`` and ``celery`` do."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise HandlerNotFound(f"the handler must be given as module:function, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # the user's module: whatever it raises on import
        raise HandlerNotFound(f"cannot import {module_name!r}: {type(e).__name__}: {e}") from e
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise HandlerNotFound(f"{target!r}: {module_name} has no attribute {attribute!r}") from None
    if not callable(obj):
        raise HandlerNotFound(f"{target!r} is not callable but {type(obj).__name__}")
    return obj  # type: ignore[no-any-return]


def load_exception(target: str) -> type[BaseException]:
    """The exception class named ``module:Class`` (``builtins:ValueError`` for a
    built-in one)."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise HandlerNotFound(f"an exception class must be given as module:Class (builtins:ValueError for a "
                              f"built-in one), got {target!r}")
    cls = load_handler(target)
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        raise HandlerNotFound(f"{target!r} is not an exception class")
    return cls


def worker_from_args(
    queue: DelayQueue,
    lower: Sequence[DelayQueue],
    args: argparse.Namespace,
    on_dead: Optional[Callable[[Any, Message, str], Any]] = None,
    no_retry: Sequence[type[BaseException]] = (),
    on_failure: Optional[Callable[[Any, Message, BaseException], Any]] = None,
) -> Worker:
    return Worker(
        queue,
        threads=args.threads,
        batch=args.batch,
        prefetch=args.prefetch,
        lease=args.lease,
        max_attempts=args.max_attempts,
        backoff_base=args.backoff_base,
        backoff_max=args.backoff_max,
        timeout=args.timeout,
        idle_check=args.idle_check,
        stop_when_empty=args.stop_when_empty,
        max_trace_bytes=args.max_trace_bytes,
        max_payload_bytes=args.max_payload_bytes,
        no_retry=no_retry,
        concurrency=args.concurrency,
        lower_queues=lower,
        max_jobs=args.max_jobs,
        max_time=args.max_time,
        max_memory_mb=args.max_memory_mb,
        on_dead=on_dead,
        on_failure=on_failure,
    )


def run_one(
    worker: Worker,
    handler: Callable[..., Any],
    slot: Optional[_Slot],
    on_start: Optional[Callable[[], Any]] = None,
    on_stop: Optional[Callable[[], Any]] = None,
) -> Summary:
    """One worker process: consume until stopped; returns the run's summary. ``slot``:
    the process's slot in a supervised pool, told of each handler call."""
    if on_start is not None:
        on_start()
    worker._slot = slot
    try:
        summary = worker.run(handler)
    finally:
        worker._slot = None
    if on_stop is not None:
        on_stop()
    return summary
