"""A pool run as a process by test_stall.py and test_rolling_deploy.py:
    python span_pool.py URL QUEUE LOG OPTIONS_JSON
For each message, appends "<n> <attempt> <pid> start <unix time>" to LOG when the
handler starts and "... end ..." when it returns; a payload's "sleep" (seconds) is slept
on its first attempt, and a payload with "fail" fails its first attempt. OPTIONS_JSON
holds Worker keyword arguments."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import delayq

url, name, log, options = sys.argv[1:5]


def note(payload: dict[str, Any], msg: delayq.Message, what: str) -> None:
    with open(log, "a") as f:
        f.write(f"{payload['n']} {msg.attempt} {os.getpid()} {what} {time.time():.6f}\n")


def handle(payload: dict[str, Any], msg: delayq.Message) -> None:
    note(payload, msg, "start")
    if msg.attempt == 1:
        time.sleep(payload.get("sleep", 0))
    note(payload, msg, "end")
    if msg.attempt == 1 and payload.get("fail"):
        raise RuntimeError(f"message {payload['n']} fails its first attempt")


delayq.Worker(delayq.DelayQueue(url, name), **json.loads(options)).run(handle)
