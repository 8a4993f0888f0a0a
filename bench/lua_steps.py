"""What single steps of a script cost Redis per message: the pieces a fence or a claim
could be built from, priced before a script is written with them.

A private Redis under valgrind's callgrind, filled by bench/php/fill.php with 5 000
messages due now (delayq's envelopes, as the other benches push them). Each step is a
small Lua script called with the ids of 500 of them as ARGV (a claim's half, as an ack
gets it), 10 times; reported: Redis instructions per id, and above the empty script's,
which is what passing the ids costs. A step that reads `KEYS[1]` reads the envelopes;
`KEYS[2]` is a fresh hash of short values beside them (a lease per message).

    python3 bench/lua_steps.py
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import redis as redis_py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402
from script_cost import TAG  # noqa: E402

IDS = 500
CALLS = 10
READ = "local e = redis.call('HMGET', KEYS[1], unpack(ARGV)) "
STEPS = {
    "empty script (the ids as ARGV)": "return 0",
    "HMGET of the envelopes": READ + "return 0",
    "HMGET of short values (a lease per message)": "local e = redis.call('HMGET', KEYS[2], unpack(ARGV)) return 0",
    "HSET of short values (a lease per message, written again)":
        "local a = {} for i = 1, #ARGV do a[2 * i - 1] = ARGV[i] a[2 * i] = '123456' end "
        "redis.call('HSET', KEYS[2], unpack(a)) return 0",
    "a table of (id, value) pairs, as that HSET builds":
        "local a = {} for i = 1, #ARGV do a[2 * i - 1] = ARGV[i] a[2 * i] = '123456' end return 0",
    "HMGET of the envelopes, string.sub of the first 7 bytes":
        READ + "local s = 0 for i = 1, #e do if string.sub(e[i], 1, 7) == '{\"at\":[' then s = s + 1 end end return s",
    "HMGET of the envelopes, string.byte of 4 bytes":
        READ + "local s, b = 0, string.byte for i = 1, #e do local w, x, y, z = b(e[i], 6, 9) "
        "if w == 58 and x == 91 and y == 48 and z == 44 then s = s + 1 end end return s",
    "HMGET of the envelopes, string.match of the stamp's claim number":
        READ + "local s = 0 for i = 1, #e do local c = tonumber(string.match(e[i], '^{\"at\":%[(%d+),%d+%],')) "
        "if c then s = s + 1 end end return s",
    "a table of the ids as keys (a check for ids named twice)":
        "local seen = {} for i = 1, #ARGV do seen[ARGV[i]] = true end return 0",
    "cmsgpack.pack of the ids (a claim's record)": "local p = cmsgpack.pack(ARGV) return 0",
}


def main() -> None:
    os.sched_setaffinity(0, {1})
    redis = run.CallgrindRedis()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run.fill("delayq", "--n=5000", f"--url={redis.url}", f"--due-file={tmp}/due")
        client = redis_py.Redis(port=redis.port)
        ids = [i for i in client.zrange(f"{TAG}:scheduled", 0, IDS - 1) if isinstance(i, bytes)]
        keys = [f"{TAG}:messages", f"{TAG}:steps_short"]
        # A hashtable from the start, as include/hashtable.lua writes the leases.
        client.hset(keys[1], "", "-" * 65)
        client.hset(keys[1], mapping={i: "123456" for i in ids})
        envelope = client.hget(keys[0], ids[0]) or b""
        rows = []
        base = None
        for name, lua in STEPS.items():
            sha = client.script_load(lua)
            client.evalsha(sha, len(keys), *keys, *ids)  # loaded and warm
            redis.instructions()
            for _ in range(CALLS):
                client.evalsha(sha, len(keys), *keys, *ids)
            per_id = redis.instructions() / (CALLS * IDS)
            base = per_id if base is None else base
            rows.append(f"| {name} | {per_id:,.0f} | {per_id - base:,.0f} |")
            print(rows[-1], flush=True)
    finally:
        redis.stop()
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=True).stdout.split()
    lines = [
        f"# What single script steps cost Redis per message, {datetime.date.today().isoformat()}",
        "",
        f"Command: `python3 bench/lua_steps.py` (Redis {next(w[2:] for w in version if w.startswith('v='))} under "
        f"callgrind; {IDS} ids a call, {CALLS} calls; envelopes of {len(envelope)} bytes, as fill.php pushes them).",
        "",
        "| step | instructions per id | above the empty script |",
        "|---|---|---|",
        *rows,
    ]
    run.write_results("-lua-steps", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
