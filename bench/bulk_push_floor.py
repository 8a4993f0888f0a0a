"""What any bulk push that is one script costs Redis (issue 29, item 2), beside the
recipe's hand pipeline, all counted alike: Redis instructions per message of
  - push.lua as the crate composes it, sent the arguments `pushMany` sends for a batch
    of 1 000 delays (a "new" call, one "ordered stamped" run at one due time, ids and
    stamped envelopes as the core writes them);
  - a script that only HSETs the batch's envelopes and ZADDs its ids at the run's
    score, sent the same arguments: the least a push that is one script can cost;
  - the recipe: pipelines of 50 HSET + ZADD pairs, `uniqid`-shaped ids, bare payloads,
    whole-second scores (as bench/php/bulk_push.php sends them from phpredis).
The two scripts also run with envelopes without their "v", "id" and "created_ms"
fields, to price the stored envelope's size.

All from redis-py, to a private Redis under valgrind's callgrind with `hz 1` (its
timer work runs over callgrind's slow wall time, which differs per row). Every row
stores the same messages: the first 1 000 are not counted (they load the script and
create the keys); then each batch at a later millisecond, as a producer's batches
come, with ascending UUID v7 ids like the core's. Each row must store every message,
and push.lua must keep the client's stamps: the stored envelope is the one sent.

    python3 bench/bulk_push_floor.py [--n=30000] [--label=NAME]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import redis as redis_py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import CallgrindRedis, write_results  # noqa: E402
from script_cost import composed  # noqa: E402

BATCH = 1000
PIPELINE = 50
TAG = "{dq:bench}"

# The least a one-script push does: the batch's envelopes into the messages hash, its
# ids into the schedule at the run's one score (read from the first stamp).
FLOOR = """
local n = tonumber(ARGV[4])
local fields, members = {}, {}
local score = string.match(ARGV[9], '^{"at":%[0,(%d+)%],')
local j = 0
for i = 8, 7 + 2 * n, 2 do
  fields[j + 1], fields[j + 2] = ARGV[i], ARGV[i + 1]
  members[j + 1], members[j + 2] = score, ARGV[i]
  j = j + 2
end
redis.call('HSET', KEYS[2], unpack(fields))
redis.call('ZADD', KEYS[1], unpack(members))
return 1
"""


def v7_ids(count: int) -> list[str]:
    """Ascending UUID v7 texts, as core/src/fork.rs makes them: the millisecond, then
    a counter within it, then random bits."""
    ms = int(time.time() * 1000)
    out = []
    for counter in range(count):
        rand_a, rand_b = counter >> 10, ((counter & 0x3FF) << 52) | (int.from_bytes(os.urandom(8), "big") >> 12)
        out.append(str(uuid.UUID(int=(ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b)))
    return out


def batches(n: int, trimmed: bool) -> list[list[Any]]:
    """pushMany's arguments for n messages in batches of BATCH."""
    due = int(time.time() * 1000) + 60_000
    created = due - 60_000
    ids = v7_ids(n)
    out = []
    for b in range(n // BATCH):
        score = (due + b) * 4096
        args: list[Any] = ["native", f"{TAG}:wake", "new", BATCH, "at", due + b, "ordered stamped"]
        for i in range(b * BATCH, (b + 1) * BATCH):
            fields = "" if trimmed else f'"v":1,"id":"{ids[i]}","created_ms":{created},'
            args += [ids[i], f'{{"at":[0,{score}],{fields}"payload":{{"order_id":{i},"action":"close"}}}}']
        out.append(args)
    return out


def counted(n: int, send: Callable[[redis_py.Redis, int], None], check: Callable[[redis_py.Redis], None]) -> float:
    """Redis instructions per message of `send(client, i)` for i in 1..n/BATCH-1, after
    `send(client, 0)`; `check` then looks at what was stored."""
    server = CallgrindRedis()
    try:
        r = redis_py.Redis(port=server.port)
        r.config_set("hz", 1)
        send(r, 0)
        server.instructions()
        for i in range(1, n // BATCH):
            send(r, i)
        used = server.instructions()
        check(r)
        return used / (n - BATCH)
    finally:
        server.stop()


def script_row(lua: str, keys: list[str], sent: list[list[Any]]) -> float:
    sha: list[str] = []

    def send(r: redis_py.Redis, i: int) -> None:
        if not sha:
            sha.append(r.script_load(lua))
        r.evalsha(sha[0], len(keys), *keys, *sent[i])

    def check(r: redis_py.Redis) -> None:
        expected = len(sent) * BATCH
        stored = r.zcard(f"{TAG}:scheduled"), r.hlen(f"{TAG}:messages")
        if stored != (expected, expected):
            sys.exit(f"stored {stored}, expected {expected} of each")
        last = sent[-1]
        if r.hget(f"{TAG}:messages", last[-2]).decode() != last[-1]:
            sys.exit("the stored envelope is not the one sent: the client's stamp was not kept")

    return counted(len(sent) * BATCH, send, check)


def recipe_row(n: int) -> float:
    """bench/php/bulk_push.php's recipe: uniqid('msg_', true) ids, json_encode'd
    payloads, time() + 60 scores."""
    base = int(time.time() * 1_000_000)

    def send(r: redis_py.Redis, b: int) -> None:
        for lo in range(b * BATCH, (b + 1) * BATCH, PIPELINE):
            p = r.pipeline(transaction=False)
            for j in range(lo, lo + PIPELINE):
                us = base + j
                mid = f"msg_{us // 1_000_000:08x}{us % 1_000_000:05x}.{j % 100_000_000:08d}"
                p.hset("delay_queue:payload", mid, json.dumps({"order_id": j, "action": "close"},
                                                              separators=(",", ":")))
                p.zadd("delay_queue:zset", {mid: int(time.time()) + 60})
            p.execute()

    def check(r: redis_py.Redis) -> None:
        stored = r.zcard("delay_queue:zset"), r.hlen("delay_queue:payload")
        if stored != (n, n):
            sys.exit(f"recipe stored {stored}, expected {n} of each")

    return counted(n, send, check)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=30_000)
    p.add_argument("--label", default="bulk-push-floor")
    args = p.parse_args()
    if args.n < 2 * BATCH or args.n % BATCH:
        sys.exit(f"--n must be a multiple of {BATCH}, at least {2 * BATCH}")
    script = composed(ROOT / "core" / "src" / "lua")["push"]
    keys = [f"{TAG}:{role}" for role in script["keys"]]
    payloads = [len(json.dumps({"order_id": j, "action": "close"}, separators=(",", ":")))
                for j in range(BATCH, args.n)]
    rows = [("the recipe: pipelines of 50 HSET + ZADD pairs", f"{sum(payloads) / len(payloads):.0f} (the payload)",
             recipe_row(args.n))]
    print(rows[-1], flush=True)
    for trimmed in (False, True):
        sent = batches(args.n, trimmed)
        envelopes = [len(e.encode()) for batch in sent[1:] for e in batch[8::2]]
        size = f"{sum(envelopes) / len(envelopes):.0f}" + (" (no v, id, created_ms)" if trimmed else "")
        for name, lua in (("push.lua", script["lua"]), ("HSET + ZADD only (the floor)", FLOOR)):
            rows.append((name, size, script_row(lua, keys, sent)))
            print(rows[-1], flush=True)
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    recipe = rows[0][2]
    lines = [
        f"# What a one-script bulk push costs Redis, beside the recipe, {datetime.date.today()} ({version})",
        "",
        f"Command: `python3 bench/bulk_push_floor.py --n={args.n} --label={args.label}` (from redis-py, "
        f"{args.n} messages a row, the first {BATCH} not counted; a private Redis under callgrind, hz 1).",
        "",
        "| row | stored envelope bytes | Redis instructions per message | vs recipe |",
        "|---|---|---|---|",
    ]
    lines += [f"| {name} | {size} | {ins:,.0f} | {ins / recipe:.2f}x |" for name, size, ins in rows]
    write_results("-" + args.label, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
