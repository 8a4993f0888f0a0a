"""Issue 54's targets 1 and 3 in one run: Redis's own time per push (`INFO
commandstats`, the usec of every command a push sends, summed and divided by the
pushes) for the recipe's producer (HSET + ZADD), the plain one-script push of issue 54
and delayq's push with each option, from Python, one message a call; then Redis bytes
per waiting message (`used_memory` after `MEMORY PURGE`, over an empty server's) for
the recipe and delayq's `push` and `push_many`, with the issue's payload and a 1 KB one.
A private Redis pinned to CPU 0 per row (bench/run.py), the client on CPU 1.

    taskset -c 1 python3 bench/push_server_time.py [--n=20000] [--rounds=3] [--memory-n=100000] [--label=NAME]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import redis as redis_py

import delayq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402
from push_call_cost import PLAIN  # noqa: E402

PAYLOAD = {"order_id": 123456, "action": "close"}
KB_PAYLOAD = {"order_id": 123456, "action": "close", "note": "x" * 1000}


def uniqid() -> str:
    """PHP's uniqid('msg_', true), as the recipe's producer makes its ids: "%s%08x%05x"
    and lcg_value() * 10 as "%.8F", 27 characters."""
    t = time.time()
    lcg = int.from_bytes(os.urandom(4), "big") / 2**32 * 10
    return "msg_%08x%05x%.8f" % (int(t), int((t - int(t)) * 1_000_000), lcg)


def fill_recipe(r: redis_py.Redis, n: int, payload: dict[str, object]) -> str:
    """n messages as the recipe's producer stores them (HSET + ZADD, whole-second
    scores, an hour ahead), pipelined; an id it made, for the report."""
    import json
    body = json.dumps(payload)
    pipe = r.pipeline(transaction=False)
    mid = ""
    for i in range(n):
        mid = uniqid()
        pipe.hset("delay:payloads", mid, body)
        pipe.zadd("delay:queue", {mid: int(time.time()) + 3600})
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()
    return mid


def server_usec(r: redis_py.Redis) -> float:
    stats = r.info("commandstats")
    return sum(v["usec"] for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_config"))


def recipe(r: redis_py.Redis, url: str) -> Callable[[int], None]:
    import json

    def push(i: int) -> None:
        mid = uniqid()
        r.hset("delay:payloads", mid, json.dumps(PAYLOAD))
        r.zadd("delay:queue", {mid: int(time.time()) + 60})
    return push


def plain(r: redis_py.Redis, url: str) -> Callable[[int], None]:
    import json
    import uuid
    sha = r.script_load(PLAIN)
    keys = ["{dq:b}:messages", "{dq:b}:scheduled", "{dq:b}:stats", "{dq:b}:wake"]

    def push(i: int) -> None:
        r.evalsha(sha, 4, *keys, str(uuid.uuid4()), 60000, json.dumps(PAYLOAD))
    return push


def plain_function(r: redis_py.Redis, url: str) -> Callable[[int], None]:
    import json
    import uuid
    r.function_load("#!lua name=plain\nredis.register_function('dq_plain', function(KEYS, ARGV)\n" + PLAIN + "end)\n")
    keys = ["{dq:b}:messages", "{dq:b}:scheduled", "{dq:b}:stats", "{dq:b}:wake"]

    def push(i: int) -> None:
        r.fcall("dq_plain", 4, *keys, str(uuid.uuid4()), 60000, json.dumps(PAYLOAD))
    return push


def delayq_push(**options: object) -> Callable[[redis_py.Redis, str], Callable[[int], None]]:
    def make(r: redis_py.Redis, url: str) -> Callable[[int], None]:
        # A copy: each round makes its row again.
        extra_options = dict(options)
        partitions = int(extra_options.pop("partitions", 1))  # type: ignore[call-overload]
        at = bool(extra_options.pop("at", False))
        if extra_options.pop("functions", False):
            # As `delayq install-functions` does; the queue made after it calls them.
            delayq.DelayQueue(url, "b").install_functions()
        q = delayq.DelayQueue(url, "b", partitions=partitions)

        def push(i: int) -> None:
            extra = {k: (v(i) if callable(v) else v) for k, v in extra_options.items()}
            if at:
                q.push_at(PAYLOAD, time.time() + 60, **extra)
            else:
                q.push(PAYLOAD, 60, **extra)
        return push
    return make


ROWS: dict[str, Callable[[redis_py.Redis, str], Callable[[int], None]]] = {
    "the recipe's producer: HSET + ZADD, uniqid ids": recipe,
    "the plain script of issue 54": plain,
    "delayq `push` (delay, generated id)": delayq_push(),
    "delayq `push_at`": delayq_push(at=True),
    "delayq `push`, a chosen id": delayq_push(id=lambda i: f"order-{i}"),
    "delayq `push`, `replace`": delayq_push(id=lambda i: f"order-{i}", replace=True),
    "delayq `push`, a serial key": delayq_push(serial_key=lambda i: f"customer-{i % 100}"),
    "delayq `push`, 4 partitions": delayq_push(partitions=4),
    "the plain script of issue 54, as a function (FCALL)": plain_function,
    "delayq `push`, functions installed (FCALL)": delayq_push(functions=True),
    "delayq `push_at`, functions installed": delayq_push(at=True, functions=True),
    "delayq `push`, a chosen id, functions installed": delayq_push(id=lambda i: f"order-{i}", functions=True),
    "delayq `push`, `replace`, functions installed": delayq_push(id=lambda i: f"order-{i}", replace=True,
                                                                 functions=True),
    "delayq `push`, a serial key, functions installed": delayq_push(serial_key=lambda i: f"customer-{i % 100}",
                                                                    functions=True),
    "delayq `push`, 4 partitions, functions installed": delayq_push(partitions=4, functions=True),
}


def memory(n: int, payload: dict[str, object], how: str) -> float:
    server = run.Redis()
    try:
        r = redis_py.Redis(port=server.port)
        r.memory_purge()
        empty = int(r.info("memory")["used_memory"])
        if how == "recipe":
            fill_recipe(r, n, payload)
        else:
            q = delayq.DelayQueue(server.url, "b")
            if how == "push":
                for _ in range(n):
                    q.push(payload, 3600)
            else:
                for start in range(0, n, 1000):
                    q.push_many([(payload, 3600)] * min(1000, n - start))
        r.memory_purge()
        return (int(r.info("memory")["used_memory"]) - empty) / n
    finally:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--memory-n", type=int, default=100000)
    p.add_argument("--label", default="push-server-time")
    args = p.parse_args()
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, make in ROWS.items():
            server = run.Redis()
            try:
                r = redis_py.Redis(port=server.port)
                push = make(r, server.url)
                push(0)
                r.config_resetstat()
                for i in range(1, args.n + 1):
                    push(i)
                times.setdefault(name, []).append(server_usec(r) / args.n)
            finally:
                server.stop()
            print(name, round(times[name][-1], 2), flush=True)
    plain_us = statistics.median(times["the plain script of issue 54"])
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    lines = [
        f"# Redis time and memory of a push, {datetime.date.today()} ({version})",
        "",
        f"Command: `taskset -c 1 python3 bench/push_server_time.py --n={args.n} --rounds={args.rounds} "
        f"--memory-n={args.memory_n} --label={args.label}` (Python client; a private Redis pinned to CPU 0 "
        "per row; Redis time is the `usec` of every command in `INFO commandstats` over the pushes).",
        "",
        "| push, one message a call | Redis µs a push (median) | range | / the plain script |",
        "|---|---|---|---|",
    ]
    for name, values in times.items():
        med = statistics.median(values)
        lines.append(f"| {name} | {med:.2f} | {min(values):.2f} .. {max(values):.2f} | {med / plain_us:.2f}x |")
    lines += ["", f"Redis bytes per waiting message, {args.memory_n} messages:", "",
              "| payload | the recipe | delayq `push` | delayq `push_many` | push / recipe |", "|---|---|---|---|---|"]
    for label, payload in (("{order_id, action} (36 bytes)", PAYLOAD), ("1 KB", KB_PAYLOAD)):
        rec = memory(args.memory_n, payload, "recipe")
        one = memory(args.memory_n, payload, "push")
        many = memory(args.memory_n, payload, "push_many")
        lines.append(f"| {label} | {rec:.0f} | {one:.0f} | {many:.0f} | {one / rec:.2f}x |")
        print(lines[-1], flush=True)
    run.write_results(f"-{args.label}", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
