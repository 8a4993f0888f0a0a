"""How closely pools follow a rate limit, and what holding them back costs Redis.

A private redis-server pinned to CPU 0; N messages due at once on a queue with
`set_rate_limit(max, per)`; 4 worker processes (Python, 4 handler threads each, pinned
to CPU 1) record when each handler starts. Reported per limit: the rate achieved over
the run, the most messages handed out (claimed) in any window of `per`, from the
server's log, the most handler starts in any window of `per`, and the script calls Redis
served per second while the pools were held back. Writes
bench/results/<date>-rate-limit.md.

    python3 bench/rate_limit.py
"""

from __future__ import annotations

import bisect
import datetime
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402

# (max, per seconds, messages): each run lasts about messages / max * per seconds.
LIMITS = [(100, 1.0, 1000), (1000, 1.0, 10000), (20, 0.2, 500)]
POOLS = 4

# A worker process: runs a pool until the parent creates the stop file, then writes
# its handlers' start times.
WORKER = """
import os, sys, threading, time, delayq
url, queue, stop_file, out = sys.argv[1:5]
starts = []
worker = delayq.Worker(delayq.DelayQueue(url, queue), threads=4)
runner = threading.Thread(target=worker.run, args=(lambda payload, msg: starts.append(time.time()),))
runner.start()
while not os.path.exists(stop_file):
    time.sleep(0.05)
worker.stop()
runner.join()
with open(out, "w") as f:
    f.write("\\n".join(repr(t) for t in starts))
"""


def script_calls(redis: run.Redis) -> int:
    for line in redis.cli("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_evalsha:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def measure(limit: int, per: float, n: int) -> dict[str, float]:
    import delayq

    redis = run.Redis()
    try:
        q = delayq.DelayQueue(redis.url, "limited")
        q.set_rate_limit(limit, per)
        for start in range(0, n, 1000):
            q.push_many([{"payload": {"n": i}} for i in range(start, min(start + 1000, n))])
        redis.cli("CONFIG", "RESETSTAT")
        with tempfile.TemporaryDirectory() as tmp:
            stop_file = f"{tmp}/stop"
            procs = [
                subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", WORKER, redis.url, "limited", stop_file,
                                  f"{tmp}/starts-{i}"])
                for i in range(POOLS)
            ]
            # Plain commands, so that the count of script calls is the pools' alone. The
            # log of hand-outs keeps each entry for `per`, so reading it every 50 ms
            # gathers every one of them.
            grants: dict[str, tuple[int, int]] = {}
            deadline = time.monotonic() + 600
            while True:
                log = redis.cli("ZRANGE", "{dq:limited}:limit_log", "0", "-1", "WITHSCORES").split()
                for member, ms in zip(log[::2], log[1::2]):
                    grants[member] = (int(ms), int(member.rsplit(":", 1)[1]))
                if int(redis.cli("HGET", "{dq:limited}:stats", "acked") or 0) >= n:
                    break
                if time.monotonic() > deadline:
                    sys.exit("the pools did not finish within 600 s")
                time.sleep(0.05)
            calls = script_calls(redis)
            Path(stop_file).touch()
            for p in procs:
                p.wait(timeout=600)
                if p.returncode != 0:
                    sys.exit(f"a worker failed with status {p.returncode}")
            starts = sorted(float(t) for i in range(POOLS)
                            for t in Path(f"{tmp}/starts-{i}").read_text().split() if t)
        s = q.stats()
        if len(starts) != n or s["acked"] != n:
            sys.exit(f"{len(starts)} handler starts and {s['acked']} acks for {n} messages: the run is void")
        if sum(count for _, count in grants.values()) != n:
            sys.exit("the log of hand-outs was not read often enough: the run is void")
        span = starts[-1] - starts[0]
        busiest_starts = max(bisect.bisect_left(starts, t + per) - i for i, t in enumerate(starts))
        handed = sorted(grants.values())
        times = [ms for ms, _ in handed]
        per_ms = round(per * 1000)
        busiest_handed = max(sum(c for _, c in handed[i:bisect.bisect_left(times, ms + per_ms)])
                             for i, (ms, _) in enumerate(handed))
        return {"span": span, "rate": (n - 1) / span, "busiest_handed": busiest_handed,
                "busiest_starts": busiest_starts, "calls_per_s": calls / span}
    finally:
        redis.stop()


def main() -> None:
    rows = []
    for limit, per, n in LIMITS:
        m = measure(limit, per, n)
        print(f"{limit} per {per:g} s, {n} messages: {m}", flush=True)
        rows.append((limit, per, n, m))
    day = datetime.date.today().isoformat()
    lines = [
        f"# Rate limit, {day}",
        "",
        "Command: `python3 bench/rate_limit.py` (a private Redis pinned to CPU 0; "
        f"{POOLS} Python worker processes with 4 handler threads each, pinned to CPU 1; the messages all due "
        "at the start).",
        "",
        "| limit | messages | run (first to last start) | rate achieved | limit's rate | most handed out in any "
        "window of `per` | most handler starts in any window of `per` | script calls / s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for limit, per, n, m in rows:
        lines.append(
            f"| {limit} per {per:g} s | {n} | {m['span']:.2f} s | {m['rate']:.1f} msg/s | {limit / per:.0f} msg/s "
            f"| {m['busiest_handed']:.0f} | {m['busiest_starts']:.0f} | {m['calls_per_s']:.1f} |"
        )
    lines += [
        "",
        "\"Handed out\" comes from the server's own log of hand-outs (every entry read while it was in the",
        "window, times on the Redis clock): the limit caps these in every sliding window, and the first",
        "window's worth goes at once, so a run of N messages lasts about N / max - 1 windows. Handler starts",
        "are read on each process's clock: under a limit a pool takes one message per idle handler, so a",
        "start follows its hand-out by the claim's way back and the hand-off to a handler thread (longer",
        "while the 4 processes share one busy core), and a window of starts that catches the end of one",
        "burst and the start of the next can hold a few more than `max`. Script calls count every claim,",
        "ack and heartbeat of the 4 pools: each window that frees wakes every pool, and all but one find",
        "it taken.",
    ]
    out = ROOT / "bench" / "results" / f"{day}-rate-limit.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
