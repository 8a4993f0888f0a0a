"""A worker run as a child process by test_lease.py, without a supervisor:
    python lease_worker.py URL QUEUE LOG OPTIONS_JSON
Appends "<n> <attempt> <pid> <start>" (time.time()) to LOG as each handler starts. A
payload with "kill" makes the handler kill its own process (SIGKILL), every time.
OPTIONS_JSON holds worker options, "_sleep" how long each handler runs (s), and
"_async" true for a coroutine handler (run ``concurrency`` at a time)."""

from __future__ import annotations

import asyncio
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
worker = delayq.Worker(delayq.DelayQueue(url, name), **options)


def started(payload: dict[str, Any], msg: delayq.Message) -> None:
    with open(log, "a") as f:
        f.write(f"{payload['n']} {msg.attempt} {os.getpid()} {time.time():.6f}\n")
    if payload.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)


def handle(payload: dict[str, Any], msg: delayq.Message) -> None:
    started(payload, msg)
    time.sleep(sleep)


async def handle_async(payload: dict[str, Any], msg: delayq.Message) -> None:
    started(payload, msg)
    await asyncio.sleep(sleep)


worker.run(handle_async if coroutine else handle)
