"""Groups under load (PushOptions::group, Queue::set_group_limit): what the claim's gate
costs Redis with many groups, and how long small groups wait behind a big one.

The core alone (core/examples/groups.rs), pinned to CPU 1; a private redis-server per
run, pinned to CPU 0. Two parts, each run `--rounds` times with its rows in turns:

- wide: 10 000 groups, 100 of them with a backlog: 100 blocks of 1 000 due messages of
  one group, each block followed by 99 groups of one due message (109 900 messages, all
  due); against the same messages without groups, and with a default concurrency limit
  of `--limit` per group. A pool of 4 fetch threads (batch 1 000) and 4 handler threads,
  a no-op handler, drains the queue. After the fill, `CONFIG RESETSTAT`: Redis time a
  claimed message in scripts (`INFO commandstats`, EVALSHA and FCALL), and the drain
  rate (to the last handled message). Then the same run again with every command in
  the slow log (slowlog-log-slower-than 0, which logs the commands scripts run too and
  so slows Redis outside the commands it times): the claim script's share of that time.
- fair: one group of 100 000 due messages pushed first, then 99 groups of 10 (pushed
  in turns); a pool of 8 handler threads (default fetch threads and batch), each
  handler sleeping 1 ms; with a default concurrency limit of `--limit` per group and
  without. The pool stops once every small group's messages ran. Reported: when each
  small group's last message started, from the pool's start (median and max over the
  99 groups), and how many of the big group's started before the last of them did.

Writes bench/results/<date>-groups.md (`--label` adds to the name).

    python3 bench/groups.py [--rounds=3] [--limit=4] [--only=wide,fair] [--label=NAME]
        [--examples=DIR]  (default $CARGO_TARGET_DIR/release/examples, else target/...)
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import redis as redis_py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402
from redis_cost import commandstats  # noqa: E402

SCRIPT_CALLS = ("eval", "evalsha", "fcall", "eval_ro", "evalsha_ro", "fcall_ro")
# Entries the slow log keeps: a run with it on must not fill it.
SLOWLOG_MAX = 4_000_000


def examples_dir(given: str | None) -> Path:
    if given:
        return Path(given)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "release" / "examples"


def claim_sha(examples: Path) -> str:
    """The EVALSHA hash of this build's claim script."""
    out = subprocess.run([str(examples / "scripts")], capture_output=True, text=True, check=True).stdout
    return hashlib.sha1(json.loads(out)["claim"]["lua"].encode()).hexdigest()


class Run:
    """One run of the example on a fresh Redis: fill, reset the statistics, drain."""

    def __init__(self, examples: Path, scenario: str, limit: int, logged: bool = False) -> None:
        self.logged = logged
        self.redis = run.Redis("--slowlog-log-slower-than", "-1", "--slowlog-max-len", str(SLOWLOG_MAX))
        self.proc = subprocess.Popen(
            ["taskset", "-c", "1", str(examples / "groups"), self.redis.url, scenario, str(limit)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        text = self.proc.stdout.readline()
        if not text:
            sys.exit(f"the example ended early with status {self.proc.wait()}")
        return dict(json.loads(text))

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def drain(self) -> tuple[int, dict[str, Any]]:
        n = int(self.line()["filled"])
        self.redis.cli("CONFIG", "RESETSTAT")
        if self.logged:
            self.redis.cli("SLOWLOG", "RESET")
            self.redis.cli("CONFIG", "SET", "slowlog-log-slower-than", "0")
        self.go()
        return n, self.line()

    def check(self, n: int, acked: int) -> None:
        self.go()
        left = self.line()
        self.proc.wait(timeout=60)
        # A stopped pool releases what it held unstarted: delivered, not acknowledged.
        if left["left"] != n - acked or (acked == n and left["delivered"] != n):
            sys.exit(f"{left} after {acked} of {n} acknowledged: the run is void")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.redis.stop()


def measure_wide(examples: Path, sha: str, variant: tuple[str, int]) -> dict[str, float]:
    """Two runs: the rate and the script time with the slow log off, the claim's share
    with it on (it logs the commands scripts run too, which costs Redis time outside
    the commands: it would slow the drain)."""
    scenario, limit = variant
    out: dict[str, float] = {}
    for logged in (False, True):
        r = Run(examples, scenario, limit, logged)
        try:
            n, got = r.drain()
            r.redis.cli("CONFIG", "SET", "slowlog-log-slower-than", "-1")
            stats = commandstats(r.redis)
            log = redis_py.Redis(port=r.redis.port).execute_command("SLOWLOG", "GET", "-1") if logged else []
            r.check(n, int(got["acked"]))
            if got["acked"] != n:
                sys.exit(f"{variant}: {got['acked']} of {n} acknowledged: the run is void")
        finally:
            r.stop()
        script_us = sum(stats[c][1] for c in SCRIPT_CALLS if c in stats)
        if not logged:
            out.update(rate=float(got["rate"]), scripts_us=script_us / n, hmget_us=stats.get("hmget", (0, 0))[1] / n)
            continue
        if len(log) >= SLOWLOG_MAX:
            sys.exit(f"{variant}: the slow log is full: the run is void")
        claims = [int(e[2]) for e in log if e[3][0].lower() == b"evalsha" and e[3][1].decode() == sha]
        out.update(claim_us=sum(claims) / n, claims=len(claims), logged_scripts_us=script_us / n)
    return out


def measure_fair(examples: Path, limit: int) -> dict[str, float]:
    r = Run(examples, "fair", limit)
    try:
        n, got = r.drain()
        r.check(n, int(got["acked"]))
    finally:
        r.stop()
    small = [ms for group, ms in got["last_start_ms"].items() if group != "big"]
    if len(small) != 99:
        sys.exit(f"fair: {len(small)} small groups ran: the run is void")
    through = max(small)
    big_before = sum(1 for ms in got["big_starts_ms"] if ms < through)
    return {"median_ms": statistics.median(small), "max_ms": through, "big_before": big_before}


def wide_name(variant: tuple[str, int]) -> str:
    scenario, limit = variant
    if scenario == "plain":
        return "no groups"
    return "10 000 groups" + (f", default concurrency limit {limit}" if limit else ", no limit")


def fair_name(limit: int) -> str:
    return f"default concurrency limit {limit}" if limit else "no limit"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=4)
    parser.add_argument("--only", default="wide,fair")
    parser.add_argument("--label")
    parser.add_argument("--examples")
    opts = parser.parse_args()
    parts = opts.only.split(",")
    examples = examples_dir(opts.examples)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    cmd = "python3 bench/groups.py" + "".join(
        f" --{k}={v}" for k, v in (("rounds", opts.rounds), ("limit", opts.limit), ("only", opts.only),
                                    ("label", opts.label)) if v is not None)
    lines = [
        f"# Groups under load, {datetime.date.today().isoformat()} (v={run.server_version()}, {commit})",
        "",
        f"Command: `{cmd}` (core/examples/groups.rs built with `cargo build --release -p delayq --examples`; "
        "a private Redis per run pinned to CPU 0, the example pinned to CPU 1; "
        f"{opts.rounds} rounds, rows in turns; medians of the rounds, the range in brackets).",
    ]
    if "wide" in parts:
        sha = claim_sha(examples)
        variants = [("plain", 0), ("wide", 0), ("wide", opts.limit)]
        found = run.in_turns(variants, lambda v: measure_wide(examples, sha, v), opts.rounds, wide_name)
        base = statistics.median(m["scripts_us"] for m in found[variants[0]])
        lines += [
            "",
            "## The claim's cost with many groups",
            "",
            "109 900 due messages: 100 groups of 1 000 (each group's in one block of due times), each block",
            "followed by 99 groups of one message (10 000 groups in all), or the same messages without groups.",
            "A pool of 4 fetch threads (batch 1 000) and 4 no-op handler threads drains them. Redis µs a",
            "claimed message in scripts (`INFO commandstats`, every EVALSHA and FCALL: claims, acks, the rest),",
            "and the drain rate, from one run; the claim script's µs a message from the slow log of a second",
            "run, right after it, that logs every command; HMGET: every HMGET, the pool's own and the scripts'.",
            "",
            "| messages | drain rate | Redis µs a message in scripts | vs no groups | in the claim (2nd run) "
            "| in scripts (2nd run) | claims (2nd run) | HMGET µs a message |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for v, ms in found.items():
            scripts = [m["scripts_us"] for m in ms]
            lines.append(
                f"| {wide_name(v)} | {run.cell([m['rate'] for m in ms], ',.0f')} msg/s "
                f"| {run.cell(scripts, '.2f')} | {statistics.median(scripts) / base:.2f}x "
                f"| {run.cell([m['claim_us'] for m in ms], '.2f')} "
                f"| {run.cell([m['logged_scripts_us'] for m in ms], '.2f')} "
                f"| {run.cell([m['claims'] for m in ms], '.0f')} | {run.cell([m['hmget_us'] for m in ms], '.2f')} |")
    if "fair" in parts:
        limits = [opts.limit, 0]
        found_fair = run.in_turns(limits, lambda lim: measure_fair(examples, lim), opts.rounds, fair_name)
        lines += [
            "",
            "## Small groups behind a big one",
            "",
            "One group of 100 000 due messages pushed first, then 99 groups of 10 (all due); a pool of 8",
            "handler threads (default fetch threads and batch), each handler sleeping 1 ms. When each small",
            "group's last message started, in ms from the pool's start (median and max over the 99 groups),",
            "and how many of the big group's messages started before the last small group's last one did.",
            "",
            "| groups | small groups through, median | small groups through, max | big group's started before |",
            "|---|---|---|---|",
        ]
        for lim, ms in found_fair.items():
            lines.append(
                f"| {fair_name(lim)} | {run.cell([m['median_ms'] for m in ms], ',.0f')} ms "
                f"| {run.cell([m['max_ms'] for m in ms], ',.0f')} ms "
                f"| {run.cell([m['big_before'] for m in ms], ',.0f')} |")
    suffix = "-groups" + (f"-{opts.label}" if opts.label else "")
    run.write_results(suffix, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
