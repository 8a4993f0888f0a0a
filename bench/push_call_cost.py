"""Where Redis spends a push of one message (issue 29, item 4: a push per call against
`redis-benchmark -c 1 -t zadd`). push.lua as the crate composes it, and copies of it
with one part cut out, each sent N times with one message from one client; Redis's own
time per call from `INFO commandstats` (`usec_per_call` of EVALSHA). The cut copies
are not valid scripts for the queue: they price the parts.

    python3 bench/push_call_cost.py [--n=3000] [--label=NAME]
"""

from __future__ import annotations

import argparse
import datetime
import re
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


def variants(lua: str) -> dict[str, str]:
    no_preflight = re.sub(r"local preflight_fault = preflight\(.*\)\n", "local preflight_fault = nil\n", lua)
    return {
        "push.lua as committed": lua,
        "without the ACL checks of its preflight": lua.replace("if redis.acl_check_cmd then", "if false then"),
        "without the key type checks of its preflight": lua.replace("for i = 1, #typed, 2 do", "for i = 1, 0, 2 do"),
        "without its preflight": no_preflight,
        "returning before anything (the call itself)": "do return 1 end\n" + lua,
        "`return 1` with the same keys and arguments": "return 1",
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--label", default="push-call-cost")
    args = p.parse_args()
    script = composed(ROOT / "core" / "src" / "lua")["push"]
    keys = ["{dq:bench}:" + role for role in script["keys"]]
    server = run.Redis()
    rows: dict[str, list[float]] = {}
    try:
        r = redis_py.Redis(port=server.port)
        for _ in range(args.rounds):
            for name, text in variants(script["lua"]).items():
                r.flushall()
                r.config_resetstat()
                sha = r.script_load(text)
                for i in range(args.n):
                    mid = str(uuid.uuid4())
                    envelope = '{"v":1,"id":"%s","created_ms":1,"payload":{"order_id":%d,"action":"close"}}' % (mid, i)
                    r.evalsha(sha, len(keys), *keys, "native", "{dq:bench}:wake", "new", 1, "delay", 60000,
                              "ordered", mid, envelope)
                rows.setdefault(name, []).append(float(r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]))
    finally:
        server.stop()
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()[2]
    lines = [
        f"# Redis time of a push of one message, {datetime.date.today()} ({version})",
        "",
        f"Command: `python3 bench/push_call_cost.py --n={args.n} --rounds={args.rounds} --label={args.label}` "
        "(a private Redis pinned to CPU 0; one client; Redis's `usec_per_call` of EVALSHA, median of the rounds).",
        "",
        "| script | µs per call (median) | range |",
        "|---|---|---|",
    ]
    for name, values in rows.items():
        lines.append(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} .. {max(values):.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (ROOT / "bench" / "results" / f"{datetime.date.today()}-{args.label}.md").write_text(text)


if __name__ == "__main__":
    main()
