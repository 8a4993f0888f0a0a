"""`make bench`'s W1 push (PHP, one `push` a message) with two or more builds of the
extension, in turns with the recipe's producer, two yardsticks from phpredis (one ZADD a
call: what any PHP producer pays for a round trip; one script a call that only ZADDs,
with push.lua's 6 keys: what a push that is one script pays at least) and
`redis-benchmark -c 1 -t zadd` (issue 29's yardstick for a push per call), so that every build sees the machine in the same
moods: to tell a change to the push from the machine's hour. Each build is a delayq.so
given by path, built from the commit its label names; this machine's own delayq ini is
left out of its PHP runs. Each client's ratio to `redis-benchmark` is taken round by
round, then the median of those. `redis-benchmark -t zadd` sets one member again and
again where the PHP clients add N; the two ZADD rates match all the same.

A label that ends in `+functions` runs its build with delayq's library of functions
installed (`installFunctions()` before the run: its pushes go as FCALL); every other
run has none.

With --unpinned, Redis and every client may run on either CPU (the rate users see on a
machine whose Redis shares its cores; it swings more between hours).

    python3 bench/php_push_rate_ab.py [--n=20000] [--rounds=5] [--unpinned] [--label=NAME] LABEL=PATH.so ...
"""

from __future__ import annotations

import argparse
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
from bulk_push import redis_cpu  # noqa: E402
from php_drain_ab import ini_dir_without_delayq  # noqa: E402

PUSH = str(ROOT / "bench" / "php" / "push.php")


def versions(env: dict[str, str]) -> str:
    """PHP's and phpredis's versions, as the runs' PHP reports them."""
    code = 'echo PHP_VERSION, " ", phpversion("redis") ?: "none";'
    php, phpredis = subprocess.run(["php", "-r", code], capture_output=True, text=True, env=env,
                                   check=True).stdout.split()
    return f"PHP {php}, phpredis {phpredis}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("builds", nargs="+", help="LABEL=PATH of a delayq.so")
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--unpinned", action="store_true", help="Redis and clients on either CPU")
    parser.add_argument("--label", default="php-push-rate-ab", help="results file: bench/results/<date>-<label>.md")
    opts = parser.parse_args()
    builds = dict(b.split("=", 1) for b in opts.builds)
    for label, path in builds.items():
        if not Path(path).is_file():
            parser.error(f"{label}: no file {path}")
    rates: dict[str, list[float]] = {label: [] for label in [*builds, "recipe", "phpredis", "script", "zadd"]}
    ini = tempfile.TemporaryDirectory()
    env = {**os.environ, "PHP_INI_SCAN_DIR": str(ini_dir_without_delayq(Path(ini.name)))}
    env.pop("DELAYQ_EXTENSION", None)
    # Before the runs: the ini copy is gone after them.
    php_versions = versions(env)
    redis = run.Redis()
    cpus = "0,1" if opts.unpinned else "1"
    if opts.unpinned:
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(redis.proc.pid)], capture_output=True, check=True)

    cpu: dict[str, list[float]] = {label: [] for label in rates}

    def push(label: str, system: str, *php_args: str) -> None:
        """One run of `system`, recorded under `label`: its rate and Redis's CPU a message."""
        redis.cli("FLUSHALL")
        redis.cli("FUNCTION", "FLUSH")
        if label.endswith("+functions"):
            subprocess.run(["php", *php_args, "-r", f"(new DelayQueue('{redis.url}', 'f'))->installFunctions();"],
                           env=env, check=True)
        before = redis_cpu(redis)
        out = subprocess.run(["taskset", "-c", cpus, "php", *php_args, PUSH, f"--system={system}", "--mode=single",
                              f"--n={opts.n}", f"--url={redis.url}"], capture_output=True, text=True, env=env,
                             check=True).stdout
        result = json.loads(out)
        if result["stored"] != opts.n:
            sys.exit(f"{system} {php_args}: {result['stored']} of {opts.n} stored: the run is void")
        cpu[label].append((redis_cpu(redis) - before) / opts.n * 1e6)
        rates[label].append(float(result["rate"]))

    try:
        for _ in range(opts.rounds):
            for label, path in builds.items():
                push(label, "delayq", "-d", f"extension={path}")
            push("recipe", "seed")
            push("phpredis", "zadd")
            push("script", "script")
            rates["zadd"].append(run.benchmark_rate(redis.port, "zadd", opts.n, cpus=cpus))
            print({k: round(v[-1]) for k, v in rates.items()}, flush=True)
    finally:
        redis.stop()
        ini.cleanup()
    names = {**{label: f"delayq `push`, {label}" for label in builds},
             "recipe": "the recipe (phpredis HSET + ZADD)",
             "phpredis": "phpredis ZADD alone, no payload (a yardstick)",
             "script": "phpredis EVALSHA of a script that only ZADDs, 6 keys (a yardstick)", "zadd": "`redis-benchmark -c 1 -t zadd`"}
    lines = [
        f"# A push per call from PHP, builds side by side, {time.strftime('%Y-%m-%d %H:%M')} UTC",
        "",
        f"Redis {run.server_version()}, {php_versions}.",
        "",
        f"Command: `python3 bench/php_push_rate_ab.py --n={opts.n} --rounds={opts.rounds}"
        + (" --unpinned" if opts.unpinned else "") + f" --label={opts.label} "
        + " ".join(f"{label}=<{Path(path).name}>" for label, path in builds.items())
        + ("` (a private Redis and every client on either CPU" if opts.unpinned
           else "` (a private Redis pinned to CPU 0, every client pinned to CPU 1")
        + ", in turns; median of the rounds, range in brackets).",
        "",
        "| client | per second | range | vs `redis-benchmark` ZADD (median of the rounds' ratios) | range "
        "| Redis CPU µs a message (median) |",
        "|---|---|---|---|---|---|",
    ]
    for key, values in rates.items():
        ratios = [v / z for v, z in zip(values, rates["zadd"])]
        used = f"{statistics.median(cpu[key]):.1f}" if cpu[key] else ""
        lines.append(f"| {names[key]} | {statistics.median(values):,.0f} | {min(values):,.0f} .. {max(values):,.0f} "
                     f"| {statistics.median(ratios):.2f}x | {min(ratios):.2f}x .. {max(ratios):.2f}x | {used} |")
    run.write_results(f"-{opts.label}", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
