"""What an idle pool costs Redis, and how late it starts the messages that come now and
then: issue 29's "idle" target (at most one round trip every 5 s; lateness p99 at most
5 ms and never early).

A private Redis pinned to CPU 0; one Python worker process (`delayq worker`, default
options) on an empty queue. After it registered, `CONFIG RESETSTAT`, `--seconds` of an
empty queue, then `INFO commandstats`: the pool's script calls (each one round trip;
the commands inside a script are counted by Redis too, and listed) and its other
top-level commands. Then `--messages` pushes spread over another `--seconds`, each
due `--delay` seconds later, whose handler records when it started: the lateness of
each start after its due time.

    python3 bench/idle.py [--seconds=60] [--messages=20] [--delay=0.5] [--label=NAME]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import delayq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402
from redis_cost import commandstats  # noqa: E402

HANDLER = """
import json, time
def record(payload, message):
    with open({out!r}, "a") as f:
        f.write(json.dumps([message.id, message.due_at, time.time()]) + "\\n")
"""


def measure(seconds: float, messages: int, delay: float) -> dict[str, object]:
    redis = run.Redis()
    tmp = Path(tempfile.mkdtemp(prefix="delayq-idle-"))
    out = tmp / "started.jsonl"
    (tmp / "idle_handler.py").write_text(HANDLER.format(out=str(out)))
    env = {**os.environ, "PYTHONPATH": str(tmp)}
    pool = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-m", "delayq", "--url", redis.url, "--queue", "idle",
         "worker", "idle_handler:record"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        q = delayq.DelayQueue(redis.url, "idle")
        deadline = time.monotonic() + 10
        while not q.workers():
            if time.monotonic() > deadline:
                raise RuntimeError("the pool did not register")
            time.sleep(0.05)
        time.sleep(1.0)
        redis.cli("CONFIG", "RESETSTAT")
        started = time.monotonic()
        time.sleep(seconds)
        stats = commandstats(redis)
        elapsed = time.monotonic() - started
        started = time.monotonic()
        for i in range(messages):
            time.sleep(max(0.0, started + (i + 0.5) * seconds / messages - time.monotonic()))
            q.push({"n": i}, delay)
        time.sleep(delay + 2.0)
    finally:
        pool.send_signal(signal.SIGTERM)
        pool.wait(timeout=30)
        redis.stop()
    rows = [line for line in out.read_text().splitlines()] if out.exists() else []
    import json

    lateness_ms = [(start - due) * 1000 for _, due, start in map(json.loads, rows)]
    scripts = ("evalsha", "eval", "evalsha_ro", "eval_ro")
    # Commands a script cannot send: each is a round trip of its own.
    top_level = ("ping", "script|load", "script|exists", "client|setname", "client|setinfo", "hello", "info",
                 "subscribe", "select", "auth", "readonly")
    script_calls = sum(c for name, (c, _) in stats.items() if name in scripts)
    other = sum(c for name, (c, _) in stats.items() if name in top_level)
    return {
        "seconds": elapsed,
        "pool_script_calls": script_calls,
        "pool_other_commands": other,
        "per_5s": (script_calls + other) / elapsed * 5,
        "started": len(lateness_ms),
        "lateness_ms": sorted(lateness_ms),
        "commands": {k: v[0] for k, v in sorted(stats.items())},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--messages", type=int, default=20)
    ap.add_argument("--delay", type=float, default=0.5)
    ap.add_argument("--label", default="idle")
    args = ap.parse_args()
    r = measure(args.seconds, args.messages, args.delay)
    late = r["lateness_ms"]
    assert isinstance(late, list)
    p50 = statistics.median(late) if late else float("nan")
    p99 = late[min(len(late) - 1, int(len(late) * 0.99))] if late else float("nan")
    text = (
        f"# An idle pool: round trips and lateness ({args.label})\n\n"
        f"`python3 bench/idle.py --seconds={args.seconds:g} --messages={args.messages} --delay={args.delay:g}"
        f" --label={args.label}`, one `delayq worker` (default options) on a private Redis pinned to CPU 0.\n\n"
        f"| idle for | script calls | other top-level commands | round trips per 5 s | messages started |"
        f" lateness p50 | p99 | max | earliest |\n|---|---|---|---|---|---|---|---|---|\n"
        f"| {r['seconds']:.1f} s | {r['pool_script_calls']} | {r['pool_other_commands']} | {r['per_5s']:.2f} |"
        f" {r['started']} of {args.messages} | {p50:.2f} ms | {p99:.2f} ms | {max(late):.2f} ms | {min(late):.2f} ms |\n\n"
        f"Commands Redis counted over the idle window, those inside the scripts included: {r['commands']}\n"
    )
    run.write_results(f"-{args.label}", text)


if __name__ == "__main__":
    main()
