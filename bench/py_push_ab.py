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

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402
from php_push_ab import compare, counted, parse  # noqa: E402

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
    script = f"{tmp}/push.py"
    Path(script).write_text(SCRIPT)
    return counted(METHODS[method], [sys.executable, script, redis.url, method, str(n), str(orders), build], tmp,
                   {**os.environ, "PYTHONPATH": build})


def main() -> None:
    opts, builds = parse(__doc__ or "", "DIR (a pip --target directory holding delayq)", "py-push-ab",
                         lambda folder: (folder / "delayq").is_dir())
    with tempfile.TemporaryDirectory() as tmp:
        compare("Python", "py_push_ab.py", ("push_many", "push"), opts, builds, count, tmp)


if __name__ == "__main__":
    main()
