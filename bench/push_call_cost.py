"""Where Redis spends a push of one message (issues 29 and 54): the plain script of
issue 54 (the least a server-clocked push that wakes idle pools needs), push_one.lua
(what a push of one message sends), push.lua as the crate composes it, and copies of
push.lua with one part cut out, each sent N times with one message from one client; Redis's own
time per call from `INFO commandstats` (`usec_per_call` of EVALSHA), or with
--callgrind Redis's instructions per call under valgrind's callgrind (one round: counts
repeat where times move; the first call, which compiles the script, is not counted).
The cut copies are not valid scripts for the queue: they price the parts. The rows
"as a function" send FCALL of a library loaded with FUNCTION LOAD (delayq's, as
`delayq install-functions` loads it; the plain script's, as one function).

    python3 bench/push_call_cost.py [--n=3000] [--rounds=3] [--callgrind] [--label=NAME]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

import redis as redis_py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402
from script_cost import composed  # noqa: E402


def library() -> dict[str, str]:
    """This tree's library of functions: {"name", "text"}."""
    out = subprocess.run(["cargo", "run", "-q", "--release", "-p", "delayq", "--example", "scripts", "--", "--library"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def cut(lua: str, start: str, end: str) -> str:
    """`lua` without the lines from the one that starts with `start` through the one
    that starts with `end`."""
    a = lua.index(start)
    b = lua.index("\n", lua.index(end, a)) + 1
    return lua[:a] + lua[b:]


def variants(lua: str) -> dict[str, str]:
    # The preflight's two parts, as scripts::compose writes them.
    acl = ("-- preflight: permissions", "end -- preflight: permissions")
    types = ("-- preflight: key types", "end -- preflight: key types")
    return {
        "push.lua as committed": lua,
        "without the ACL checks of its preflight": cut(lua, *acl),
        "without the key type checks of its preflight": cut(lua, *types),
        "without its preflight": cut(lua, acl[0], types[1]),
        "returning where its preflight starts (the call and the includes' definitions)":
            lua.replace(acl[0], "do return 1 end\n" + acl[0], 1),
        "returning before anything (the call itself)": "do return 1 end\n" + lua,
        "`return 1` with the same keys and arguments": "return 1",
    }


def one_variants(lua: str) -> dict[str, str]:
    """push_one.lua without one of the things it does beyond the plain script: the
    price of each."""
    body = lua.rindex("local now, r, step = clock_at(")

    def without(a: str, b: str) -> str:
        assert a in lua, a
        return lua.replace(a, b)
    return {
        "push_one.lua, returning where its own code starts (the call and the includes' definitions)":
            lua[:body] + "do return 1 end\n" + lua[body:],
        "push_one.lua without guard's redis.call wrapper (faults unnamed)":
            without("local redis = {", "local _unused = {"),
        "push_one.lua without the queue clock's read (TIME alone)":
            without("redis.call('HMGET', K_CONTROL, 'clock_ms', 'step_ms', 'step_at', 'format')", "{}"),
        "push_one.lua without the queue clock's write":
            without("reply = redis.pcall('HSET', K_CONTROL, clock_fields(r, step))", "reply = 1"),
        "push_one.lua without its place in the millisecond (no read of the tail)":
            without("local score = score_at(due)", "local score = due * SEQ_SPAN"),
        "push_one.lua without counting `pushed`":
            without("reply = redis.pcall('HINCRBY', K_STATS, 'pushed', 1)", "reply = 1"),
    }


# The least a server-clocked push that wakes idle pools needs (issue 54): no queue
# clock, no order within a millisecond, no fault handling. KEYS: messages scheduled
# stats channel; ARGV: id, delay, envelope.
PLAIN = """local t = redis.call('TIME')
local ms = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[2])
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[2], ms, ARGV[1])
redis.call('HINCRBY', KEYS[3], 'pushed', 1)
if head[2] == nil or tonumber(head[2]) > ms then redis.call('PUBLISH', KEYS[4], ms) end
return ms
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=None, help="3; 1 with --callgrind")
    p.add_argument("--callgrind", action="store_true", help="count Redis instructions under valgrind")
    p.add_argument("--label", default="push-call-cost")
    args = p.parse_args()
    rounds = args.rounds or (1 if args.callgrind else 3)
    scripts = composed(ROOT / "core" / "src" / "lua")
    script, one = scripts["push"], scripts["push_one"]
    keys = ["{dq:bench}:" + role for role in script["keys"]]
    one_keys = ["{dq:bench}:" + role for role in one["keys"]]
    rows: dict[str, list[float]] = {}
    plain_name = "the plain script of issue 54 (TIME, ZRANGE head, HSET, ZADD, HINCRBY, PUBLISH when earliest)"
    one_name = "push_one.lua as committed (what `push` sends)"

    lib = library()
    plain_fn = plain_name + ", as a function"
    one_fn = "push_one.lua as a function of delayq's library (what `push` sends where it is installed)"
    push_fn = "push.lua as a function of delayq's library"
    functions = {
        plain_fn: ("dq_plain", "#!lua name=plain\nredis.register_function('dq_plain', function(KEYS, ARGV)\n"
                   + PLAIN + "end)\n"),
        one_fn: (lib["name"] + "_push_one", lib["text"]),
        push_fn: (lib["name"] + "_push", lib["text"]),
    }

    def push(r: redis_py.Redis, sha: str, i: int, name: str) -> None:
        mid = str(uuid.uuid4())
        # The body without its opening brace, as the core sends it (the script writes
        # the stamp and the brace).
        body = '"v":1,"id":"%s","created_ms":1,"payload":{"order_id":%d,"action":"close"}}' % (mid, i)
        call = (lambda *a: r.fcall(functions[name][0], *a)) if name in functions else (lambda *a: r.evalsha(sha, *a))
        if name in (plain_name, plain_fn):
            call(4, "{dq:bench}:messages", "{dq:bench}:scheduled", "{dq:bench}:stats", "{dq:bench}:wake",
                 mid, 60000, "{" + body)
        elif name.startswith("push_one.lua"):
            call(len(one_keys), *one_keys, "native", "{dq:bench}:wake", "delay", 60000, mid, body)
        else:
            call(len(keys), *keys, "native", "{dq:bench}:wake", "new", 1, "delay", 60000, "ordered", mid, body)

    for _ in range(rounds):
        texts = {plain_name: PLAIN, plain_fn: "", one_name: one["lua"], one_fn: "", push_fn: "",
                 **one_variants(one["lua"]), **variants(script["lua"])}
        for name, text in texts.items():
            server = run.CallgrindRedis() if args.callgrind else run.Redis()
            try:
                r = redis_py.Redis(port=server.port)
                if name in functions:
                    r.function_load(functions[name][1], replace=True)
                    sha = ""
                else:
                    sha = r.script_load(text)
                push(r, sha, 0, name)
                if isinstance(server, run.CallgrindRedis):
                    server.instructions()
                    for i in range(1, args.n + 1):
                        push(r, sha, i, name)
                    rows.setdefault(name, []).append(server.instructions() / args.n)
                else:
                    r.config_resetstat()
                    for i in range(1, args.n + 1):
                        push(r, sha, i, name)
                    command = "cmdstat_fcall" if name in functions else "cmdstat_evalsha"
                    rows.setdefault(name, []).append(float(r.info("commandstats")[command]["usec_per_call"]))
            finally:
                server.stop()
            print(name, rows[name][-1], flush=True)
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    flags = f"--n={args.n} --rounds={rounds}" + (" --callgrind" if args.callgrind else "")
    unit = "Redis instructions per call" if args.callgrind else "µs per call"
    how = ("a private Redis under callgrind; the first call, which compiles the script, not counted" if args.callgrind
           else "a private Redis pinned to CPU 0; Redis's `usec_per_call` of EVALSHA, or FCALL")
    lines = [
        f"# Redis time of a push of one message, {datetime.date.today()} ({version})",
        "",
        f"Command: `python3 bench/push_call_cost.py {flags} --label={args.label}` "
        f"(one client; {how}; median of the rounds).",
        "",
        f"| script | {unit} (median) | range |",
        "|---|---|---|",
    ]
    fmt = "{:,.0f}" if args.callgrind else "{:.2f}"
    for name, values in rows.items():
        lines.append(f"| {name} | {fmt.format(statistics.median(values))} | "
                     f"{fmt.format(min(values))} .. {fmt.format(max(values))} |")
    run.write_results(f"-{args.label}", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
