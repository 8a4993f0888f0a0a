"""What `delayq worker --processes N` buys a Python handler that needs the CPU.

A private redis-server; MESSAGES messages due at once; `delayq worker
tasks:handle --stop-when-empty` with a handler that spins 0.5 ms of pure-Python work,
run with 1, 2 and 4 processes, in turns, RUNS times each. Reported: the wall time of
the whole command (interpreter start-ups included) and messages per second over it.
The machine's core count bounds what more processes can give, and Redis shares them.
Writes bench/results/<date>-python-processes.md.

    python3 bench/python_processes.py
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402

MESSAGES = 20000
RUNS = 3
PROCESSES = (1, 2, 4)
HANDLER_MS = 0.5

TASKS = f"""
import time

def handle(payload, msg):
    # CPU work under the GIL, as parsing, templating or image code does.
    end = time.perf_counter() + {HANDLER_MS / 1000}
    while time.perf_counter() < end:
        pass
"""


def measure(processes: int) -> dict[str, float]:
    import delayq

    redis = run.Redis()
    try:
        queue = delayq.DelayQueue(redis.url, "cpu")
        for start in range(0, MESSAGES, 1000):
            queue.push_many([{"payload": {"n": i}} for i in range(start, min(start + 1000, MESSAGES))])
        with tempfile.TemporaryDirectory() as tmp:
            Path(tmp, "tasks.py").write_text(TASKS)
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "delayq", "--url", redis.url, "--queue", "cpu", "--json", "worker",
                 "tasks:handle", "--processes", str(processes), "--stop-when-empty"],
                cwd=tmp, capture_output=True, text=True, timeout=600, check=False)
            seconds = time.monotonic() - started
        if done.returncode != 0:
            sys.exit(f"the worker failed with status {done.returncode}: {done.stderr}")
        summary = json.loads(done.stdout)
        stats = queue.stats()
        if summary["acked"] != MESSAGES or stats["acked"] != MESSAGES:
            sys.exit(f"{summary['acked']} acknowledged of {MESSAGES}: the run is void")
        return {"seconds": seconds, "rate": MESSAGES / seconds}
    finally:
        redis.stop()


def main() -> None:
    results = run.in_turns(PROCESSES, measure, RUNS, lambda processes: f"{processes} processes")
    day = datetime.date.today().isoformat()

    base = statistics.median(m["rate"] for m in results[PROCESSES[0]])
    lines = [
        f"# Python worker processes on a CPU-bound handler, {day}",
        "",
        f"Command: `python3 bench/python_processes.py` ({os.cpu_count()} cores; a private Redis; {MESSAGES} "
        f"messages due at once; `delayq worker tasks:handle --processes N --stop-when-empty` with a handler "
        f"that spins {HANDLER_MS} ms of pure-Python work; {RUNS} runs per N, in turns; medians, the range in "
        "brackets; wall time of the whole command, interpreter start-ups included).",
        "",
        "| processes | wall time | messages/s | vs 1 process |",
        "|---|---|---|---|",
    ]
    for processes, ms in results.items():
        rate = statistics.median(m["rate"] for m in ms)
        lines.append(f"| {processes} | {run.cell([m['seconds'] for m in ms], '.2f')} s "
                     f"| {run.cell([m['rate'] for m in ms], ',.0f')} | {rate / base:.2f}x |")
    lines += [
        "",
        "One process runs one plain-function handler at a time (the GIL), so a CPU-bound handler",
        "tops out at 1 / (handler time + per-message overhead) per process; more processes add",
        "cores until the machine (and Redis, on the same cores here) has none left.",
    ]
    out = ROOT / "bench" / "results" / f"{day}-python-processes.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
