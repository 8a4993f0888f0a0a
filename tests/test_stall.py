"""A Redis that stands still longer than a lease (DEBUG SLEEP, CLIENT PAUSE), with PHP
and with Python pools as real processes: no message runs twice at the same time, and
the messages of a pool killed with SIGKILL right after the stall still come back. See
docs/RELIABILITY.md, row 19."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

import delayq
from harness import RedisServer, drained, wait_for
from phpcli import php_cmd

HERE = os.path.dirname(os.path.abspath(__file__))
LEASE = 2.0
STALL = 5.0
BUSY = 8  # messages, 4 per busy pool
HANDLER = 9.0  # seconds, on a message's first attempt


@pytest.fixture(scope="module")
def debug_server() -> Iterator[RedisServer]:
    # DEBUG is refused unless enabled (Redis 7.0+ has the switch; 6.x allows it).
    probe = RedisServer()
    version = probe.cli("INFO", "server")
    probe.stop()
    major = int(version.split("redis_version:")[1].split(".")[0])
    server = RedisServer("--enable-debug-command", "yes") if major >= 7 else RedisServer()
    yield server
    server.stop()


def pool(lang: str, url: str, log: str) -> subprocess.Popen[bytes]:
    if lang == "python":
        options: dict[str, Any] = {"lease": LEASE, "threads": 4, "prefetch": 4}
        cmd = [sys.executable, os.path.join(HERE, "pools", "span_pool.py")]
    else:
        options = {"lease": LEASE, "processes": 4, "prefetch": 1}
        cmd = [*php_cmd(), os.path.join(HERE, "pools", "span_pool.php")]
    # Its own session: kill -9 reaches a PHP pool's forked children too.
    return subprocess.Popen([*cmd, url, "stall", log, json.dumps(options)], start_new_session=True)


def runs(log: str) -> dict[int, list[tuple[int, float, float | None]]]:
    """Per message: each run's pid, start and end (None: did not end)."""
    started: dict[tuple[int, int], tuple[int, float]] = {}
    result: dict[int, list[tuple[int, float, float | None]]] = defaultdict(list)
    ended: dict[tuple[int, int], float] = {}
    with open(log) as f:
        for line in f:
            n, attempt, pid, what, at = line.split()
            key = (int(n), int(attempt))
            if what == "start":
                started[key] = (int(pid), float(at))
            else:
                ended[key] = float(at)
    for (n, attempt), (pid, start) in sorted(started.items()):
        result[n].append((pid, start, ended.get((n, attempt))))
    return result


def stall(server: RedisServer, how: str) -> None:
    if how == "client-pause":
        assert server.cli("CLIENT", "PAUSE", str(int(STALL * 1000)), "ALL") == "OK"
        time.sleep(STALL)
    else:
        # Blocks its own client for the whole sleep.
        assert server.cli("DEBUG", "SLEEP", str(STALL)) == "OK"


@pytest.mark.parametrize("how", ["client-pause", "debug-sleep"])
@pytest.mark.parametrize("lang", ["php", "python"])
def test_a_stall_longer_than_the_lease_runs_nothing_twice_at_once(
    lang: str, how: str, debug_server: RedisServer, tmp_path: Any
) -> None:
    debug_server.cli("FLUSHALL")
    url = debug_server.url
    queue = delayq.DelayQueue(url, "stall")
    log = str(tmp_path / "log")
    open(log, "w").close()
    busy = [pool(lang, url, log), pool(lang, url, log)]
    idle: subprocess.Popen[bytes] | None = None
    try:
        # Both listed before the push, so that each takes half.
        wait_for(30, "the busy pools listed", lambda: len(queue.workers()) == (2 if lang == "python" else 8))
        queue.push_many([{"payload": {"n": n, "sleep": HANDLER}} for n in range(BUSY)])
        wait_for(30, "every message running", lambda: len(runs(log)) == BUSY)
        pids_before = {w["id"] for w in queue.workers()}
        idle = pool(lang, url, log)
        wait_for(30, "the idle pool listed", lambda: len({w["id"] for w in queue.workers()} - pids_before) > 0)
        stall(debug_server, how)
        # The stall is over; one busy pool dies at once, before it can renew its leases.
        killed_pid = busy[0].pid
        killed_at = time.time()
        os.killpg(killed_pid, signal.SIGKILL)
        busy[0].wait()
        wait_for(60, "every message acknowledged", lambda: drained(queue) and queue.stats()["acked"] == BUSY)
    finally:
        for p in [*busy, *([idle] if idle else [])]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(30)

    by_message = runs(log)
    assert sorted(by_message) == list(range(BUSY))
    killed_pids = {pid for r in by_message.values() for pid, _, end in r if end is None}
    again = 0
    for n, message_runs in by_message.items():
        # No two runs of one message at the same time: each starts after the one before
        # it ended, or after its process was killed.
        for (_, _, end), (_, start, _) in zip(message_runs, message_runs[1:]):
            assert start >= (end if end is not None else killed_at), f"message {n} ran twice at once: {message_runs}"
        if len(message_runs) > 1:
            again += 1
            assert message_runs[0][2] is None, f"message {n} ran twice though its run ended: {message_runs}"
    # Exactly the killed pool's messages ran again: live holders kept their leases.
    assert again == len([n for n, r in by_message.items() if r[0][2] is None]) > 0, by_message
    assert killed_pids, "the kill ended no run: the test proves nothing"
    stats = queue.stats()
    assert stats["expired"] == again, stats
