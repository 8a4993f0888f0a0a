"""Where Redis spends its time in a drain: delayq's scripts against the seed recipe's
pop, split into the Redis commands the scripts run and the Lua around them. Both
drains are Redis-bound on this machine (Redis's CPU time equals the wall time), so
this is what decides their throughput.

A private redis-server pinned to CPU 0, the benchmark's own consumers (4 processes,
pinned to CPU 1): bench/php/consume.php for the recipe, the delayq PHP extension for
delayq. After the fill, `CONFIG RESETSTAT`; after the drain, `INFO commandstats`,
which counts the commands a script runs under their own names. Writes
bench/results/<date>-redis-cost.md.

    python3 bench/redis_cost.py [--n=200000]
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402

SCRIPT_CALLS = ("eval", "evalsha")


def commandstats(redis: run.Redis) -> dict[str, tuple[int, int]]:
    """command -> (calls, microseconds)."""
    out = {}
    for line in redis.cli("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            name, _, fields = line.removeprefix("cmdstat_").partition(":")
            f = dict(kv.split("=") for kv in fields.split(","))
            out[name] = (int(f["calls"]), int(f["usec"]))
    return out


def measure(system: str, n: int) -> dict[str, tuple[int, int]]:
    redis = run.Redis()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run.fill(system, f"--n={n}", f"--url={redis.url}", f"--due-file={tmp}/due")
            redis.cli("CONFIG", "RESETSTAT")
            records = Path(tmp) / "records"
            records.mkdir()
            proc = run.consume(redis, system, records)
            proc.wait(timeout=600)
            stats = commandstats(redis)
            lost, dups = run.verify(run.read_records(records), n)
            if lost or dups:
                sys.exit(f"{system}: {lost} lost, {dups} duplicated: the run is void")
            return stats
    finally:
        redis.stop()


def report(results: dict[str, dict[str, tuple[int, int]]], n: int) -> str:
    lines = [
        f"# Redis time per drained message, {datetime.date.today().isoformat()}",
        "",
        f"Command: `python3 bench/redis_cost.py --n={n}` (a private Redis pinned to CPU 0; 4",
        "consumer processes pinned to CPU 1; microseconds of Redis time per message, from",
        "`INFO commandstats`).",
        "",
        "| system | script calls | in scripts | in Redis commands | in Lua | commands |",
        "|---|---|---|---|---|---|",
    ]
    for system, stats in results.items():
        scripts = [stats[c] for c in SCRIPT_CALLS if c in stats]
        calls, total = sum(c for c, _ in scripts), sum(u for _, u in scripts)
        # The consumers' own idle checks and stats calls are a few hundred commands: too
        # few to show next to the per-message ones.
        commands = {k: u for k, (_, u) in stats.items() if k not in SCRIPT_CALLS and not k.startswith("config")}
        inner = sum(commands.values())
        top = ", ".join(f"{k.upper()} {u / n:.2f}" for k, u in sorted(commands.items(), key=lambda kv: -kv[1])
                        if u / n >= 0.01)
        lines.append(f"| {system} | {calls} | {total / n:.2f} | {inner / n:.2f} | {(total - inner) / n:.2f} | {top} |")
    lines += [
        "",
        "\"in Lua\" is script time outside the commands the script runs: the conversion of",
        "arguments and replies between Redis and Lua and the script's own per-message work.",
        "The recipe's pop calls ZREM, HGET and HDEL once per message; delayq's claim and ack",
        "call each command once per batch of up to 1000 with every message as an argument.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200000)
    opts = parser.parse_args()
    results = {label: measure(system, opts.n) for label, system in (("seed recipe", "seed"), ("delayq (PHP)", "delayq"))}
    run.write_results("-redis-cost", report(results, opts.n))


if __name__ == "__main__":
    main()
