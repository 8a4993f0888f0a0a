"""Issue 29's bulk push, side by side in one run: the recipe's hand pipeline (HSET +
ZADD pairs, 50 pairs per phpredis pipeline, `uniqid` ids) against delayq's
`pushMany` (PHP) and `push_many` (Python) of 1 000 messages. Redis pinned to CPU 0,
the client to CPU 1; per run: messages a second (wall) and Redis CPU per message
(`INFO cpu`, user + sys, before and after). Three runs each (interleaved), median
and range.
With --callgrind, Redis runs under valgrind's callgrind and each run gives Redis
instructions per message instead (repeatable where CPU time is not; no rates).
With LABEL=PATH.so builds of the PHP extension, `pushMany` runs once per build (the
machine's own delayq ini left out), in the same turns: to tell a change from the hour.

    python3 bench/bulk_push.py [--n 100000] [--runs 3] [--callgrind] [--label NAME] [LABEL=PATH.so ...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from phpcli import scan_dir_without_delayq  # noqa: E402
from run import PHP_DIR, ROOT, CallgrindRedis, Redis, builds_given  # noqa: E402

PY = """
import sys, time, json, delayq
url, n, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
q = delayq.DelayQueue(url, "bench")
t0 = time.perf_counter()
for i in range(0, n, per):
    q.push_many([({"order_id": j, "action": "close"}, 60.0) for j in range(i, min(n, i + per))])
secs = time.perf_counter() - t0
print(json.dumps({"rate": n / secs, "stored": q.stats()["scheduled"]}))
"""


def redis_cpu(r: Redis) -> float:
    info = dict(line.split(":", 1) for line in r.cli("INFO", "cpu").splitlines() if ":" in line)
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def once(system: str, n: int, callgrind: bool = False, build: dict[str, str] | None = None) -> tuple[float, float]:
    """One run; `build` (a PHP extension's path and a PHP scan directory without the
    machine's own delayq) for a given build's `pushMany`."""
    r = CallgrindRedis() if callgrind else Redis()
    try:
        env = None
        if system == "python":
            cmd = ["taskset", "-c", "1", sys.executable, "-c", PY, r.url, str(n), "1000"]
        else:
            php_system = "seed" if system == "seed" else "delayq"
            extension = ["-d", f"extension={build['path']}"] if build else []
            cmd = ["taskset", "-c", "1", "php", *extension, str(PHP_DIR / "bulk_push.php"), f"--system={php_system}",
                   f"--n={n}", "--batch=1000", "--pipeline=50", f"--url={r.url}"]
            if build:
                env = {**os.environ, "PHP_INI_SCAN_DIR": build["scan_dir"]}
        if isinstance(r, CallgrindRedis):
            r.instructions()
        before = redis_cpu(r)
        out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True,
                                        env=env).stdout.splitlines()[-1])
        used = redis_cpu(r) - before
        assert int(out["stored"]) == n, out
        if isinstance(r, CallgrindRedis):
            return float("nan"), r.instructions() / n
        return float(out["rate"]), used / n * 1e6
    finally:
        r.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=None, help="messages a run (100000; 20000 with --callgrind)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--callgrind", action="store_true", help="count Redis instructions under valgrind")
    p.add_argument("--label", default="bulk-push", help="names the results file")
    p.add_argument("builds", nargs="*", help="LABEL=PATH of a delayq.so: pushMany once per build")
    args = p.parse_args()
    n = args.n or (20_000 if args.callgrind else 100_000)
    builds = builds_given(p, args.builds)
    scan_dir = tempfile.TemporaryDirectory()
    given = {f"php {label}": {"path": path, "scan_dir": str(scan_dir_without_delayq(Path(scan_dir.name) / "conf.d"))}
             for label, path in builds.items()}
    # Interleaved, one run of each system in turn: this machine's speed drifts by a
    # third from minute to minute, which would otherwise fall on one system's runs.
    systems = ["seed", *(given or ["delayq"]), "python"]
    rows: dict[str, list[tuple[float, float]]] = {system: [] for system in systems}
    for _ in range(args.runs):
        for system, runs in rows.items():
            runs.append(once(system, n, args.callgrind, given.get(system)))
            print(system, f"{runs[-1][0]:,.0f} msg/s {runs[-1][1]:,.2f}", flush=True)
    redis_version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    flags = f"--n {n} --runs {args.runs}" + (" --callgrind" if args.callgrind else "")
    given_flags = "".join(f" {label}=PATH" for label in builds)
    lines = [
        f"# Bulk push, {datetime.date.today()} ({redis_version}, {n} messages a run, {args.runs} runs)",
        "",
        f"Command: `python3 bench/bulk_push.py {flags} --label {args.label}{given_flags}` "
        "(Redis on CPU 0, the client on CPU 1).",
        "",
    ]
    label = {"seed": "recipe: phpredis pipeline of 50 HSET + ZADD pairs, uniqid ids",
             "delayq": "delayq PHP `pushMany` of 1 000", "python": "delayq Python `push_many` of 1 000",
             **{system: f"delayq PHP `pushMany` of 1 000, build {system[4:]}" for system in given}}
    if args.callgrind:
        seed = statistics.median(c for _, c in rows["seed"])
        lines += ["| client | Redis instructions per message (median) | range | vs recipe |", "|---|---|---|---|"]
        for system, runs in rows.items():
            cost = [c for _, c in runs]
            lines.append(f"| {label[system]} | {statistics.median(cost):,.0f} | {min(cost):,.0f} .. {max(cost):,.0f} "
                         f"| {statistics.median(cost) / seed:.2f}x |")
    else:
        # Each run against the recipe's run next to it, then the median of those ratios.
        lines += ["| client | msg/s (median) | range | vs recipe (median of runs side by side) | "
                  "Redis CPU per message |", "|---|---|---|---|---|"]
        for system, runs in rows.items():
            rates = [r for r, _ in runs]
            ratio = statistics.median(r / s for (r, _), (s, _) in zip(runs, rows["seed"]))
            cpu = statistics.median(c for _, c in runs)
            lines.append(f"| {label[system]} | {statistics.median(rates):,.0f} | {min(rates):,.0f} .. "
                         f"{max(rates):,.0f} | {ratio:.2f}x | {cpu:.2f} µs |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = ROOT / "bench" / "results" / f"{datetime.date.today()}-{args.label}.md"
    out.write_text(text)


if __name__ == "__main__":
    main()
