"""``delayq worker``: run a handler function from the command line, in one process or
in a supervised pool of them (what ``rq worker`` or ``celery worker -c N`` do).

A Python handler runs one at a time per process (the GIL), so a pool of processes is
how Python work scales past one core. The supervisor starts each worker process as a
fresh interpreter (``python -m delayq ... worker``), never by ``fork()``: no thread of
the supervisor, and no connection, is ever copied into a child. It replaces a process
that dies, kills one whose handler runs past ``--timeout`` (its message is delivered
again once its lease ends), forwards SIGTERM and SIGINT, and sums the processes' run
summaries. With ``--min-processes`` it balances the pool between that and
``--processes`` as the backlog asks (Horizon's ``auto``), a decision the core's scaler
makes. The queue logic stays in the core: each process is an ordinary ``Worker``.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import logging
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from . import _URGENT_AFTER, DelayQueue, Message, Worker
from ._delayq import _Scaler

log = logging.getLogger("delayq.supervisor")

#: A process that dies this soon after its start counts towards giving up.
QUICK_DEATH = 2.0
#: Quick deaths in a row after which the supervisor stops the pool: a handler module
#: that fails on import or a Redis that refuses every process would otherwise loop.
QUICK_DEATHS_TO_GIVE_UP = 5
#: The slot of a process: the CLOCK_MONOTONIC time its running handler started, 0 idle.
SLOT = struct.Struct("d")
#: Why a process ends a run so that a fresh one takes its place (see ``Worker``).
RECYCLED = ("max_jobs", "max_time", "max_memory")
#: Counts summed over the processes of a pool.
COUNTS = ("handled", "acked", "failed", "retried", "dead", "lease_lost", "gone", "released", "unwritten")
#: Seconds between an auto-balanced pool's looks at the backlog (the scaler's cooldown
#: bounds how often the pool changes).
LOOK_EVERY = 0.5


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
        no_retry=no_retry,
        concurrency=args.concurrency,
        lower_queues=lower,
        max_jobs=args.max_jobs,
        max_time=args.max_time,
        max_memory_mb=args.max_memory_mb,
        on_dead=on_dead,
        on_failure=on_failure,
    )


def _watched(handler: Callable[..., Any], slot_fd: int) -> Callable[[Any, Message], Any]:
    """``handler`` writing its start time into the slot the supervisor watches."""

    def run(payload: Any, message: Message) -> Any:
        _write_slot(slot_fd, time.monotonic())
        try:
            return handler(payload, message)
        finally:
            _write_slot(slot_fd, 0.0)

    return run


def _write_slot(slot_fd: int, started: float) -> None:
    os.pwrite(slot_fd, SLOT.pack(started), 0)


def stop_with_supervisor() -> None:
    """In a worker process: SIGTERM (a graceful stop) once the supervisor is gone, even
    if it was SIGKILLed, so no orphaned process goes on consuming unsupervised (Linux;
    elsewhere an orphan runs on until stopped)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def run_one(
    worker: Worker,
    handler: Callable[..., Any],
    slot_path: Optional[str],
    on_start: Optional[Callable[[], Any]] = None,
    on_stop: Optional[Callable[[], Any]] = None,
) -> dict[str, Any]:
    """One worker process: consume until stopped; returns the run's summary."""
    if on_start is not None:
        on_start()
    if slot_path is None:
        summary = worker.run(handler)
    else:
        slot_fd = os.open(slot_path, os.O_WRONLY)
        try:
            if inspect.iscoroutinefunction(handler):
                worker._busy_slot = lambda started: _write_slot(slot_fd, started)
                summary = worker.run(handler)
            else:
                summary = worker.run(_watched(handler, slot_fd))
        finally:
            os.close(slot_fd)
    if on_stop is not None:
        on_stop()
    return summary


@dataclass
class _Child:
    process: subprocess.Popen[bytes]
    report: int
    slot: str
    started: float
    summary: Optional[dict[str, Any]] = None
    killed_hung: bool = False

    def handler_started(self) -> float:
        with open(self.slot, "rb") as f:
            data = f.read(SLOT.size)
        return SLOT.unpack(data)[0] if len(data) == SLOT.size else 0.0

    def read_report(self) -> None:
        chunks = []
        while chunk := os.read(self.report, 65536):
            chunks.append(chunk)
        os.close(self.report)
        os.unlink(self.slot)
        if chunks:
            try:
                self.summary = json.loads(b"".join(chunks))
            except ValueError:
                self.summary = None


@dataclass
class _Pool:
    command: list[str]
    timeout: Optional[float]
    children: list[Optional[_Child]] = field(default_factory=list)
    #: The slots that should hold a running process (the others stay empty).
    wanted: list[bool] = field(default_factory=list)
    stopping: bool = False
    stopped_by: Optional[str] = None
    restarts: int = 0
    killed_hung: int = 0
    scaled_up: int = 0
    scaled_down: int = 0
    quick_deaths: int = 0
    gave_up: Optional[str] = None
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))

    def start(self, index: int) -> None:
        read_end, write_end = os.pipe()
        slot_fd, slot = tempfile.mkstemp(prefix="delayq-slot-")
        os.write(slot_fd, SLOT.pack(0.0))
        os.close(slot_fd)
        process = subprocess.Popen(
            [*self.command, "--report-fd", str(write_end), "--slot-file", slot],
            pass_fds=(write_end,),
        )
        os.close(write_end)
        self.children[index] = _Child(process, read_end, slot, time.monotonic())
        log.info("delayq: worker process %d started", process.pid)
        if self.stopping:
            # The stop signal came while this process was being started, before
            # signal_all() could see it.
            process.send_signal(signal.SIGTERM)

    def signal_all(self, signum: int) -> None:
        for child in self.children:
            if child is not None and child.process.poll() is None:
                child.process.send_signal(signum)

    def stop(self, why: str) -> None:
        if not self.stopping:
            self.stopping = True
            self.stopped_by = why
            self.signal_all(signal.SIGTERM)

    def kill_hung(self, child: _Child) -> None:
        if self.timeout is None or child.killed_hung:
            return
        started = child.handler_started()
        if started > 0 and time.monotonic() - started > self.timeout:
            log.warning("delayq: worker process %d: its handler ran past the %g s timeout and was killed; "
                        "its message is delivered again once its lease ends", child.process.pid, self.timeout)
            child.killed_hung = True
            self.killed_hung += 1
            child.process.kill()

    def balance(self, scaler: _Scaler, queues: list[DelayQueue]) -> None:
        """Add a process, or let an idle one go (a graceful stop), as the scaler says."""
        running = sum(self.wanted)
        busy = sum(1 for i, c in enumerate(self.children)
                   if self.wanted[i] and c is not None and c.handler_started() > 0)
        target = scaler.look(queues, running, busy)
        if target > running:
            free = next((i for i, c in enumerate(self.children) if not self.wanted[i] and c is None), None)
            if free is not None:
                self.wanted[free] = True
                self.scaled_up += 1
                log.info("delayq: messages are waiting: %d worker processes (at most %d)", target, len(self.children))
                self.start(free)
        elif target < running:
            for i in reversed(range(len(self.children))):
                c = self.children[i]
                if self.wanted[i] and c is not None and c.process.poll() is None and c.handler_started() == 0:
                    self.wanted[i] = False
                    self.scaled_down += 1
                    log.info("delayq: nothing waiting: %d worker processes (at least %d)", target, scaler.min)
                    c.process.send_signal(signal.SIGTERM)
                    break

    def reap(self, index: int, child: _Child) -> None:
        code = child.process.returncode
        child.read_report()
        self.children[index] = None
        summary = child.summary
        if summary is not None:
            for name in COUNTS:
                self.totals[name] += int(summary.get(name, 0))
        why = summary.get("stopped_by") if summary else None
        if why in ("restart", "empty"):
            # The other processes see the same restart request or empty queue.
            self.stop(why)
            return
        if self.stopping or not self.wanted[index]:
            return
        if why in RECYCLED:
            log.info("delayq: worker process %d recycled (%s); starting another", child.process.pid, why)
        elif not child.killed_hung:
            if summary is not None:
                ended = f"stopped ({why})"
            elif code < 0:
                ended = f"was killed by signal {-code}"
            else:
                ended = f"exited with status {code}"
            log.warning("delayq: worker process %d %s; starting another", child.process.pid, ended)
            if time.monotonic() - child.started < QUICK_DEATH:
                self.quick_deaths += 1
            else:
                self.quick_deaths = 0
            if self.quick_deaths >= QUICK_DEATHS_TO_GIVE_UP:
                self.gave_up = f"{self.quick_deaths} worker processes in a row ended within {QUICK_DEATH:g} s " \
                               "of their start; giving up (their errors are above)"
                self.stop("error")
                return
            # A process that fails at once is not restarted in a tight loop.
            time.sleep(min(0.1 * 2 ** self.quick_deaths, 2.0))
            if self.stopping:  # a signal came during the pause
                return
        self.restarts += 1
        self.start(index)


def supervise(
    command: list[str],
    processes: int,
    timeout: Optional[float],
    scaler: Optional[_Scaler] = None,
    queues: Sequence[DelayQueue] = (),
) -> tuple[dict[str, Any], bool]:
    """Run ``processes`` copies of ``command`` until SIGTERM or SIGINT (or a restart
    request, or an empty queue under ``--stop-when-empty``); returns the pool's summary
    and whether it ran as asked (False: it gave up on processes that kept dying). With
    a ``scaler`` that balances, between its minimum and ``processes`` copies, reading
    the backlog of ``queues``."""
    if scaler is None:
        scaler = _Scaler(processes, processes, 3.0)
    pool = _Pool(command, timeout, [None] * processes, [i < scaler.initial for i in range(processes)])
    next_look = time.monotonic() + LOOK_EVERY

    first_signal: Optional[float] = None
    # After a second signal, each process is told again every half second until it
    # ended (its own first signal may have come a little after this one's); told a
    # second time, a process gives its messages back and ends at once.
    urgent_relay: Optional[float] = None

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal first_signal, urgent_relay
        if first_signal is None:
            first_signal = time.monotonic()
        elif urgent_relay is None and time.monotonic() - first_signal >= _URGENT_AFTER:
            log.warning("delayq: %s again: stopping every worker process now", signal.Signals(signum).name)
            urgent_relay = time.monotonic()
        pool.stop("signal")

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for i in range(processes):
            if pool.stopping:
                break
            if pool.wanted[i]:
                pool.start(i)
        while any(child is not None for child in pool.children):
            if urgent_relay is not None and time.monotonic() >= urgent_relay:
                urgent_relay = time.monotonic() + _URGENT_AFTER
                pool.signal_all(signal.SIGTERM)
            if scaler.is_auto and not pool.stopping and time.monotonic() >= next_look:
                next_look = time.monotonic() + LOOK_EVERY
                pool.balance(scaler, list(queues))
            for i, child in enumerate(pool.children):
                if child is None:
                    continue
                if child.process.poll() is None:
                    pool.kill_hung(child)
                else:
                    pool.reap(i, child)
            time.sleep(0.05)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if pool.gave_up:
        log.error("delayq: %s", pool.gave_up)
    summary: dict[str, Any] = {
        **pool.totals,
        "stopped_by": pool.stopped_by,
        "processes": processes,
        "restarts": pool.restarts,
        "killed_hung": pool.killed_hung,
        "scaled_up": pool.scaled_up,
        "scaled_down": pool.scaled_down,
    }
    return summary, pool.gave_up is None
