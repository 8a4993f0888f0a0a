"""A rolling deploy: PHP pools built from DEPLOY_FROM (tests/deploy_from.py) and pools of
this tree, PHP and Python, drain one queue together, fed by producers of both builds.
One old pool stops gracefully mid-run and the other is killed; the new pools take over
what they held. Each build runs messages the other pushed; nothing is lost, nothing
runs twice at the same time, and a message runs again only after a failure or a kill.
See docs/workers.md, "Restarting after a deploy"; DELAYQ_DEPLOY_FROM=<commit> tries a
deploy from another build."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import delayq
from deploy_from import DEPLOY_FROM, extension_at, php_with
from harness import drained, wait_for
from phpcli import php_cmd

HERE = Path(__file__).resolve().parent
LEASE = 2.0
N = 200
SLOW = 1.25 * LEASE  # a slow message's first attempt: it lives on heartbeats
POOLS = ("old-stopped", "old-killed", "new-php", "new-python")


def payload(n: int) -> dict[str, Any]:
    # Every fifth fails its first attempt. Two in every ten are slow, side by side in
    # one due time (so in one claim, often), so that the kill finds runs in progress and
    # the pools must renew the leases of several messages of a claim.
    return {"n": n, "fail": n % 5 == 0, "sleep": SLOW if n % 10 in (3, 4) else 0.01}


def due(n: int) -> float:
    return 3.0 * (n - n % 20) / N


def pushed_by_old(n: int) -> bool:
    return n % 2 == 0


def start_pool(cmd: list[str], env: dict[str, str] | None, log: Path, options: dict[str, Any]) -> subprocess.Popen[bytes]:
    # Its own session: a kill reaches a PHP pool's forked children too.
    return subprocess.Popen([*cmd, str(log), json.dumps(options)], env=env, start_new_session=True)


def php_pool(cmd: list[str], env: dict[str, str] | None, url: str, log: Path) -> subprocess.Popen[bytes]:
    return start_pool([*cmd, str(HERE / "pools" / "span_pool.php"), url, "deploy"], env, log,
                      {"lease": LEASE, "processes": 2, "prefetch": 2, "backoff_base": 0.1})


Run = tuple[str, int, int, float, "float | None"]  # pool, attempt, pid, start, end


def runs(logs: dict[str, Path]) -> dict[int, list[Run]]:
    """Per message, its handler runs in order of their start."""
    found: dict[int, list[Run]] = defaultdict(list)
    for pool, log in logs.items():
        starts: dict[tuple[int, int, int], float] = {}
        ends: dict[tuple[int, int, int], float] = {}
        for line in log.read_text().splitlines(keepends=True):
            fields = line.split()
            if not line.endswith("\n") or len(fields) != 5:
                continue  # being written, or cut off by a kill
            key = (int(fields[0]), int(fields[1]), int(fields[2]))
            (starts if fields[3] == "start" else ends)[key] = float(fields[4])
        for (n, attempt, pid), start in starts.items():
            found[n].append((pool, attempt, pid, start, ends.get((n, attempt, pid))))
    return {n: sorted(r, key=lambda run: run[3]) for n, r in found.items()}


def ran_in(logs: dict[str, Path], pools: tuple[str, ...], old_pushed: bool) -> bool:
    """Whether any of `pools` ran a message that the old build (else the new) pushed."""
    return any(run[0] in pools and pushed_by_old(n) == old_pushed
               for n, message_runs in runs(logs).items() for run in message_runs)


def test_old_and_new_pools_drain_one_queue_through_a_rolling_deploy(redis_url: str, tmp_path: Path) -> None:
    old_cmd, old_env = php_with(extension_at(DEPLOY_FROM), tmp_path / "ini")
    queue = delayq.DelayQueue(redis_url, "deploy")
    logs = {name: tmp_path / f"{name}.log" for name in POOLS}
    for log in logs.values():
        log.touch()
    old = ("old-stopped", "old-killed")
    new = ("new-php", "new-python")

    pools = {name: php_pool(old_cmd, old_env, redis_url, logs[name]) for name in old}
    try:
        wait_for(30, "the old pools listed", lambda: len(queue.workers()) == 4)
        # Even numbers pushed by the old build, odd ones by this one, side by side in
        # due time over the next 3 s.
        items = [{"payload": payload(n), "delay": due(n)} for n in range(N) if pushed_by_old(n)]
        subprocess.run([*old_cmd, "-r", "(new DelayQueue($argv[1], 'deploy'))->pushMany(json_decode($argv[2], true));",
                        redis_url, json.dumps(items)], env=old_env, check=True, timeout=60)
        queue.push_many([{"payload": payload(n), "delay": due(n)} for n in range(N) if not pushed_by_old(n)])
        assert queue.stats()["pushed"] == N

        wait_for(30, "the old pools running messages of both builds",
                 lambda: ran_in(logs, old, True) and ran_in(logs, old, False))
        # The deploy: new pools start while the old ones run.
        pools["new-php"] = php_pool(php_cmd(), None, redis_url, logs["new-php"])
        pools["new-python"] = start_pool(
            [sys.executable, str(HERE / "pools" / "span_pool.py"), redis_url, "deploy"], None,
            logs["new-python"], {"lease": LEASE, "threads": 2, "prefetch": 2, "backoff_base": 0.1})
        wait_for(30, "the new pools listed", lambda: len(queue.workers()) == 4 + 2 + 1)
        wait_for(30, "the new pools running messages of the old build", lambda: ran_in(logs, new, True))

        # One old pool stops as a deploy stops it (its supervisor passes the signal on),
        # the other dies with what it holds.
        os.kill(pools["old-stopped"].pid, signal.SIGTERM)
        killed_at = time.time()
        os.killpg(pools["old-killed"].pid, signal.SIGKILL)
        pools["old-killed"].wait(30)
        assert pools["old-stopped"].wait(30) == 0

        wait_for(90, "every message acknowledged", lambda: drained(queue) and queue.stats()["acked"] == N)
    finally:
        for p in pools.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(30)

    by_message = runs(logs)
    assert sorted(by_message) == list(range(N)), f"lost: {sorted(set(range(N)) - set(by_message))}"
    killed_runs = again_after_kill = 0
    counted_before_the_last = 0
    for n, message_runs in by_message.items():
        # No two runs of one message at the same time: each starts after the one before
        # it ended, or after its pool was killed.
        for before, after in zip(message_runs, message_runs[1:]):
            assert after[3] >= (before[4] if before[4] is not None else killed_at), \
                f"message {n} ran twice at once: {message_runs}"
        # A run after another follows a failure (the first attempt of a failing message)
        # or a run of the killed pool: cut off, or ended with its outcome not yet
        # written when the pool died.
        for before, after in zip(message_runs, message_runs[1:]):
            if before[4] is None:
                assert before[0] == "old-killed", f"message {n}: a run of a live pool never ended: {message_runs}"
                killed_runs += 1
                again_after_kill += after[0] in new
            else:
                assert (payload(n)["fail"] and before[1] == 1) or before[0] == "old-killed", \
                    f"message {n} ran again after it succeeded: {message_runs}"
        last = message_runs[-1]
        assert last[4] is not None, f"message {n}: its last run did not end: {message_runs}"
        # Every earlier run of a live pool counted as an attempt. A run of the killed
        # pool counts only where its claim's expiry was charged: by an old pool's
        # reaper, or a new one's for a message claimed alone (a new reaper charges none
        # of an expired claim of several, see claim.lua); so may, at most once, a
        # delivery that the killed pool held without starting it. A graceful stop's
        # release does not count.
        earlier = message_runs[:-1]
        killed = sum(1 for run in earlier if run[0] == "old-killed")
        live = len(earlier) - killed
        assert live <= last[1] - 1 <= live + killed + 1, \
            f"message {n}: attempts not counted per delivery: {message_runs}"
        counted_before_the_last += last[1] - 1

    stats = queue.stats()
    assert (stats["acked"], stats["dead"], stats["died"]) == (N, 0, 0), stats
    # Every attempt before a message's last ended as a retry or an expired lease (not
    # every expired lease counts: see above).
    assert stats["retried"] + stats["expired"] >= counted_before_the_last, stats
    assert stats["retried"] <= sum(1 for n in range(N) if payload(n)["fail"]), stats
    assert stats["expired"] >= killed_runs, stats
    # Each build ran what the other pushed; every pool ran messages.
    assert ran_in(logs, old, False) and ran_in(logs, new, True)
    assert {run[0] for rs in by_message.values() for run in rs} == set(POOLS)
    assert killed_runs > 0 and again_after_kill > 0, \
        "the kill ended no run that a new pool took over: the test proves nothing"
