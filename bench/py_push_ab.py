"""What a push costs the Python client, in instructions, with two or more builds of the
module: `push_many` of 1 000 messages and `push` of one, each counted by callgrind
inside the module's method only (the conversion of the Python values, the JSON text,
the envelope and the script call; not the Python that builds the values). The Python
side of bench/php_push_ab.py; the same payloads.

Each build is a directory that `pip install --target DIR <wheel>` filled: a `delayq`
package in it is imported instead of the installed one.

    python3 bench/py_push_ab.py [--n=20000] [--orders=100] [--label=NAME] LABEL=DIR ...
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402

METHODS = {"push_many": "_delayq::queue::PyQueue::__pymethod_push_many__",
           "push": "_delayq::queue::PyQueue::__pymethod_push__"}

SCRIPT = r"""
import sys
import delayq
url, method, n, orders = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
assert delayq.__file__.startswith(sys.argv[5]), delayq.__file__
q = delayq.DelayQueue(url, "bench")
listed = [{"order_id": 10086 + i, "action": "close", "amount": 12.5, "tags": ["a", "b"]} for i in range(orders)]
def payload(i):
    p = {"order_id": i, "action": "close"}
    if listed:
        p["orders"] = listed
    return p
if method == "push_many":
    for i in range(0, n, 1000):
        q.push_many([{"payload": payload(j), "delay": 60} for j in range(i, min(n, i + 1000))])
else:
    for i in range(n):
        q.push(payload(i), delay=60)
assert q.stats()["pushed"] == n, "not all stored"
"""


def count(build: str, redis: run.Redis, method: str, n: int, orders: int, tmp: str) -> int:
    """Instructions inside `method` for n messages."""
    redis.cli("FLUSHALL")
    out = f"{tmp}/cg.out"
    for old in glob.glob(out + "*"):
        os.unlink(old)
    script = f"{tmp}/push.py"
    Path(script).write_text(SCRIPT)
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--collect-atstart=no",
           f"--toggle-collect={METHODS[method]}", sys.executable, script, redis.url, method, str(n), str(orders),
           build]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHONPATH": build})
    if done.returncode != 0:
        raise RuntimeError(f"{method} with {build}: {done.stderr[-2000:]}")
    for line in Path(out).read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"{out}: no totals")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("builds", nargs="+", help="LABEL=DIR (a pip --target directory holding delayq)")
    parser.add_argument("--n", type=int, default=20000, help="messages per push_many count (push: a tenth)")
    parser.add_argument("--orders", type=int, default=100)
    parser.add_argument("--label", default="py-push-ab")
    opts = parser.parse_args()
    builds: dict[str, str] = {}
    for given in opts.builds:
        label, _, folder = given.partition("=")
        if not (label and folder) or not (Path(folder) / "delayq").is_dir():
            parser.error(f"{given!r}: a build is LABEL=DIR, a directory holding the delayq package")
        builds[label] = str(Path(folder).resolve())
    cases = [("push_many", opts.n, 0), ("push_many", opts.n, opts.orders), ("push", opts.n // 10, 0),
             ("push", opts.n // 10, opts.orders)]
    rows: dict[tuple[str, int], dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        redis = run.Redis()
        try:
            for method, n, orders in cases:
                for label, build in builds.items():
                    per = count(build, redis, method, n, orders, tmp) / n
                    print(f"{method} orders={orders} {label}: {per:,.0f} instructions a message", flush=True)
                    rows.setdefault((method, orders), {})[label] = per
        finally:
            redis.stop()
    first = next(iter(builds))
    lines = [
        f"# What a push costs the Python client, {len(builds)} builds, {time.strftime('%Y-%m-%d')}",
        "",
        f"Command: `python3 bench/py_push_ab.py --n={opts.n} --orders={opts.orders} "
        + " ".join(f"{label}=…" for label in builds) + "`: callgrind's count inside the module's",
        f"method, per message; push_many in batches of 1 000 ({opts.n} messages), push one at a time ({opts.n // 10}).",
        "",
        "| call | payload | " + " | ".join(builds) + " |",
        "|---|---|" + "---|" * len(builds),
    ]
    for (method, orders), found in rows.items():
        shape = f"{orders} orders" if orders else "two fields"
        cells = [f"{found[label]:,.0f}" + ("" if label == first else f" ({found[label] / found[first]:.2f}x)")
                 for label in builds]
        lines.append(f"| {method} | {shape} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Builds: " + ", ".join(f"{label} = {build}" for label, build in builds.items()) + ".")
    run.write_results(f"-{opts.label}", "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
