"""What single steps of a script cost Redis per message: the pieces a fence or a claim
could be built from, priced before a script is written with them.

A private Redis under valgrind's callgrind, filled by bench/php/fill.php with 5 000
messages due now (delayq's envelopes, as the other benches push them). Each step is a
small Lua script called with the ids of 500 of them as ARGV (a claim's half, as an ack
gets it), 10 times; reported: Redis instructions per id, and above the empty script's,
which is what passing the ids costs. `KEYS[1]` holds the envelopes; `KEYS[2]`, a hash
of a short value per id (a lease per message); `KEYS[3]`, a hash of its own per call,
empty until the step that writes leases as a claim does (a hashtable from the start,
as include/hashtable.lua writes them), and emptied by the step that deletes them as an
ack does. A step that checks stamps returns how many it matched, which must be every id
(fill.php's envelopes all carry a producer's stamp), so a check that fails at once
cannot pass for a cheap one.

    python3 bench/lua_steps.py
"""

from __future__ import annotations

import datetime
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis as redis_py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402
from script_cost import TAG  # noqa: E402

IDS = 500
CALLS = 10
READ = "local e = redis.call('HMGET', KEYS[1], unpack(ARGV)) "
PAIRS = "local a = {} for i = 1, #ARGV do a[2 * i - 1] = ARGV[i] a[2 * i] = '123456' end "
# name -> (Lua, how many ids it must return: None for a step that returns 0)
STEPS: dict[str, tuple[str, int | None]] = {
    "empty script (the ids as ARGV)": ("return 0", None),
    "HMGET of the envelopes": (READ + "return 0", None),
    "HMGET of short values (a lease per message)": ("local e = redis.call('HMGET', KEYS[2], unpack(ARGV)) return 0", None),
    "a table of (id, value) pairs, as a claim builds for its leases": (PAIRS + "return 0", None),
    "that table and HSET of it into a fresh hash (a claim's leases)":
        (PAIRS + "a[#a + 1] = '' a[#a + 1] = string.rep('-', 65) redis.call('HSET', KEYS[3], unpack(a)) "
         "redis.call('HDEL', KEYS[3], '') return 0", None),
    "HDEL of those leases (an ack's)": ("redis.call('HDEL', KEYS[3], unpack(ARGV)) return 0", None),
    "HMGET of the envelopes, string.sub of the first 7 bytes":
        (READ + "local s = 0 for i = 1, #e do if string.sub(e[i], 1, 7) == '{\"at\":[' then s = s + 1 end end "
         "return s", IDS),
    "HMGET of the envelopes, string.byte of 4 bytes":
        (READ + "local s, b = 0, string.byte for i = 1, #e do local w, x, y, z = b(e[i], 6, 9) "
         "if w == 58 and x == 91 and y == 48 and z == 44 then s = s + 1 end end return s", IDS),
    "HMGET of the envelopes, string.match of the stamp's claim number":
        (READ + "local s = 0 for i = 1, #e do local c = tonumber(string.match(e[i], '^{\"at\":%[(%d+),%d+%],')) "
         "if c then s = s + 1 end end return s", IDS),
    "a table of the ids as keys (a check for ids named twice)":
        ("local seen = {} for i = 1, #ARGV do seen[ARGV[i]] = true end return 0", None),
    "cmsgpack.pack of the ids (a claim's record)": ("local p = cmsgpack.pack(ARGV) return 0", None),
    "a table of the ids copied from ARGV": ("local t = {} for i = 1, #ARGV do t[i] = ARGV[i] end return 0", None),
    "tonumber of each id (a C call per id)":
        ("local s = 0 for i = 1, #ARGV do if tonumber(ARGV[i]) then s = s + 1 end end return s", 0),
    "a status per id returned (a table of 1s)": ("local r = {} for i = 1, #ARGV do r[i] = 1 end return r", None),
}


def main() -> None:
    os.sched_setaffinity(0, {1})
    redis = run.CallgrindRedis()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run.fill("delayq", "--n=5000", f"--url={redis.url}", f"--due-file={tmp}/due")
        client: Any = redis_py.Redis(port=redis.port)
        ids: list[bytes] = client.zrange(f"{TAG}:scheduled", 0, IDS - 1)
        short = f"{TAG}:steps_short"
        # A hashtable from the start, as include/hashtable.lua writes the leases.
        client.hset(short, "", "-" * 65)
        client.hset(short, mapping={i: "123456" for i in ids})
        envelope = client.hget(f"{TAG}:messages", ids[0]) or b""
        rows = []
        base = None
        for name, (lua, expected) in STEPS.items():
            sha = client.script_load(lua)
            # Call -1 warms the script; calls 0.. are counted. Each has its own fresh hash.
            for call in range(-1, CALLS):
                keys = [f"{TAG}:messages", short, f"{TAG}:steps_fresh:{call}"]
                if call == 0:
                    redis.instructions()
                got = client.evalsha(sha, len(keys), *keys, *ids)
                if expected is not None and got != expected:
                    sys.exit(f"{name}: matched {got} of {expected} ids: the step does not check what it claims")
            per_id = redis.instructions() / (CALLS * IDS)
            base = per_id if base is None else base
            rows.append(f"| {name} | {per_id:,.0f} | {per_id - base:,.0f} |")
            print(rows[-1], flush=True)
        if client.keys(f"{TAG}:steps_fresh:*"):
            sys.exit("the deleting step left leases behind")
    finally:
        redis.stop()
    lines = [
        f"# What single script steps cost Redis per message, {datetime.date.today().isoformat()}",
        "",
        f"Command: `python3 bench/lua_steps.py` (Redis {run.server_version()} under "
        f"callgrind; {IDS} ids a call, {CALLS} calls; envelopes of {len(envelope)} bytes, as fill.php pushes them).",
        "",
        "| step | instructions per id | above the empty script |",
        "|---|---|---|",
        *rows,
    ]
    run.write_results("-lua-steps", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
