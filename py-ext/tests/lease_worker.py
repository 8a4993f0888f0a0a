"""A worker run as a child process by test_lease.py, without a supervisor:
    python lease_worker.py URL QUEUE LOG OPTIONS_JSON
Appends "<n> <attempt> <pid> <start>" (time.time()) to LOG as each handler starts. A
payload with "kill" makes the handler kill its own process (SIGKILL), every time.
OPTIONS_JSON holds worker options, and "_sleep" how long each handler runs (s)."""

from __future__ import annotations

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
worker = delayq.Worker(delayq.DelayQueue(url, name), **options)


def handle(payload: dict[str, Any], msg: delayq.Message) -> None:
    with open(log, "a") as f:
        f.write(f"{payload['n']} {msg.attempt} {os.getpid()} {time.time():.6f}\n")
    if payload.get("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(sleep)


worker.run(handle)
