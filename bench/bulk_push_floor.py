"""What any bulk push that is one script costs Redis (issue 29, item 2): Redis
instructions per message of batches of 1 000 stamped messages sent to push.lua as the
crate composes it, and to a script that only HSETs the batch's envelopes and ZADDs its
ids at one score: the least a push that is one script can cost with these arguments.
Each also with envelopes without their "v", "id" and "created_ms" fields, to price the
stored envelope's size. The recipe's figure comes from `bench/bulk_push.py --callgrind`,
which drives the real clients.

The arguments are those `pushMany` sends for a batch of 1 000 delays (a "new" call, one
"ordered stamped" run at one due time, ids and envelopes as the core writes them), sent
from redis-py; each batch at a later millisecond, as a producer's batches come. A
private Redis under valgrind's callgrind; the first batch loads the script and is not
counted. Every message must be stored.

    python3 bench/bulk_push_floor.py [--n=30000] [--label=NAME]
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis as redis_py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from run import CallgrindRedis, write_results  # noqa: E402
from script_cost import composed  # noqa: E402

BATCH = 1000
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


def batches(n: int, trimmed: bool) -> list[list[object]]:
    due = int(time.time() * 1000) + 60_000
    created = due - 60_000
    out = []
    for b in range(n // BATCH):
        score = (due + b) * 4096
        args: list[object] = ["native", f"{TAG}:wake", "new", BATCH, "at", due + b, "ordered stamped"]
        for i in range(BATCH):
            mid = str(uuid.uuid4())
            fields = "" if trimmed else f'"v":1,"id":"{mid}","created_ms":{created},'
            args += [mid, f'{{"at":[0,{score}],{fields}"payload":{{"order_id":{b * BATCH + i},"action":"close"}}}}']
        out.append(args)
    return out


def cost(lua: str, keys: list[str], sent: list[list[object]]) -> float:
    server = CallgrindRedis()
    try:
        r = redis_py.Redis(port=server.port)
        sha = r.script_load(lua)
        r.evalsha(sha, len(keys), *keys, *sent[0])
        server.instructions()
        for args in sent[1:]:
            r.evalsha(sha, len(keys), *keys, *args)
        used = server.instructions()
        stored = r.zcard(f"{TAG}:scheduled"), r.hlen(f"{TAG}:messages")
        expected = len(sent) * BATCH
        if stored != (expected, expected):
            sys.exit(f"stored {stored}, expected {expected} of each")
        return used / (expected - BATCH)
    finally:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=30_000)
    p.add_argument("--label", default="bulk-push-floor")
    args = p.parse_args()
    if args.n < 2 * BATCH or args.n % BATCH:
        sys.exit(f"--n must be a multiple of {BATCH}, at least {2 * BATCH}")
    script = composed(ROOT / "core" / "src" / "lua")["push"]
    keys = [f"{TAG}:{role}" for role in script["keys"]]
    rows = []
    for trimmed in (False, True):
        sent = batches(args.n, trimmed)
        size = sum(len(str(a)) for a in sent[0][8::2]) / BATCH
        for name, lua in (("push.lua", script["lua"]), ("HSET + ZADD only (the floor)", FLOOR)):
            rows.append((name, f"{size:.0f}" + (" (no v, id, created_ms)" if trimmed else ""), cost(lua, keys, sent)))
            print(rows[-1], flush=True)
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    lines = [
        f"# What a one-script bulk push costs Redis, {datetime.date.today()} ({version})",
        "",
        f"Command: `python3 bench/bulk_push_floor.py --n={args.n} --label={args.label}` (batches of {BATCH} "
        "stamped messages from redis-py; a private Redis under callgrind; the first batch not counted).",
        "",
        "| script | envelope bytes | Redis instructions per message |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {size} | {ins:,.0f} |" for name, size, ins in rows]
    write_results("-" + args.label, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
