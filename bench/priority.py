"""How long an urgent message waits behind a backlog: one queue, or two in priority order.

A private redis-server pinned to CPU 0; BULK messages due at once on queue "bulk"; one
Python worker process (one handler, each call 0.2 ms of work) pinned to CPU 1. Once the
worker has handled WARMUP bulk messages, an urgent message is pushed every 50 ms,
URGENT in all: in the "one queue" run onto "bulk" itself (where it waits behind the
backlog, as in the recipe's single ZSET), in the "lower_queues" run onto queue
"urgent", which the worker consumes first (`Worker(urgent, lower_queues=[bulk])`).
Reported per run: how late each urgent message started after its due time (median and
max, on the worker's clock against the due time the message carries), and the bulk
drain rate. Writes bench/results/<date>-priority.md.

    python3 bench/priority.py
"""

from __future__ import annotations

import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402

BULK = 30000
WARMUP = 2000
URGENT = 20
RUNS = 3

# The worker: consumes until every urgent message ran, then writes how late each
# started and when the bulk messages started and ended.
WORKER = """
import json, sys, time, delayq
url, mode, bulk_n, urgent_n, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
bulk = delayq.DelayQueue(url, "bulk")
urgent = delayq.DelayQueue(url, "urgent")
if mode == "lower_queues":
    worker = delayq.Worker(urgent, lower_queues=[bulk])
else:
    worker = delayq.Worker(bulk)
late, bulk_times = [], []
def handle(payload, msg):
    now = time.time()
    if payload.get("urgent"):
        late.append(now - msg.due_at)
    else:
        bulk_times.append(now)
    t = time.perf_counter() + 0.0002
    while time.perf_counter() < t:
        pass
    if len(bulk_times) == bulk_n and len(late) == urgent_n:
        worker.stop()
worker.run(handle)
with open(out, "w") as f:
    json.dump({"late": late, "bulk_first": bulk_times[0], "bulk_last": bulk_times[-1], "bulk": len(bulk_times)}, f)
"""


def measure(mode: str) -> dict[str, float]:
    import delayq

    redis = run.Redis()
    try:
        bulk = delayq.DelayQueue(redis.url, "bulk")
        target = bulk if mode == "one queue" else delayq.DelayQueue(redis.url, "urgent")
        for start in range(0, BULK, 1000):
            bulk.push_many([{"payload": {"n": i}} for i in range(start, min(start + 1000, BULK))])
        with tempfile.TemporaryDirectory() as tmp:
            out = f"{tmp}/out.json"
            proc = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", WORKER, redis.url,
                                     mode.replace(" ", "_"), str(BULK), str(URGENT), out])
            try:
                deadline = time.monotonic() + 300
                while bulk.stats()["acked"] < WARMUP:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        sys.exit("the worker did not start draining")
                    time.sleep(0.01)
                for i in range(URGENT):
                    target.push({"urgent": True, "i": i})
                    time.sleep(0.05)
                if proc.wait(timeout=300) != 0:
                    sys.exit(f"the worker failed with status {proc.returncode}")
            finally:
                proc.kill()
            got = json.loads(Path(out).read_text())
        if len(got["late"]) != URGENT or got["bulk"] != BULK:
            sys.exit(f"{len(got['late'])} urgent and {got['bulk']} bulk handled: the run is void")
        late_ms = [s * 1000 for s in got["late"]]
        return {"late_median_ms": statistics.median(late_ms), "late_max_ms": max(late_ms),
                "bulk_rate": (BULK - 1) / (got["bulk_last"] - got["bulk_first"])}
    finally:
        redis.stop()


def main() -> None:
    results = run.in_turns(["one queue", "lower_queues"], measure, RUNS)
    day = datetime.date.today().isoformat()
    lines = [
        f"# An urgent message behind a backlog, {day}",
        "",
        "Command: `python3 bench/priority.py` (a private Redis pinned to CPU 0; one Python worker process "
        f"with one handler of 0.2 ms, pinned to CPU 1; {BULK} bulk messages due at once; after {WARMUP} of "
        f"them ran, {URGENT} urgent messages pushed 50 ms apart; {RUNS} runs per mode, in turns; medians of "
        "the runs, the range in brackets).",
        "",
        "| mode | urgent start, median | urgent start, max | bulk drain rate |",
        "|---|---|---|---|",
    ]

    for mode, ms in results.items():
        lines.append(
            f"| {mode} | {run.cell([m['late_median_ms'] for m in ms], '.1f')} ms "
            f"| {run.cell([m['late_max_ms'] for m in ms], '.1f')} ms "
            f"| {run.cell([m['bulk_rate'] for m in ms], ',.0f')} msg/s |"
        )
    lines += [
        "",
        "\"one queue\": the urgent messages go onto the bulk queue, as with one ZSET in the recipe: each",
        "waits until the backlog due before it ran. \"lower_queues\": they go onto their own queue, which",
        "the worker consumes first (`delayq.Worker(urgent, lower_queues=[bulk])`): each waits for its own",
        "claim and the handler call under way, not for the bulk messages the worker had prefetched (the",
        "handler takes the highest queue's waiting delivery, and while that queue's claim is under way the",
        "prefetched bulk ones wait for it). The bulk rate shows what the second pool costs the drain.",
    ]
    out = ROOT / "bench" / "results" / f"{day}-priority.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
