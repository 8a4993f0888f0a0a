"""Redis time per message of the drain's two scripts, claim and ack, called directly
from one client: the part of `make bench-redis-cost` that delayq's own Lua decides,
without a worker pool around it. Give it other copies of core/src/lua to compare a
change to the scripts before building it into the crate: each directory is drained in
turn, `--rounds` times.

A private Redis pinned to CPU 0; N messages due now, pushed by bench/php/fill.php
(as the other benches do); then claims of 1000 (the pool's batch), each followed by
the HMGET of their envelopes that a pool sends where the claim leaves them to it
(counted with the claim), and their acks, sent back in two halves (as a pool with two
completions in flight does), until the queue is empty. After the fill, `CONFIG RESETSTAT`; after the drain, `INFO commandstats`. The
scripts are composed by the crate itself (`cargo run --example scripts DIR`, once per
directory, from the repo root): the text sent to Redis, with its `-- @include` pieces,
and the roles of its KEYS in order (its `-- KEYS:` header), so a copy with other
includes or keys works too. Every run must hand out and acknowledge each message once
and leave the queue empty.

With --callgrind, Redis runs under valgrind's callgrind and each directory gets one row
of Redis instructions per message, for its claims and its acks apart (read after every
call, with both scripts loaded before the count starts): counts that repeat within a
few percent, where times on a shared 2-core machine move by a fifth. Slow: 20 000
messages and one round unless told otherwise.

With --trim-envelopes, the filled envelopes lose their "v", "id" and "created_ms" fields
before the drain (the claim and the ack read only the stamp and return the rest as it
is): it prices a smaller stored envelope with the scripts as they are.

    python3 bench/script_cost.py [--n=200000] [--rounds=3] [--callgrind] [--trim-envelopes] [--label=NAME] [DIR ...]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import itertools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import redis as redis_py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402
from redis_cost import commandstats  # noqa: E402

QUEUE = "bench"  # the queue bench/php/fill.php fills
TAG = "{dq:" + QUEUE + "}"
BATCH = 1000
LEASE_MS = 30000
DEAD_MAX, DEAD_TTL_MS = 10000, 30 * 86400 * 1000


def composed(lua_dir: Path) -> dict[str, dict[str, Any]]:
    """The scripts of `lua_dir` as the crate composes them: name -> {"lua": text to send,
    "keys": roles in KEYS order, "commands": ...}. One cargo run per directory."""
    return _composed(Path(lua_dir).resolve())


@functools.cache
def _composed(lua_dir: Path) -> dict[str, dict[str, Any]]:
    out = subprocess.run(
        ["cargo", "run", "-q", "--release", "-p", "delayq", "--example", "scripts", str(lua_dir)],
        cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{lua_dir}: the crate could not compose its scripts:\n{out.stderr}")
    return json.loads(out.stdout)


def key_list(lua_dir: Path, script: str) -> list[str]:
    """KEYS of `script` (claim, ack, ...) of `lua_dir`, in order: `{dq:QUEUE}:ROLE`."""
    return [f"{TAG}:{role}" for role in composed(lua_dir)[script]["keys"]]


def claim_and_ack(client: Any, lua_dir: Path, after: Callable[[str], None] = lambda _: None) -> tuple[int, int]:
    """Claims of BATCH and their acks, in two halves as a pool with two completions in
    flight sends them, until nothing is due: (handed out, acknowledged). `after` is
    called with "claim" or "ack" after each call."""
    scripts = composed(lua_dir)
    claim_keys, ack_keys = key_list(lua_dir, "claim"), key_list(lua_dir, "ack")
    claim = client.register_script(scripts["claim"]["lua"])
    ack = client.register_script(scripts["ack"]["lua"])
    head = ["native", f"{TAG}:wake"]
    handed = acked = 0
    while True:
        # {header, ids, envelopes, later, keyed, repeats, lease}: see claim.lua. Older
        # copies can be priced beside it: before 2026-12-05 the claim answered {id,
        # envelope} pairs in one part (6 parts); before 2026-12-04 {id, lease, envelope}
        # triples and no lease part (5 parts), and its ack.lua took (id, lease) pairs.
        # Since 2026-12-05 the claim leaves the envelopes to its caller, as a pool
        # reads them: one HMGET, counted with the claim.
        reply = claim(keys=claim_keys, args=[*head, BATCH, LEASE_MS, DEAD_MAX, DEAD_TTL_MS, "0"])
        token_once = len(reply) > 5
        if len(reply) == 7:
            ids = reply[1]
            if ids and not reply[2] and not all(client.hmget(f"{TAG}:messages", ids)):
                sys.exit(f"{lua_dir}: a claimed message has no envelope")
        else:
            ids = reply[1][::2 if token_once else 3]
        after("claim")
        count = len(ids)
        if count == 0:
            return handed, acked
        handed += count
        lease_part = reply[-1]
        leases = [lease_part[0]] * count if token_once else reply[1][1::3]
        if token_once:
            for j, lease in zip(lease_part[1::2], lease_part[2::2]):
                leases[j - 1] = lease
        half = count // 2
        for lo, hi in ((0, half), (half, count)):
            if hi == lo:
                continue
            if token_once:
                # Runs of one lease: the lease, how many, the ids.
                part = []
                for lease, run in itertools.groupby(zip(leases[lo:hi], ids[lo:hi]), key=lambda p: p[0]):
                    run_ids = [i for _, i in run]
                    part += [lease, len(run_ids), *run_ids]
            else:
                part = [v for j in range(lo, hi) for v in (ids[j], leases[j])]
            statuses = ack(keys=ack_keys, args=[*head, 0, 0, *part])
            after("ack")
            # A count when every delivery was acknowledged, else a status each.
            acked += statuses if isinstance(statuses, int) else sum(1 for s in statuses if s == 1)


# Rewrites every envelope of the hash without the fields a drain does not read.
TRIM = """
local cursor, trimmed = '0', 0
repeat
  local page = redis.call('HSCAN', KEYS[1], cursor, 'COUNT', 1000)
  cursor = page[1]
  for i = 1, #page[2], 2 do
    local slim, found = string.gsub(page[2][i + 1], '"v":1,"id":"[^"]*","created_ms":%d+,', '', 1)
    if found == 1 then
      redis.call('HSET', KEYS[1], page[2][i], slim)
      trimmed = trimmed + 1
    end
  end
until cursor == '0'
return trimmed
"""


def drain(lua_dir: Path, n: int, callgrind: bool = False, trim: bool = False) -> dict[str, tuple[int, int]]:
    """INFO commandstats over a drain of n messages: {command: (calls, µs)}; with
    `callgrind`, {"claim": (calls, instructions), "ack": (calls, instructions)}."""
    redis = run.CallgrindRedis() if callgrind else run.Redis()
    try:
        client: Any = redis_py.Redis(port=redis.port)
        composed(lua_dir)  # before the fill: a failed composition costs no fill
        with tempfile.TemporaryDirectory() as tmp:
            run.fill("delayq", f"--n={n}", f"--url={redis.url}", f"--due-file={tmp}/due")
        client.delete("bench:filled")
        if trim and client.eval(TRIM, 1, f"{TAG}:messages") != n:
            sys.exit("--trim-envelopes: not every envelope had the fields to trim")
        redis.cli("CONFIG", "RESETSTAT")
        counted = {"claim": [0, 0], "ack": [0, 0]}
        cg = redis if isinstance(redis, run.CallgrindRedis) else None

        def after(script: str) -> None:
            if cg:
                counted[script][0] += 1
                counted[script][1] += cg.instructions()

        if cg:
            # Loaded and connected first, then the count zeroed: neither the fill nor
            # a script's first compile is measured.
            for name in ("claim", "ack"):
                client.script_load(composed(lua_dir)[name]["lua"])
            client.ping()
            cg.instructions()
        handed, acked = claim_and_ack(client, lua_dir, after)
        stats = {k: (c, i) for k, (c, i) in counted.items()} if callgrind else commandstats(redis)
        left = client.zcard(f"{TAG}:scheduled") + client.hlen(f"{TAG}:messages") + client.zcard(f"{TAG}:inflight")
        if handed != n or acked != n or left:
            sys.exit(f"{lua_dir}: {handed} handed out, {acked} acknowledged of {n}, {left} entries left: void")
        return stats
    finally:
        redis.stop()


def shown(lua_dir: Path) -> str:
    path = lua_dir.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(lua_dir)


def row(label: str, stats: dict[str, tuple[int, int]], n: int) -> str:
    scripts = sum(u for name, (_, u) in stats.items() if name in ("eval", "evalsha"))
    commands = {k: u for k, (_, u) in stats.items() if k not in ("eval", "evalsha") and not k.startswith(("config", "script"))}
    inner = sum(commands.values())
    top = ", ".join(f"{k.upper()} {u / n:.2f}" for k, u in sorted(commands.items(), key=lambda kv: -kv[1]) if u / n >= 0.01)
    return f"| {label} | {scripts / n:.2f} | {inner / n:.2f} | {(scripts - inner) / n:.2f} | {top} |"


def instruction_row(label: str, stats: dict[str, tuple[int, int]], n: int) -> str:
    claim, ack = stats["claim"][1] / n, stats["ack"][1] / n
    return f"| {label} | {claim:,.0f} | {ack:,.0f} | {claim + ack:,.0f} | {stats['claim'][0]} + {stats['ack'][0]} |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dirs", nargs="*", type=Path, default=[ROOT / "core" / "src" / "lua"])
    parser.add_argument("--n", type=int, default=None, help="messages per run (200000; 20000 with --callgrind)")
    parser.add_argument("--rounds", type=int, default=None, help="runs per directory (3; 1 with --callgrind)")
    parser.add_argument("--callgrind", action="store_true", help="count Redis instructions under valgrind")
    parser.add_argument("--trim-envelopes", action="store_true", help='drop "v", "id" and "created_ms" before the drain')
    parser.add_argument("--label", default="script-cost", help="results file: bench/results/<date>-<label>.md")
    opts = parser.parse_args()
    opts.n = opts.n or (20000 if opts.callgrind else 200000)
    opts.rounds = opts.rounds or (1 if opts.callgrind else 3)
    show = instruction_row if opts.callgrind else row
    # The client on the other core, as every bench's clients.
    os.sched_setaffinity(0, {1})
    results: dict[Path, list[dict[str, tuple[int, int]]]] = {d: [] for d in opts.dirs}
    for _ in range(opts.rounds):
        for lua_dir, runs in results.items():
            runs.append(drain(lua_dir, opts.n, opts.callgrind, opts.trim_envelopes))
            print(show(shown(lua_dir), runs[-1], opts.n), flush=True)
    command = (f"Command: `python3 bench/script_cost.py --n={opts.n} --rounds={opts.rounds} "
               + ("--callgrind " if opts.callgrind else "") + ("--trim-envelopes " if opts.trim_envelopes else "")
               + " ".join(shown(d) for d in opts.dirs) + "`")
    if opts.callgrind:
        lines = [
            f"# Redis instructions per message of claim.lua and ack.lua, {datetime.date.today().isoformat()}",
            "",
            command + " (one client calling the scripts, claims of 1000 acknowledged in two halves;",
            f"a private Redis {run.server_version()} under callgrind; instructions per message, one row per run).",
            "",
            "| scripts | claims | acks | both | calls |",
            "|---|---|---|---|---|",
        ]
    else:
        lines = [
            f"# Redis time per message of claim.lua and ack.lua, {datetime.date.today().isoformat()}",
            "",
            command + " (one client calling the scripts, claims of 1000; a private Redis pinned to CPU 0;",
            "microseconds of Redis time per message, from `INFO commandstats`; one row per run).",
            "",
            "| scripts | in scripts | in Redis commands | in Lua | commands |",
            "|---|---|---|---|---|",
        ]
    for lua_dir, runs in results.items():
        lines += [show(shown(lua_dir), stats, opts.n) for stats in runs]
    run.write_results(f"-{opts.label}", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
