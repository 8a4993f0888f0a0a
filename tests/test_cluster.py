"""The same API on Redis Cluster from PHP and Python: a `redis+cluster://` URL with
seed nodes, three masters started here, PHP pushes and Python consumes and back; a
plain queue keeps every key in one hash slot (one node), a queue with three
partitions puts one partition on each master, computed alike in both languages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from typing import Any, Iterator

import pytest

import delayq
from harness import RedisServer, free_port, wait_for
from phpcli import php, php_cmd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def cluster() -> Iterator[list[RedisServer]]:
    # The bus port defaults to port + 10000, past 65535 for a port high in the
    # ephemeral range: give it a free port of its own.
    nodes = [
        RedisServer("--cluster-enabled", "yes", "--cluster-port", str(free_port()), "--cluster-node-timeout", "2000")
        for _ in range(3)
    ]
    try:
        out = subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        wait_for(20, "cluster_state:ok", lambda: all("cluster_state:ok" in n.cli("CLUSTER", "INFO") for n in nodes))
        yield nodes
    finally:
        for n in nodes:
            n.stop()


def cluster_url(cluster: list[RedisServer]) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster[:2])


def php_push_300(url: str, queue: str, php_options: str) -> str:
    """PHP pushes {"n": 0..299}, due over 0-0.3 s; returns its stats()["pushed"]."""
    code = (
        f'$q = new DelayQueue($argv[1], "{queue}", {php_options});'
        '$items = []; foreach (range(0, 299) as $i) { $items[] = ["payload" => ["n" => $i], "delay" => ($i % 30) / 100]; }'
        '$q->pushMany($items); echo $q->stats()["pushed"];'
    )
    return str(php(code, url))


def python_consume_300(queue: delayq.DelayQueue) -> tuple[Counter[int], set[int]]:
    """A Python worker runs until 300 distinct messages were handled: how often each
    ran, and the partitions they came from. A short idle_check is not needed: producers'
    wake-ups reach the pool on a cluster too."""
    got: Counter[int] = Counter()
    partitions: set[int] = set()
    worker = delayq.Worker(queue, idle_check=5)

    def handle(payload: dict[str, Any], msg: delayq.Message) -> None:
        got[payload["n"]] += 1
        partitions.add(msg.partition)
        if len(got) == 300:
            worker.stop()

    worker.run(handle)
    return got, partitions


def php_worker_until(url: str, queue: str, log: str, queue_options: dict[str, Any], count: int) -> list[list[int]]:
    """Run php-ext/tests/worker_script.php on `queue` until it has handled `count`
    messages, stop it with SIGTERM; its log rows: n, attempt, pid, partition (then the queue, not kept)."""
    script = os.path.join(ROOT, "php-ext", "tests", "worker_script.php")
    options = json.dumps({"idle_check": 0.1, "_sleep_ms": 0, "_queue": queue_options})
    proc = subprocess.Popen([*php_cmd(), script, url, queue, log, options])

    def rows() -> list[list[int]]:
        try:
            with open(log) as f:
                return [[int(x) for x in line.split()[:4]] for line in f if line.strip()]
        except FileNotFoundError:
            return []

    try:
        wait_for(30, f"PHP handled {count} messages", lambda: len(rows()) >= count)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    return rows()


def test_php_and_python_share_a_queue_on_a_cluster(cluster: list[RedisServer], tmp_path: Any) -> None:
    url = cluster_url(cluster)
    assert php_push_300(url, "orders", "[]") == "300"
    queue = delayq.DelayQueue(url, "orders")
    got, _ = python_consume_300(queue)
    assert got == Counter(range(300)), "each message exactly once"

    # And back: Python pushes, a PHP worker process consumes.
    queue.push_many([({"n": i}, 0) for i in range(300, 400)])
    rows = php_worker_until(url, "orders", str(tmp_path / "log"), {}, 100)
    assert sorted(r[0] for r in rows) == list(range(300, 400))
    stats = queue.stats()
    assert stats["acked"] == 400 and stats["ready"] + stats["scheduled"] + stats["inflight"] == 0
    holders = [n.port for n in cluster if any(k.startswith("{dq:orders}") for k in n.keys())]
    assert len(holders) == 1, f"the queue's keys are on {holders}: not one hash slot"


def test_a_partitioned_queue_spans_the_masters_from_php_and_python(cluster: list[RedisServer], tmp_path: Any) -> None:
    url = cluster_url(cluster)
    assert php_push_300(url, "spread", '["partitions" => 3]') == "300"
    # Three partitions on three masters: each node holds the keys of one hash tag.
    tags = [{k.split("}")[0] for k in n.keys() if k.startswith("{dq:spread")} for n in cluster]
    assert all(len(t) == 1 for t in tags), tags

    queue = delayq.DelayQueue(url, "spread", partitions=3)
    got, partitions = python_consume_300(queue)
    assert got == Counter(range(300)), "each message exactly once"
    assert partitions == {0, 1, 2}

    # And back: Python pushes with partition keys, a PHP worker drains every partition.
    queue.push_many([{"payload": {"n": i}, "partition_key": f"customer-{i % 7}"} for i in range(300, 400)])
    rows = php_worker_until(url, "spread", str(tmp_path / "log"), {"partitions": 3}, 100)
    assert sorted(r[0] for r in rows) == list(range(300, 400))
    by_customer: dict[int, set[int]] = {}
    for n, _, _, part in rows:
        by_customer.setdefault(n % 7, set()).add(part)
    assert all(len(parts) == 1 for parts in by_customer.values()), f"a customer spans partitions: {by_customer}"
    assert len(set().union(*by_customer.values())) > 1, "seven customers all on one partition"
    stats = queue.stats()
    assert stats["acked"] == 400 and stats["ready"] + stats["scheduled"] + stats["inflight"] == 0


def test_the_recipes_waiting_messages_move_from_one_redis_onto_a_partitioned_queue_of_the_cluster(
    cluster: list[RedisServer],
) -> None:
    single = RedisServer()
    try:
        # The recipe's phpredis producer on the one Redis a team starts with; then, in
        # PHP, the seed layout's queue moves what waits onto three partitions.
        code = (
            '$r = new Redis(); $r->connect("127.0.0.1", (int) $argv[1]);'
            'foreach (range(0, 299) as $i) { $id = "msg_$i";'
            ' $r->hSet("delay_queue:payload", $id, json_encode(["n" => $i]));'
            ' $r->zAdd("delay_queue:zset", time() - 1 + ($i % 3) , $id); }'
            '$seed = new DelayQueue("redis://127.0.0.1:" . $argv[1], "orders", ["layout" => "seed"]);'
            '$target = new DelayQueue($argv[2], "moved", ["partitions" => 3]);'
            'echo $seed->moveWaiting($target), " ", $r->zCard("delay_queue:zset") + $r->hLen("delay_queue:payload");'
        )
        assert php(code, str(single.port), cluster_url(cluster)) == "300 0"
    finally:
        single.stop()
    tags = [{k.split("}")[0] for k in n.keys() if k.startswith("{dq:moved")} for n in cluster]
    assert all(len(t) == 1 for t in tags), f"one partition on each master: {tags}"
    queue = delayq.DelayQueue(cluster_url(cluster), "moved", partitions=3)
    assert queue.get("msg_7") is not None
    got, partitions = python_consume_300(queue)
    assert got == Counter(range(300)), "each message exactly once"
    assert partitions == {0, 1, 2}
