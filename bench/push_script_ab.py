"""push.lua alone, side by side: copies of core/src/lua (each a directory, composed with
`cargo run -p delayq --example scripts DIR`) called with the same 10 runs of 1 000
envelopes the client stamped ("ordered stamped", due a minute on), Redis under
callgrind; prints Redis instructions per pushed message for each copy.

    python3 bench/push_script_ab.py DIR [DIR ...]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import ROOT, CallgrindRedis  # noqa: E402

import redis  # noqa: E402


def composed_push(lua_dir: str) -> dict:
    out = subprocess.run(["cargo", "run", "-q", "-p", "delayq", "--example", "scripts", lua_dir],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["push"]


def main() -> None:
    dirs = sys.argv[1:]
    if not dirs:
        sys.exit(__doc__)
    scripts = {d: composed_push(d) for d in dirs}
    r = CallgrindRedis()
    try:
        con = redis.Redis.from_url(r.url)
        for n, (d, s) in enumerate(scripts.items()):
            sha = con.script_load(s["lua"])
            keys = [f"{{dq:ab{n}}}:{k}" for k in s["keys"]]
            secs, micros = con.time()
            now = secs * 1000 + micros // 1000
            calls = []
            for b in range(10):
                at = now + 60_000 + b
                words: list = ["native", "wake", "new", 1000, "at", at, "ordered stamped"]
                for j in range(1000):
                    i = f"01a23e1d-69af-7000-{b:04x}-{j:012x}"
                    words += [i, f'{{"at":[0,{at * 4096}],"v":1,"id":"{i}","created_ms":1796338444719,'
                                 f'"payload":{{"n":{j}}}}}']
                calls.append(words)
            r.instructions()
            for words in calls:
                con.evalsha(sha, len(keys), *keys, *words)
            print(f"{d}: {r.instructions() / 10_000:,.0f} instructions a message")
    finally:
        r.stop()


if __name__ == "__main__":
    main()
