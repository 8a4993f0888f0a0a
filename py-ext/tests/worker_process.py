"""A worker run as a child process by test_worker.py:
    python worker_process.py URL QUEUE LOG [timeout]
Appends "<n> <attempt> <pid>" to LOG for each handled message and writes the summary
as JSON to LOG.summary. A payload with "hang" sleeps forever on its first attempt."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import delayq

url, name, log = sys.argv[1:4]
timeout = float(sys.argv[4]) if len(sys.argv) > 4 else None
worker = delayq.Worker(delayq.DelayQueue(url, name), lease=1.0, timeout=timeout, backoff_base=0.05)


def handle(payload: dict[str, Any], msg: delayq.Message) -> None:
    if payload.get("hang") and msg.attempt == 1:
        time.sleep(3600)
    time.sleep(0.002)
    with open(log, "a") as f:
        f.write(f"{payload['n']} {msg.attempt} {os.getpid()}\n")


summary = worker.run(handle)
with open(log + ".summary", "w") as f:
    json.dump(summary, f)
