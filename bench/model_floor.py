"""Can any reliable consumer of issue 2's data model drain as fast as the recipe's lossy
pop? The drain is bound by Redis, so this prices one message in Redis for four
consumers of the same N due messages:

- seed: the recipe's own pop (tests/fixtures/pop_delay.lua, batches of 50, as
  bench/php/consume.php runs it): read, delete, done; a worker that dies loses its batch.
- floor: the steps of issue 2's data model with the cheapest lease there is
  (bench/floor/claim.lua, ack.lua): claim moves due ids from the schedule into an
  in-flight ZSET under a lease and reads their payloads; ack checks the lease and
  deletes. Nothing else: no attempts, counters, retries, dead letters, reaping or
  wake-ups, and a lease cheaper than a real fence (the "score" fence of
  bench/floor/claim.lua). Only the steps the model cannot do without; not a product.
- fenced: the floor with the exact fence that issue 2 asks for, a lease token per
  delivery kept per message (the "exact" fence of the same scripts): the steps
  that the whole of the issue's model cannot do without.
- claimed: the floor of a lease per claim (issue 29), the "claim" fence of the same
  scripts: one in-flight entry and one record of ids per claim, and each message's
  side of the fence in its stored text (a stamp that the scripts putting a message in
  the schedule write, here written by the fill, `fill.php --stamp`): nothing is
  written per message from the claim to the ack.
- delayq: core/src/lua's claim.lua and ack.lua, as a pool calls them (claims of 1000,
  each followed by one HMGET of its envelopes where the claim leaves them to its
  caller, acks in two halves), or other copies of that directory given as arguments.

Four client processes (pinned to CPU 1) drain a private redis-server (pinned to CPU 0)
filled by bench/php/fill.php, so ids and payloads have the shapes the other benches
use. Every run must hand out and acknowledge each message once and leave no message
behind. Reported: Redis's CPU time per message (`used_cpu_user` + `used_cpu_sys`
over the drain, everything Redis did), and messages/s of these Python clients.
With --callgrind, Redis runs under valgrind's callgrind instead and the figure is
instructions per message: slow (use a small --n), but within 5% from run to run, where
CPU time on a shared 2-core machine moves by 20% or more. It runs the first
redis-server on PATH, so a Redis built from source can be counted too.

With --root=DIR, the redis-server is the one of the system in DIR (a chroot, as
scripts/chroots.sh makes them: trixie's Redis 8.0, for one), to compare Redis versions;
with --callgrind too, that system's valgrind counts it (the chroot must have valgrind).

    python3 bench/model_floor.py [--n=200000] [--rounds=3] [--callgrind] [--root=DIR] [DIR ...]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis as redis_py

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import run  # noqa: E402
from script_cost import BATCH, LEASE_MS, claim_and_ack, composed  # noqa: E402

RECIPE_BATCH = 50  # what the recipe's consumer asks for (bench/php/consume.php)
SEED_KEYS = ["delay_queue:zset", "delay_queue:payload"]
FLOORS = {"floor": "score", "fenced": "exact", "claimed": "claim"}  # system -> fence of bench/floor
DEFAULT_DIR = ROOT / "core" / "src" / "lua"
FLOOR_KEYS = [*SEED_KEYS, "delay_queue:inflight", "delay_queue:claims", "delay_queue:leases"]


class ChrootRedis(run.Redis):
    """run.Redis, running the redis-server of the system in `root` (its own /tmp)."""

    def __init__(self, root: str) -> None:
        super().__init__(launcher=["chroot", root], server_dir="/tmp")


def drain_seed(client: Any) -> int:
    pop = client.register_script((ROOT / "tests" / "fixtures" / "pop_delay.lua").read_text())
    got = 0
    while reply := pop(keys=SEED_KEYS, args=[int(time.time()), RECIPE_BATCH]):
        got += len(reply) // 2
    return got


def drain_floor(client: Any, fence: str) -> int:
    claim = client.register_script((ROOT / "bench" / "floor" / "claim.lua").read_text())
    ack = client.register_script((ROOT / "bench" / "floor" / "ack.lua").read_text())
    ack_keys = [FLOOR_KEYS[2], FLOOR_KEYS[1], FLOOR_KEYS[4]]  # in-flight, payloads, leases
    got = 0
    while reply := claim(keys=FLOOR_KEYS, args=[int(time.time()), BATCH, LEASE_MS, fence]):
        ids = reply[1::2]
        half = len(ids) // 2
        for part in (ids[:half], ids[half:]):
            if part:
                got += ack(keys=ack_keys, args=[fence, reply[0], *part])
    return got


def client_process(port: int, system: str, results: Any) -> None:
    os.sched_setaffinity(0, {1})
    client = redis_py.Redis(port=port)
    if system == "seed":
        results.put(drain_seed(client))
    elif system in FLOORS:
        results.put(drain_floor(client, FLOORS[system]))
    else:
        results.put(claim_and_ack(client, Path(system))[1])


def cpu_seconds(redis: run.Redis) -> float:
    info = dict(line.split(":", 1) for line in redis.cli("INFO", "cpu").splitlines() if ":" in line)
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measure(system: str, n: int, callgrind: bool, root: str | None) -> dict[str, float]:
    if Path(system).is_dir():
        composed(Path(system))  # cargo runs here, not in the timed clients (forked, they inherit it)
    redis = run.CallgrindRedis(root) if callgrind else ChrootRedis(root) if root else run.Redis()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run.fill("delayq" if Path(system).is_dir() else "seed", f"--n={n}", f"--url={redis.url}",
                     f"--due-file={tmp}/due", *(["--stamp"] if system == "claimed" else []))
        redis.cli("DEL", "bench:filled")
        if isinstance(redis, run.CallgrindRedis):
            redis.instructions()  # zeroes the count: the fill is not measured
        cpu, start = cpu_seconds(redis), time.monotonic()
        results: Any = multiprocessing.Queue()
        clients = [multiprocessing.Process(target=client_process, args=(redis.port, system, results))
                   for _ in range(4)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        wall = time.monotonic() - start
        cpu = cpu_seconds(redis) - cpu
        done = sum(results.get() for _ in clients)
        # What a drain leaves: its counters and sequences, delayq's queue clock and its
        # list of queues.
        left = [k for k in redis.cli("KEYS", "*").split()
                if not k.endswith((":seq", ":stats", ":claims", ":control")) and k != "dq:queues"]
        if done != n or left:
            sys.exit(f"{system}: {done} of {n} acknowledged, keys left {left}: the run is void")
        measured = {"cpu_us": cpu / n * 1e6, "rate": n / wall}
        if isinstance(redis, run.CallgrindRedis):
            measured["instructions"] = redis.instructions() / n
        return measured
    finally:
        redis.stop()


def label(system: str) -> str:
    if system == "seed":
        return "seed recipe's pop (lossy)"
    if system == "floor":
        return "floor, lease in the in-flight score"
    if system == "fenced":
        return "floor, exact fence"
    if system == "claimed":
        return "floor, lease per claim"
    return "delayq " + shown(system)


def shown(lua_dir: str) -> str:
    path = Path(lua_dir).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def cell(values: list[float], digits: int) -> str:
    mid = statistics.median(values)
    if len(values) == 1:
        return f"{mid:,.{digits}f}"
    return f"{mid:,.{digits}f} ({min(values):,.{digits}f} .. {max(values):,.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dirs", nargs="*", default=[str(DEFAULT_DIR)],
                        help="copies of core/src/lua to price (default: the committed scripts)")
    parser.add_argument("--n", type=int, default=None, help="messages per run (200000; 20000 with --callgrind)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callgrind", action="store_true", help="count instructions under valgrind")
    parser.add_argument("--root", help="run the redis-server of the system in this chroot")
    opts = parser.parse_args()
    n = opts.n or (20000 if opts.callgrind else 200000)
    version = run.server_version(opts.root)
    systems = ["seed", "floor", "fenced", "claimed", *opts.dirs]
    os.sched_setaffinity(0, {1})
    runs = run.in_turns(systems, lambda s: measure(s, n, opts.callgrind, opts.root), opts.rounds, name=label)
    seed = statistics.median(r["instructions" if opts.callgrind else "cpu_us"] for r in runs["seed"])
    what = "instructions" if opts.callgrind else "cpu_us"
    unit = "Redis instructions per message" if opts.callgrind else "Redis CPU µs per message"
    lines = [
        f"# What a reliable drain must cost Redis, {time.strftime('%Y-%m-%d')}",
        "",
        f"Command: `python3 bench/model_floor.py --n={n} --rounds={opts.rounds}"
        + (" --callgrind" if opts.callgrind else "") + (f" --root={opts.root}" if opts.root else "")
        + ("" if [Path(d).resolve() for d in opts.dirs] == [DEFAULT_DIR] else "".join(f" {shown(d)}" for d in opts.dirs))
        + f"` (a private Redis {version} pinned to CPU 0; 4 Python "
        "client processes pinned to CPU 1; median of the rounds, range in brackets).",
        "",
        f"| consumer | {unit} | vs the recipe | messages/s |",
        "|---|---|---|---|",
    ]
    for system, measured in runs.items():
        cost = statistics.median(r[what] for r in measured)
        lines.append(f"| {label(system)} | {cell([r[what] for r in measured], 0 if opts.callgrind else 2)} "
                     f"| {cost / seed:.2f}x | {cell([r['rate'] for r in measured], 0)} |")
    lines += [
        "",
        "The floors do only the steps that a consumer keeping each message under a lease in",
        "an in-flight set until its ack cannot do without; the exact fence is the one issue 2",
        "asks for (see the docstring of bench/model_floor.py and bench/floor/). A Redis-bound",
        "drain runs at about the inverse of this cost, so a consumer can match the recipe's",
        "rate only if its cost per message does.",
    ]
    suffix = f"-callgrind-redis-{version}" if opts.callgrind else f"-redis-{version}" if opts.root else ""
    run.write_results("-model-floor" + suffix, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
