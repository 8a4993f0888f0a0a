"""How long a running message's handler takes to see a `cancel()` made in another
process: from the call to `message.cancelled` turning true (a thread's handler that
looks every 0.5 ms), or to an asyncio handler's task being cancelled.

A private redis-server pinned to CPU 0; one Python worker process pinned to CPU 1, one
handler, with the lease of the row (its heartbeat, which carries the mark, comes every
third of it); this process pushes a message, waits until it runs, waits a random part
of a heartbeat (so that the cancel falls anywhere in the heartbeat's cycle), notes
`time.monotonic()` and calls `cancel()`; the handler notes `time.monotonic()` when it
sees the mark (one clock for both processes: CLOCK_MONOTONIC). SAMPLES cancels per
row. Writes bench/results/<date>-cancel-latency.md.

    python3 bench/cancel_latency.py
"""

from __future__ import annotations

import datetime
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402

SAMPLES = 20
# (handler kind, lease in seconds)
ROWS = [("thread", 1.5), ("asyncio", 1.5), ("thread", 6.0), ("thread", 30.0)]

WORKER = """
import asyncio, json, sys, time, delayq
url, out, kind, lease = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])

def note(msg):
    with open(out, "a") as f:
        f.write(json.dumps([msg.id, time.monotonic()]) + "\\n")

def handle(payload, msg):
    with open(out + ".started", "a") as f:
        f.write(msg.id + "\\n")
    while not msg.cancelled:
        time.sleep(0.0005)
    note(msg)

async def handle_async(payload, msg):
    with open(out + ".started", "a") as f:
        f.write(msg.id + "\\n")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        note(msg)
        raise

worker = delayq.Worker(delayq.DelayQueue(url, "cancel"), threads=1, concurrency=1, lease=lease)
worker.run(handle if kind == "thread" else handle_async)
"""


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def measure(kind: str, lease: float) -> list[float]:
    import delayq

    redis = run.Redis()
    worker = None
    try:
        q = delayq.DelayQueue(redis.url, "cancel")
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "seen.jsonl"
            started = Path(str(out) + ".started")
            worker = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", WORKER, redis.url, str(out),
                                       kind, str(lease)])
            latencies = []
            for i in range(SAMPLES):
                q.push({"n": i}, id=f"m-{i}")
                deadline = time.monotonic() + 60
                while len(lines(started)) <= i:
                    if time.monotonic() > deadline or worker.poll() is not None:
                        sys.exit("the worker did not start the message")
                    time.sleep(0.001)
                time.sleep(random.uniform(0, lease / 3))
                t0 = time.monotonic()
                if not q.cancel(f"m-{i}"):
                    sys.exit(f"m-{i} was not cancelled")
                deadline = time.monotonic() + lease * 2 + 5
                while len(lines(out)) <= i:
                    if time.monotonic() > deadline:
                        sys.exit(f"the handler never saw the cancel of m-{i}")
                    time.sleep(0.0005)
                mid, t1 = json.loads(lines(out)[i])
                assert mid == f"m-{i}"
                latencies.append((t1 - t0) * 1000)
                # The message ends as cancelled before the next one.
                deadline = time.monotonic() + 10
                while q.stats()["cancelled"] <= i:
                    if time.monotonic() > deadline:
                        sys.exit(f"m-{i} was not counted as cancelled")
                    time.sleep(0.001)
            stats = q.stats()
            if (stats["retried"], stats["died"], stats["acked"]) != (0, 0, 0):
                sys.exit(f"a cancelled message went on: {stats}")
            return latencies
    finally:
        if worker is not None:
            worker.kill()
            worker.wait()
        redis.stop()


def main() -> None:
    day = datetime.date.today().isoformat()
    lines_out = [
        f"# From cancel() to the handler seeing it, {day}",
        "",
        "Command: `python3 bench/cancel_latency.py` (a private Redis pinned to CPU 0; one Python worker "
        "process pinned to CPU 1, one handler; the cancel from another process at a random point of the "
        f"heartbeat's cycle; {SAMPLES} cancels per row; milliseconds).",
        "",
        "| handler | lease | heartbeat | median | p90 | max | min |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, lease in ROWS:
        ms = sorted(measure(kind, lease))
        print(kind, lease, [round(m, 1) for m in ms], flush=True)
        p90 = ms[int(0.9 * (len(ms) - 1))]
        lines_out.append(f"| {kind} | {lease:g} s | {lease / 3:g} s | {statistics.median(ms):,.0f} "
                         f"| {p90:,.0f} | {max(ms):,.0f} | {min(ms):,.1f} |")
    lines_out += [
        "",
        "The mark reaches a worker with its next heartbeat, every third of its lease: the wait is spread",
        "evenly over that, as the cancel falls anywhere in the cycle. A thread's handler sees it at once then;",
        "an asyncio handler's task is cancelled at the next look of its watcher (every 50 ms).",
    ]
    path = ROOT / "bench" / "results" / f"{day}-cancel-latency.md"
    path.write_text("\n".join(lines_out) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
