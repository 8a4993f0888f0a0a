"""Faults across the bindings, each against a real redis-server and real processes:
kill -9 of a worker while it drains 20 000 messages (PHP processes mode, a PHP
single-process worker, a Python worker), and an ACL user limited to one queue's keys
that PHP and Python both use end to end. See docs/RELIABILITY.md."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

import delayq
from harness import RedisServer, drained, wait_for
from phpcli import php, php_cmd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N = 20_000


def worker_cmd(kind: str, url: str, log: str) -> list[str]:
    if kind == "python":
        return [sys.executable, os.path.join(ROOT, "py-ext", "tests", "worker_process.py"), url, "jobs", log]
    options: dict[str, Any] = {"lease": 2, "_sleep_ms": 0}
    if kind == "php-processes":
        options["processes"] = 2
    script = os.path.join(ROOT, "php-ext", "tests", "worker_script.php")
    return [*php_cmd(), script, url, "jobs", log, json.dumps(options)]


def handled(log: str) -> Counter[int]:
    try:
        with open(log) as f:
            return Counter(int(line.split()[0]) for line in f if line.strip())
    except FileNotFoundError:
        return Counter()


@pytest.mark.parametrize("kind", ["php-processes", "php-single", "python"])
def test_kill_9_while_draining_loses_nothing(kind: str, queue: delayq.DelayQueue, redis_url: str, tmp_path: Any) -> None:
    log = str(tmp_path / "log")
    for start in range(0, N, 5000):
        queue.push_many([{"payload": {"n": i}} for i in range(start, start + 5000)])
    # Its own session, so that kill -9 reaches a PHP pool's forked children too: the
    # whole pool dies at once, as in a host crash or an OOM kill.
    victim = subprocess.Popen(worker_cmd(kind, redis_url, log), start_new_session=True)
    wait_for(60, "a quarter handled", lambda: sum(handled(log).values()) >= N // 4)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    in_flight_at_kill = queue.stats()["inflight"]
    assert in_flight_at_kill > 0, "the kill left no delivery in flight: the test proves nothing"
    assert sum(handled(log).values()) < N, "the victim finished before the kill"

    survivor = subprocess.Popen(worker_cmd(kind, redis_url, log), start_new_session=True)
    try:
        wait_for(120, "the rest handled", lambda: drained(queue))
    finally:
        survivor.send_signal(signal.SIGTERM)
        survivor.wait(30)
    counts = handled(log)
    lost = sorted(set(range(N)) - set(counts))
    assert lost == [], f"{len(lost)} lost, e.g. {lost[:10]}"
    duplicates = sum(counts.values()) - len(counts)
    assert duplicates <= in_flight_at_kill, f"{duplicates} duplicates for {in_flight_at_kill} in flight at the kill"
    stats = queue.stats()
    assert stats["expired"] >= in_flight_at_kill and stats["acked"] == N
    print(f"{kind}: {in_flight_at_kill} in flight at the kill, {duplicates} duplicates, 0 lost")


def test_an_acl_user_limited_to_one_queue_works_from_php_and_python(
    server: RedisServer, redis_url: str, tmp_path: Any
) -> None:
    # The queue's own rule, as `delayq acl --user jobs-app` prints it.
    rule = delayq.DelayQueue(redis_url, "jobs").acl_rule("jobs-app").replace(">PASSWORD", ">s3cret")
    assert server.cli(*rule.split()) == "OK"
    url = f"redis://jobs-app:s3cret@127.0.0.1:{server.port}"
    code = (
        '$q = new DelayQueue($argv[1], "jobs");'
        'foreach (range(0, 49) as $i) { $q->push(["n" => $i]); }'
        'echo json_encode($q->stats()["pushed"]);'
    )
    assert php(code, url) == "50"
    queue = delayq.DelayQueue(url, "jobs")
    queue.push({"n": 50}, delay=0.05)
    log = str(tmp_path / "log")
    proc = subprocess.Popen(worker_cmd("python", url, log))
    try:
        wait_for(30, "all handled", lambda: drained(queue))
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert handled(log) == Counter(range(51))
    # Another queue's keys stay out of reach, from both languages.
    with pytest.raises(delayq.AuthError, match='user "jobs-app" may not use this queue\'s keys'):
        delayq.DelayQueue(url, "payments").push(1)
    refused = php('try { (new DelayQueue($argv[1], "payments"))->push(1); } '
                  'catch (DelayQueueAuthException $e) { echo "refused"; }', url)
    assert refused == "refused"
    assert not [k for k in server.keys() if "payments" in k]
