"""delayq from Python in the side-by-side benchmark (run by bench/run.py).

    python3 bench/python/bench.py push --mode=single|bulk --n=N --url=URL
    python3 bench/python/bench.py consume --url=URL --records=DIR [--until-empty]
        [--sleep-ms=0] [--lease=30] [--stream-records]

`consume` runs 4 worker processes (as the PHP consumers do), each a delayq.Worker
with 2 I/O threads, and records "order_id handled_at" per message in DIR/<pid>: at
exit, or at once per message with --sleep-ms (a fault run must keep what a killed
process handled) or --stream-records (a memory run must not grow a record list).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import signal
import subprocess
import threading
import time
from typing import Any

import delayq

QUEUE = "bench"
PROCESSES = 4


def push(url: str, mode: str, n: int) -> None:
    q = delayq.DelayQueue(url, QUEUE)
    start = time.perf_counter()
    if mode == "single":
        for i in range(n):
            q.push({"order_id": i, "action": "close"}, delay=60)
    else:
        for lo in range(0, n, 1000):
            q.push_many([({"order_id": i, "action": "close"}, 60) for i in range(lo, min(n, lo + 1000))])
    rate = n / (time.perf_counter() - start)
    print(json.dumps({"rate": rate, "stored": q.stats()["scheduled"]}))


def work(url: str, records: str, until_empty: bool, sleep_ms: float, lease: float, stream: bool) -> None:
    q = delayq.DelayQueue(url, QUEUE)
    worker = delayq.Worker(q, threads=2, batch=1000, lease=lease)
    seen: list[str] = []
    path = os.path.join(records, str(os.getpid()))
    sink = open(path, "a", buffering=1) if sleep_ms or stream else None

    def handle(payload: dict[str, Any], msg: delayq.Message) -> None:
        if sleep_ms:
            time.sleep(sleep_ms / 1000)
        if sink is not None:
            sink.write(f"{payload['order_id']} {time.time()}\n")
        else:
            seen.append(f"{payload['order_id']} {time.time()}")

    if until_empty:

        def filled() -> bool:
            # The fill script sets this plain key once it is done (see bench/php/fill.php).
            out = subprocess.run(["redis-cli", "-u", url, "EXISTS", "bench:filled"], capture_output=True, text=True)
            return out.stdout.strip() == "1"

        def watch() -> None:
            while True:
                time.sleep(1)
                s = q.stats()
                if s["ready"] + s["scheduled"] + s["inflight"] == 0 and filled():
                    worker.stop()
                    return

        threading.Thread(target=watch, daemon=True).start()
    worker.run(handle)
    if sink is None:
        with open(path, "w") as f:
            f.write("\n".join(seen))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["push", "consume"])
    p.add_argument("--url", required=True)
    p.add_argument("--mode", default="single")
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--records")
    p.add_argument("--until-empty", action="store_true")
    p.add_argument("--sleep-ms", type=float, default=0)
    p.add_argument("--lease", type=float, default=30)
    p.add_argument("--stream-records", action="store_true")
    a = p.parse_args()
    if a.command == "push":
        push(a.url, a.mode, a.n)
        return
    # Forked before any delayq thread starts; each child makes its own queue and pool.
    children = [
        multiprocessing.Process(
            target=work, args=(a.url, a.records, a.until_empty, a.sleep_ms, a.lease, a.stream_records)
        )
        for _ in range(PROCESSES)
    ]
    for c in children:
        c.start()

    def forward(signum: int, _frame: Any) -> None:
        for c in children:
            if c.pid:
                os.kill(c.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    for c in children:
        c.join()


if __name__ == "__main__":
    main()
