"""Redis Sentinel from PHP and Python: a `redis+sentinel://` URL names the sentinels
and the master's name; PHP pushes and Python consumes, Sentinel moves the master to the
replica, and Python pushes to the new master while a PHP worker consumes there. The
old master stays up and stays a master for seconds after the failover (Sentinel
demotes it later): nothing may be written to it any more."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections import Counter
from typing import Any, Iterator

import pytest

import delayq
from harness import RedisServer, free_port, wait_for
from phpcli import php, php_cmd
from test_cluster import ROOT, php_worker_until, python_consume_300


class SentinelSet:
    """A master, its replica and one sentinel (quorum 1) on loopback ports."""

    def __init__(self) -> None:
        self.master = RedisServer()
        self.replica = RedisServer("--replicaof", "127.0.0.1", str(self.master.port))
        wait_for(20, "the replica in sync",
                 lambda: "master_link_status:up" in self.replica.cli("INFO", "replication"))
        self.dir = tempfile.mkdtemp(prefix="delayq-sentinel-")
        self.port = free_port()
        conf = os.path.join(self.dir, "sentinel.conf")
        with open(conf, "w") as f:
            f.write(
                f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor mymaster 127.0.0.1 {self.master.port} 1\n"
                "sentinel down-after-milliseconds mymaster 2000\nsentinel failover-timeout mymaster 5000\n"
            )
        self.proc = subprocess.Popen(["redis-server", conf, "--sentinel"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(30, "the sentinel knows the replica",
                 lambda: f"{self.replica.port}" in self.sentinel("SENTINEL", "REPLICAS", "mymaster"))

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.port}/mymaster"

    def sentinel(self, *args: str) -> str:
        out = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, check=False)
        return out.stdout.strip()

    def named_master(self) -> int:
        reply = self.sentinel("SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster").split()
        return int(reply[1]) if len(reply) == 2 else -1

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.master.stop()
        self.replica.stop()


@pytest.fixture()
def sentinels() -> Iterator[SentinelSet]:
    s = SentinelSet()
    yield s
    s.stop()


def test_php_and_python_follow_a_sentinel_failover(sentinels: SentinelSet, tmp_path: Any) -> None:
    url = sentinels.url
    code = (
        '$q = new DelayQueue($argv[1], "orders");'
        '$items = []; foreach (range(0, 299) as $i) { $items[] = ["payload" => ["n" => $i], "delay" => ($i % 30) / 100]; }'
        '$q->pushMany($items); echo $q->stats()["pushed"];'
    )
    assert str(php(code, url)) == "300"
    queue = delayq.DelayQueue(url, "orders")
    got, _ = python_consume_300(queue)
    assert got == Counter(range(300)), "each message exactly once"

    old, new = sentinels.master, sentinels.replica
    sentinels.sentinel("SENTINEL", "FAILOVER", "mymaster")
    wait_for(10, "the sentinel names the replica", lambda: sentinels.named_master() == new.port)
    # A connection asks its sentinel whether its master still is one at most once a second.
    time.sleep(1.1)
    queue.push_many([({"n": i}, 0) for i in range(300, 400)])
    rows = php_worker_until(url, "orders", str(tmp_path / "log"), {}, 100)
    assert sorted(r[0] for r in rows) == list(range(300, 400))
    assert old.cli("ROLE").splitlines()[0] == "master", "demoted already: this run proves nothing"
    assert old.cli("HLEN", "{dq:orders}:messages") == "0" and old.cli("HGET", "{dq:orders}:stats", "acked") == "300", \
        "written to the replaced master after the failover"
    stats = queue.stats()
    assert stats["acked"] == 400 and stats["ready"] + stats["scheduled"] + stats["inflight"] == 0


def test_a_php_process_pool_rides_out_a_failover(sentinels: SentinelSet, tmp_path: Any) -> None:
    """Forked PHP children each follow the sentinel's announcement: with `idle_check`
    at 60 s, only a wake-up subscription that moved to the new master lets them see the
    messages pushed after the failover before Sentinel demotes the old master."""
    url, log = sentinels.url, str(tmp_path / "log")
    script = os.path.join(ROOT, "php-ext", "tests", "worker_script.php")
    options = json.dumps({"processes": 2, "idle_check": 60, "lease": 2, "_sleep_ms": 1})
    worker = subprocess.Popen([*php_cmd(), script, url, "failover", log, options])

    def handled() -> list[int]:
        try:
            with open(log) as f:
                return [int(line.split()[0]) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    queue = delayq.DelayQueue(url, "failover")
    try:
        queue.push_many([{"payload": {"n": i}, "id": f"n{i}"} for i in range(200)])
        wait_for(20, "PHP handled the first 200", lambda: len(set(handled())) >= 200)
        sentinels.sentinel("SENTINEL", "FAILOVER", "mymaster")
        wait_for(10, "the sentinel names the replica", lambda: sentinels.named_master() == sentinels.replica.port)
        time.sleep(1.1)
        queue.push_many([{"payload": {"n": i}, "id": f"n{i}"} for i in range(200, 400)])
        wait_for(20, "PHP handled all 400", lambda: set(handled()) == set(range(400)))
        assert sentinels.master.cli("ROLE").splitlines()[0] == "master", \
            "the old master was demoted before the children ran what was pushed after the failover"
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    assert not [i for i in range(200, 400) if sentinels.master.cli("HEXISTS", "{dq:failover}:messages", f"n{i}") == "1"]
    rows = handled()
    print(f"PHP processes pool through a sentinel failover: 400 messages, {len(rows) - 400} ran twice")
    stats = queue.stats()
    assert stats["ready"] + stats["scheduled"] + stats["inflight"] == 0
