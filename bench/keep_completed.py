"""What keeping completed messages costs: the core's drain with keep_completed 0 (the
default: an acknowledged message is deleted at once) and 10 000.

A private redis-server pinned to CPU 0; `core/examples/drain.rs` (4 fetch threads, batch
1 000, 4 no-op Rust handlers) pinned to CPU 1 drains N already-due messages; the two
settings run in turns, RUNS times each. Reported: drain rate (median and range), the
messages kept at the end, and Redis memory with them kept (used_memory after the drain,
before the example purges, minus the empty server's). Writes
bench/results/<date>-keep-completed.md.

    python3 bench/keep_completed.py
"""

from __future__ import annotations

import datetime
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402

N = 200_000
RUNS = 5
SETTINGS = (0, 10_000)


def measure(keep: int) -> dict[str, float]:
    redis = run.Redis()
    try:
        out = subprocess.run(
            ["taskset", "-c", "1", str(ROOT / "target/release/examples/drain"), redis.url, str(N), "1", str(keep)],
            capture_output=True, text=True, check=True, timeout=600)
        result: dict[str, float] = json.loads(out.stdout)
        assert result["handled"] == N and result["left"] == 0, result
        assert result["completed"] == min(keep, N), result
        return result
    finally:
        redis.stop()


def main() -> None:
    subprocess.run(["cargo", "build", "-q", "--release", "-p", "delayq", "--example", "drain"], cwd=ROOT, check=True)
    rates: dict[int, list[float]] = {k: [] for k in SETTINGS}
    for _ in range(RUNS):
        for keep in SETTINGS:
            rates[keep].append(measure(keep)["rate"])
    memory = {}
    for keep in SETTINGS:
        # Memory with the kept messages in place: drain without the example's purge.
        redis = run.Redis()
        try:
            empty = redis.used_memory()
            import delayq

            q = delayq.DelayQueue(redis.url, "mem", keep_completed=keep)
            for start in range(0, 20_000, 1000):
                q.push_many([{"payload": {"order_id": i, "action": "close"}} for i in range(start, start + 1000)])
            worker = delayq.Worker(q, stop_when_empty=True)
            worker.run(lambda payload, msg: None)
            memory[keep] = (redis.used_memory() - empty, q.stats()["completed"])
        finally:
            redis.stop()
    day = datetime.date.today().isoformat()
    lines = [
        f"# What keep_completed costs, {day}",
        "",
        f"Command: `python3 bench/keep_completed.py` (a private Redis pinned to CPU 0; the core's drain example, "
        f"4 fetch threads, batch 1 000, 4 no-op handlers, pinned to CPU 1; {N:,} due messages; "
        f"{RUNS} runs per setting, in turns; median, the range in brackets).",
        "",
        "| keep_completed | drain rate | Redis memory after 20 000 handled | kept |",
        "|---|---|---|---|",
    ]
    for keep in SETTINGS:
        r = rates[keep]
        used, kept = memory[keep]
        lines.append(f"| {keep:,} | {statistics.median(r):,.0f} ({min(r):,.0f} .. {max(r):,.0f}) msg/s "
                     f"| {used / 1024 / 1024:.1f} MiB | {kept:,} |")
    lines += [
        "",
        "With 10 000 kept, each acknowledgement batch also writes the envelopes to the completed set and",
        "hash and trims the oldest; the memory column is what the kept messages (payloads "
        "`{\"order_id\": N, \"action\": \"close\"}`) hold.",
    ]
    path = ROOT / "bench" / "results" / f"{day}-keep-completed.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
