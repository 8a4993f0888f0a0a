"""delayq on Redis Cluster: one logical queue with 1 and with 3 partitions on a
3-master cluster, next to a single Redis, all started here.

Every redis-server is pinned to CPU 0 and the client (this process, the delayq Python
module) to CPU 1, as in bench/run.py. On a 2-core machine the three masters share one
core, so this measures what partitions cost, not the scale-out they bring on real
hosts (one master per machine). Each figure: 3 runs, median and range; a run that
does not handle and ack every message is VOID. Writes
bench/results/<date>-cluster.md.

    python3 bench/cluster.py [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRAIN = ROOT / "target" / "release" / "examples" / "drain"
sys.path.insert(0, str(ROOT / "bench"))

import delayq  # noqa: E402
from run import Redis as Node, free_port, write_results  # noqa: E402


def start_cluster() -> list[Node]:
    nodes = [Node("--cluster-enabled", "yes", "--cluster-port", str(free_port()), "--cluster-node-timeout", "5000")
             for _ in range(3)]
    out = subprocess.run(["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
                          "--cluster-replicas", "0", "--cluster-yes"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(out.stdout + out.stderr)
    deadline = time.monotonic() + 30
    while not all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in nodes):
        if time.monotonic() > deadline:
            raise RuntimeError("cluster did not come up")
        time.sleep(0.1)
    return nodes


def one_run(url: str, partitions: int, n: int, run: int) -> tuple[float, float, str]:
    """Bulk push n due messages from Python, then drain n with the core's own pool (the
    drain example: no handler-language overhead, so the partitions' cost shows):
    (push/s, drain/s, verdict)."""
    q = delayq.DelayQueue(url, f"bench-{partitions}-{run}", partitions=partitions)
    t0 = time.perf_counter()
    for start in range(0, n, 1000):
        q.push_many([({"order_id": i, "action": "close"}, 0) for i in range(start, min(start + 1000, n))])
    push_rate = n / (time.perf_counter() - t0)
    pushed = q.stats()
    q.purge()
    out = subprocess.run([str(DRAIN), url, str(n), str(partitions)], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    result = json.loads(out.stdout)
    ok = pushed["ready"] == n and result["handled"] == n and result["acked"] == n and result["left"] == 0
    verdict = "ok" if ok else f"VOID: pushed {pushed['ready']}, handled {result['handled']}, left {result['left']}"
    return push_rate, float(result["rate"]), verdict


def med(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller runs, for a smoke test")
    opts = parser.parse_args()
    os.sched_setaffinity(0, {1})
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "delayq", "--example", "drain"], cwd=ROOT, check=True)
    n = 20_000 if opts.quick else 200_000
    single = Node()
    cluster = start_cluster()
    setups = [
        ("single Redis, 1 partition", f"redis://127.0.0.1:{single.port}", 1),
        ("3-master cluster, 1 partition", "redis+cluster://" + ",".join(f"127.0.0.1:{c.port}" for c in cluster), 1),
        ("3-master cluster, 3 partitions", "redis+cluster://" + ",".join(f"127.0.0.1:{c.port}" for c in cluster), 3),
    ]
    rows = []
    try:
        for label, url, partitions in setups:
            pushes, drains, verdicts = [], [], []
            for run in range(3):
                p, d, v = one_run(url, partitions, n, run)
                pushes.append(p)
                drains.append(d)
                verdicts.append(v)
            verdict = next((v for v in verdicts if v != "ok"), "ok")
            rows.append(f"| {label} | {med(pushes)} | {med(drains)} | {verdict} |")
            print(rows[-1], flush=True)
    finally:
        single.stop()
        for c in cluster:
            c.stop()
    today = datetime.date.today().isoformat()
    text = f"""# delayq on Redis Cluster, {today}

`python3 bench/cluster.py{' --quick' if opts.quick else ''}` (`make bench-cluster`): {n:,} messages
`{{"order_id": i, "action": "close"}}`: bulk push from Python with `push_many` in
batches of 1 000; drain of as many already-due messages by the core's own pool
(`core/examples/drain.rs`: 4 fetch threads, batch 1 000, 4 no-op Rust handlers), so
that the cluster's and the partitions' cost is not hidden behind a handler language.
Every redis-server pinned to CPU 0, the client to CPU 1; 3 runs each, median (range),
messages per second. Verified: every message pushed, handled, acked, none left.

| setup | bulk push msg/s | drain msg/s | verified |
|---|---|---|---|
{chr(10).join(rows)}

## How to read these numbers

On this 2-core machine the three masters share one core, so a cluster cannot be
faster than one Redis here: the table shows what the cluster client and partitions
cost (slot routing, one script call per partition and batch instead of one pipeline,
fetchers rotating over partitions, acks split by partition). On real hosts each master has its own cores, and
3 partitions put three masters' CPUs behind one queue.
"""
    write_results(f"-cluster{'-quick' if opts.quick else ''}", text)


if __name__ == "__main__":
    main()
