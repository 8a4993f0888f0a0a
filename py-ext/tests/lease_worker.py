"""A worker run as a child process by test_lease.py, without a supervisor:
    python lease_worker.py URL QUEUE LOG OPTIONS_JSON
Appends "<n> <attempt> <pid> <start>" (time.time()) to LOG as each handler starts. A
payload with "kill" makes the handler kill its own process (SIGKILL), every time.
OPTIONS_JSON holds worker options, "_sleep" how long each handler runs (s), "_async"
true for a coroutine handler (run ``concurrency`` at a time), and "_freeze" true for a
process whose coroutine handler of a payload with "freeze" stops the process (SIGSTOP)
right after the event loop's first step for the next delivery (see
``freeze_after_next_step``)."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import sys
import time
from typing import Any

import delayq

url, name, log, options_json = sys.argv[1:5]
options = json.loads(options_json)
sleep = options.pop("_sleep", 0.001)
coroutine = options.pop("_async", False)
freezer = options.pop("_freeze", False)
worker = delayq.Worker(delayq.DelayQueue(url, name), **options)


def started(payload: dict[str, Any], msg: delayq.Message) -> None:
    # The start is read before the log is opened: a freeze that lands in that system
    # call is one of a handler that had started, not a start after the freeze.
    at = time.time()
    with open(log, "a") as f:
        f.write(f"{payload['n']} {msg.attempt} {os.getpid()} {at:.6f}\n")
    if payload.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)


def handle(payload: dict[str, Any], msg: delayq.Message) -> None:
    started(payload, msg)
    time.sleep(sleep)


def unstarted(task: asyncio.Task[Any]) -> bool:
    return inspect.getcoroutinestate(task.get_coro()) == inspect.CORO_CREATED  # type: ignore[arg-type]


async def freeze_after_next_step() -> None:
    """Stop this process (SIGSTOP, as a VM pause would) right after the event loop ran
    the first step of the next task the worker creates (the one for the next delivery)
    and before any later step: a handler that starts a step after the decision that its
    lease lives starts after the freeze. Polls once a loop iteration, a step queued
    before any that the worker queues after the poll."""
    known = asyncio.all_tasks()
    created = None
    while True:
        if created is None:
            created = next((t for t in asyncio.all_tasks() - known if unstarted(t)), None)
        elif created.done() or not unstarted(created):
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        await asyncio.sleep(0)


async def handle_async(payload: dict[str, Any], msg: delayq.Message) -> None:
    started(payload, msg)
    if freezer and payload.get("freeze"):
        await freeze_after_next_step()
    await asyncio.sleep(sleep)


worker.run(handle_async if coroutine else handle)
